"""Seeds as the unit of evidence (zfree_lab.experiment.seed_stats) and the readout gains
(zfree_lab.experiment.gains.readout_gains), against scipy's tests and closed forms."""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from zfree_lab.cli.parser import parse_seeds
from zfree_lab.experiment.gains import readout_gains
from zfree_lab.experiment.seed_stats import seeds_text, t_interval, tost_p, two_stage_bootstrap


def test_t_interval_matches_scipy():
    v = [0.773, 1.036, 0.64, 0.91]
    t = t_interval(v)
    lo, hi = stats.t.interval(0.95, len(v) - 1, loc=np.mean(v), scale=stats.sem(v))
    assert (t["lo"], t["hi"]) == pytest.approx((lo, hi), rel=1e-12)
    want = stats.ttest_1samp(v, 0.0, alternative="greater")
    assert t["p"] == pytest.approx(want.pvalue, rel=1e-10) and t["t"] == pytest.approx(want.statistic, rel=1e-12)
    assert t["n"] == 4 and t["mean"] == pytest.approx(np.mean(v))


def test_the_issue_two_seed_example():
    """The reviewer's numbers: two paired gains with mean 0.905 give t(1) = 6.9, one-sided p = 0.09... over
    1 degree of freedom the one-sided p of t = 6.9 is 0.046; the two-sided 0.092 (what the issue quoted)."""
    t = t_interval([0.773, 1.036])
    assert t["mean"] == pytest.approx(0.9045) and t["t"] == pytest.approx(6.878, abs=1e-3)
    assert 2 * t["p"] == pytest.approx(0.0919, abs=1e-3)
    assert t["lo"] < 0 < t["hi"]  # two seeds: the 95 % interval holds 0


def test_one_seed_has_no_interval_and_says_so():
    t = t_interval([0.8])
    assert t["n"] == 1 and np.isnan(t["lo"]) and np.isnan(t["p"])
    assert seeds_text(1) == "1 seed" and seeds_text(3) == "3 seeds"
    assert np.isnan(tost_p([0.1]))


def test_tost_against_two_one_sided_scipy_tests():
    v = np.array([0.05, -0.02, 0.11, 0.03, 0.0])
    a = stats.ttest_1samp(v, -0.25, alternative="greater").pvalue
    b = stats.ttest_1samp(v, 0.25, alternative="less").pvalue
    assert tost_p(v) == pytest.approx(max(a, b), rel=1e-10)
    assert tost_p(v) < 0.05  # equivalent within 0.25
    assert tost_p(v + 0.3) > 0.5  # shifted out of the margin


def test_two_stage_bootstrap_covers_and_widens_with_seed_spread():
    rng = np.random.default_rng(0)
    tight = [rng.normal(1.0, 0.5, 200) for _ in range(4)]
    spread = [rng.normal(m, 0.5, 200) for m in (0.2, 0.8, 1.2, 1.8)]
    lo_t, hi_t = two_stage_bootstrap(tight)
    lo_s, hi_s = two_stage_bootstrap(spread)
    assert lo_t < np.mean([a.mean() for a in tight]) < hi_t
    assert lo_s < np.mean([a.mean() for a in spread]) < hi_s
    assert hi_s - lo_s > 3 * (hi_t - lo_t)
    assert np.isnan(two_stage_bootstrap(tight[:1])[0])


def _frames(n=40, seed=0):
    rng = np.random.default_rng(seed)
    D = rng.gamma(3.0, 2.0, n)
    kl = rng.uniform(0.1, 1.0, n)
    run = pd.DataFrame({"D": D, "kl": kl, "d_shuffled": D + rng.uniform(0.0, 2.0, n), "d_prior": D + 0.5,
                        "marginal_nll": D + 0.5 * kl})  # a marginal between D_q and D_q + KL
    control = pd.DataFrame({"D": D + rng.normal(0.6, 0.2, n)})
    return run, control


def test_readout_gains_are_the_defined_differences():
    run, control = _frames()
    g = readout_gains(run, control)
    assert g["net_gain"] == pytest.approx((control["D"] - run["marginal_nll"]).mean())
    assert g["gain_minus_rate"] == pytest.approx((control["D"] - run["D"] - run["kl"]).mean())
    assert g["use_shuffled"] == pytest.approx((run["d_shuffled"] - run["D"]).mean())
    assert g["use_prior"] == pytest.approx(0.5)
    assert g["gain_minus_rate"] <= g["net_gain"]  # the marginal is below the negative ELBO
    assert g["exchange_rate"] == pytest.approx((control["D"] - run["D"]).mean() / run["kl"].mean())
    assert g["net_gain_lo"] < g["net_gain"] < g["net_gain_hi"]


def test_readout_gains_of_a_run_without_readouts_are_nan():
    run, control = _frames()
    run[["d_shuffled", "d_prior", "marginal_nll"]] = np.nan
    g = readout_gains(run, control)
    assert np.isnan(g["net_gain"]) and np.isnan(g["use_shuffled_lo"])
    assert np.isfinite(g["gain_minus_rate"])


@pytest.mark.parametrize("text, want", [("0-2", (0, 1, 2)), ("0,3,5", (0, 3, 5)), ("1", (1,)), ("0-1,7", (0, 1, 7))])
def test_parse_seeds(text, want):
    assert parse_seeds(text) == want


@pytest.mark.parametrize("text", ["", "a", "2-x", "0,0", "-1", "1--2"])
def test_parse_seeds_refuses_in_one_line(text):
    with pytest.raises(argparse.ArgumentTypeError, match="seeds"):
        parse_seeds(text)


@pytest.mark.parametrize("text, says", [("0-", "a range needs both ends, as in 0-2"),
                                        ("0-2,5-", "a range needs both ends"),
                                        ("2-0", "the range 2-0 runs backwards; give 0-2")])
def test_a_range_without_its_end_or_backwards_is_refused_not_read_as_one_seed(text, says):
    """A new user's `--seeds 0-` (meant 0-2) ran a whole study on seed 0 alone, without a word."""
    with pytest.raises(argparse.ArgumentTypeError, match=says):
        parse_seeds(text)


def test_an_argument_error_is_one_line_naming_the_command_and_its_help(capsys):
    """argparse printed its usage block above the error; every other error of zfree is one line."""
    from zfree_lab.cli import main

    with pytest.raises(SystemExit) as e:
        main(["study", "--seeds", "0-", "--out", "never"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("zfree study: error: argument --seeds: '0-': a range needs both ends")
    assert "`zfree study --help`" in err
