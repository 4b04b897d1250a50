"""zfree.objective.theory against independent computations: analytic c_base by brute-force counting, the
information-preference threshold beta_eff = 1, and the predicted rate and curves."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from numpy.testing import assert_allclose

from zfree.data.pairs import Pair
from zfree.data.synth import STRATEGIES, DataConfig, generate_split, text_to_digits
from zfree.objective.losses import effective_beta, reconstruction_weight
from zfree.objective.theory import analytic_c_base, critical_beta, predict_curve, predicted_rate, predicted_use


def pairs_of(rows) -> list[Pair]:
    return [Pair(r["id"], r["x"], r["y"], r["strategy"], r["bayes_nll"], r["n_consistent"]) for r in rows]


def test_analytic_c_base_equals_brute_force_mean_of_log_k_over_m_per_token():
    cfg = DataConfig(vocab_size=3, n_min=1, n_max=5, strategies=("sort_asc", "sort_desc", "reverse", "copy"),
                     n_train=1, n_val=400, n_test=1)
    rows = generate_split(cfg, "val", cfg.n_val)
    K = len(cfg.strategies)
    vals = []
    for r in rows:
        x, y = text_to_digits(r["x"]), text_to_digits(r["y"])
        m = sum(STRATEGIES[s](x) == y for s in cfg.strategies)  # counted here, not read from the row
        vals.append(math.log(K / m) / (len(y) + 1))
    assert math.isclose(analytic_c_base(pairs_of(rows)), float(np.mean(vals)), rel_tol=1e-12)


def test_analytic_c_base_errors():
    with pytest.raises(ValueError, match="at least one row"):
        analytic_c_base([])
    with pytest.raises(ValueError, match="no bayes_nll"):
        analytic_c_base([Pair("r1", "1 2", "2 1")])


def test_predicted_use_flips_at_beta_eff_one():
    beta_eff = np.array([0.0, 0.5, 1 - 1e-9, 1.0, 1 + 1e-9, 3.0])
    assert predicted_use(beta_eff).tolist() == [True, True, True, False, False, False]
    bn = np.full(6, math.log(2))
    assert predicted_use(beta_eff, bn).tolist() == [True, True, True, False, False, False]
    # nothing to explain where every strategy agrees
    assert predicted_use(np.array([0.1, 0.1]), np.array([0.0, math.log(4)])).tolist() == [False, True]


def test_predicted_use_with_base_excess_moves_the_threshold():
    """Threshold 1 + excess_seq / bayes_nll: with log 2 of bayes loss and 0.5 log 2 of excess, 1.5."""
    bn = np.full(4, math.log(2))
    excess = 0.5 * bn
    assert predicted_use(np.array([1.2, 1.49, 1.5, 1.6]), bn, excess).tolist() == [True, True, False, False]


def test_use_threshold_is_the_rule_predicted_use_applies():
    """1 + excess / bayes_nll per row (1 where nothing is to explain or no excess is given): the line the
    effective-β figure draws is the one the predicted use counts."""
    from zfree.objective.theory import use_threshold

    bn = np.array([math.log(2), math.log(4), 0.0])
    excess = np.array([0.5 * math.log(2), 3 * math.log(4), 1.0])
    np.testing.assert_allclose(use_threshold(bn, excess), [1.5, 4.0, 1.0], rtol=1e-12)
    np.testing.assert_array_equal(use_threshold(bn), np.ones(3))
    beta_eff = np.array([1.49, 3.99, 0.1])
    assert predicted_use(beta_eff, bn, excess).tolist() == [True, True, False]
    assert predicted_use(beta_eff + 0.02, bn, excess).tolist() == [False, False, False]


def test_excess_nll_is_the_bases_sequence_nll_above_bayes():
    """|S|·b − bayes_nll per row, nats per sequence: 4 tokens at log 2 each over a Bayes NLL of log 2 leave
    3 log 2; NaN where the Bayes NLL is unknown; rows of another count refused."""
    from zfree.objective.theory import excess_nll

    got = excess_nll([4, 2, 3], [math.log(2), 0.5, 1.0], [math.log(2), 1.0, np.nan])
    np.testing.assert_allclose(got[:2], [3 * math.log(2), 0.0], rtol=1e-12)
    assert np.isnan(got[2])
    with pytest.raises(ValueError):
        excess_nll([[4, 2]], [1.0, 1.0], [1.0, 1.0])


def test_predicted_rate_closed_form():
    # four examples: K = 4 strategies, m = 1, 2, 4, 1 -> bayes_nll log 4, log 2, 0, log 4
    bn = np.array([math.log(4), math.log(2), 0.0, math.log(4)])
    beta_eff = np.array([0.5, 0.5, 0.5, 2.0])  # the last one is priced out
    assert math.isclose(predicted_rate(beta_eff, bn), (math.log(4) + math.log(2)) / 4, rel_tol=1e-12)
    assert predicted_rate(np.full(4, 5.0), bn) == 0.0
    assert math.isclose(predicted_rate(np.zeros(4), bn), bn.mean(), rel_tol=1e-12)
    with pytest.raises(ValueError):
        predicted_rate(np.array([]), np.array([]))


def _examples(seed: int, n: int = 50):
    rng = np.random.default_rng(seed)
    target_len = rng.integers(3, 14, n)
    bayes = np.log(4 / rng.choice([1, 2, 4], n))
    b = bayes / target_len + rng.uniform(0, 0.05, n)  # a slightly imperfect base model, nats per token
    return target_len, bayes, b


@given(seed=st.integers(0, 10_000), c_base=st.floats(0.01, 1.0), eps=st.floats(1e-3, 0.5))
def test_predict_curve_matches_per_example_thresholds(seed, c_base, eps):
    target_len, bayes, b = _examples(seed)
    betas = np.array([0.0, 0.01, 0.05, 0.1, 0.3, 1.0, 5.0])
    for weighting, w in (("plain", np.ones_like(b)), ("distribution", np.full_like(b, 1 / c_base)),
                         ("example", 1 / (b + eps))):
        df = predict_curve(weighting, betas, target_len, bayes, b=b, c_base=c_base, epsilon=eps)
        assert list(df.columns) == ["beta", "predicted_use_fraction", "predicted_rate", "beta_eff_median"]
        assert isinstance(df, pd.DataFrame) and len(df) == len(betas)
        for beta, row in zip(betas, df.itertuples()):
            use = (beta * target_len / w < 1) & (bayes > 0)  # written out, not through predicted_use
            assert row.beta == beta
            assert math.isclose(row.predicted_use_fraction, use.mean(), abs_tol=1e-15)
            assert math.isclose(row.predicted_rate, np.where(use, bayes, 0).mean(), rel_tol=1e-12, abs_tol=1e-15)
            assert math.isclose(row.beta_eff_median, float(np.median(beta * target_len / w)), rel_tol=1e-12, abs_tol=1e-15)
        assert np.all(np.diff(df["predicted_use_fraction"]) <= 0)  # more KL pressure, less use
        assert math.isclose(df["predicted_rate"].iloc[0], bayes.mean(), rel_tol=1e-12)


@given(seed=st.integers(0, 10_000), c_base=st.floats(0.05, 1.0))
def test_distribution_at_beta_predicts_like_plain_at_beta_times_c_base(seed, c_base):
    """docs/concepts/weightings.md: the global rescaling moves the optimum (beta / w), nothing else."""
    target_len, bayes, _ = _examples(seed)
    betas = np.geomspace(1e-3, 10, 9)
    dist = predict_curve("distribution", betas, target_len, bayes, c_base=c_base)
    plain = predict_curve("plain", betas * c_base, target_len, bayes)
    assert_allclose(dist["predicted_use_fraction"], plain["predicted_use_fraction"])
    assert_allclose(dist["predicted_rate"], plain["predicted_rate"])


def test_predict_curve_agrees_with_the_loss_module():
    target_len, bayes, b = _examples(0)
    beta, eps = 0.07, 0.01
    w = reconstruction_weight("example", batch_size=len(b), b=torch.tensor(b), epsilon=eps, dtype=torch.float64)
    be = effective_beta(beta, torch.tensor(target_len), w).numpy()
    row = predict_curve("example", [beta], target_len, bayes, b=b, epsilon=eps).iloc[0]
    assert math.isclose(row.predicted_use_fraction, predicted_use(be, bayes).mean())
    assert math.isclose(row.predicted_rate, predicted_rate(be, bayes), rel_tol=1e-12)


def test_critical_beta_closed_forms_and_the_flip():
    target_len, bayes, b = _examples(1)
    c, eps = 0.3, 0.02
    assert_allclose(critical_beta("plain", target_len), 1 / target_len)
    assert_allclose(critical_beta("distribution", target_len, c_base=c), 1 / (target_len * c))
    assert_allclose(critical_beta("example", target_len, b=b, epsilon=eps), 1 / (target_len * (b + eps)))
    crit = critical_beta("distribution", target_len, bayes, c_base=c)
    assert np.all(crit[bayes == 0] == 0)
    i = int(np.argmax(bayes > 0))
    one = dict(target_len=target_len[i:i + 1], bayes_nll=bayes[i:i + 1], c_base=c)
    below = predict_curve("distribution", [crit[i] * (1 - 1e-9)], **one)
    above = predict_curve("distribution", [crit[i] * (1 + 1e-9)], **one)
    assert below["predicted_use_fraction"].item() == 1.0 and above["predicted_use_fraction"].item() == 0.0


@pytest.mark.parametrize("kwargs,match", [
    ({"weighting": "token"}, "outer weighting"),
    ({"weighting": "bogus"}, "'plain', 'distribution', 'example'"),
    ({"weighting": "distribution"}, "c_base"),
    ({"weighting": "example", "b": [0.1, 0.2]}, "epsilon"),
    ({"weighting": "example", "epsilon": 0.1}, "base surprisal b"),
    ({"betas": [-0.1]}, "betas"),
    ({"betas": [float("nan")]}, "betas"),
    ({"target_len": [3]}, "one length"),
    ({"target_len": [0, 3]}, "target_len"),
    ({"betas": [[0.1]]}, "one-dimensional"),
])
def test_predict_curve_errors(kwargs, match):
    args = {"weighting": "plain", "betas": [0.1], "target_len": [3, 4], "bayes_nll": [math.log(2), 0.0], **kwargs}
    with pytest.raises(ValueError, match=match):
        predict_curve(**args)
