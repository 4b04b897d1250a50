"""zfree.evaluate.latent_stats, imported where it is defined: the matching and probe statistics
against hand-computed tables, active units against an exact variance count, the Gaussian mutual
information against its closed-form limits and a quadrature reference, and the decodes of a tiny
discrete CVAE at step 0 (every latent value decodes as the base model)."""

from __future__ import annotations

import copy
import math

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from zfree.data.batching import encode_pair
from zfree.data.pairs import Pair
from zfree.evaluate.latent_stats import (ACTIVE_UNIT_THRESHOLD, active_units, confusion, decode_metrics,
                                         gaussian_mutual_information, greedy_decode, hungarian_accuracy,
                                         label_confusion, label_keys, label_structure_metrics, label_warnings,
                                         latent_samples, MIN_LABEL_ROWS,
                                         multiref_outputs, first_distinct_x,
                                         matched_share, probe_accuracy,
                                         strategy_outputs, z_control_metrics)

finite = st.floats(-10, 10, allow_nan=False, width=64)


# ---------------------------------------------------------------------------- matching and probes


def test_confusion_is_the_hand_table_on_unambiguous_rows():
    df = pd.DataFrame({"posterior_argmax": [0, 0, 1, 1, 1, 0], "strategy": ["copy", "copy", "reverse", "copy",
                                                                              "reverse", "reverse"],
                       "n_consistent": [1, 1, 1, 1, 2, 1]})
    tab = confusion(df)
    assert tab.index.name == "latent value" and tab.columns.name == "strategy"
    assert tab.to_dict() == {"copy": {0: 2, 1: 1}, "reverse": {0: 1, 1: 1}}  # row 4 (m = 2) left out
    assert confusion(df, unambiguous_only=False).to_dict() == {"copy": {0: 2, 1: 1}, "reverse": {0: 1, 1: 2}}


def test_matched_share_and_hungarian_accuracy_by_hand():
    counts = np.array([[1.0, 9.0], [8.0, 2.0]])  # best matching: 0 -> label 1, 1 -> label 0: 17 of 2 * 10
    assert matched_share(counts, 10) == pytest.approx(17 / 20)
    assert matched_share(np.array([[3.0, 0.0, 0.0]]), 4) == pytest.approx(3 / 4)  # one latent, three labels
    labels = ["a", "a", "b", "b", "c"]
    assert hungarian_accuracy(labels, [2, 2, 0, 0, 1]) == 1.0  # a relabelling
    assert hungarian_accuracy(labels, [0, 0, 0, 0, 0]) == pytest.approx(2 / 5)  # one value: one label matched
    assert hungarian_accuracy(labels, [0, 1, 2, 3, 4]) == pytest.approx(3 / 5)  # K > labels: leftovers are errors
    assert math.isnan(hungarian_accuracy([], []))


@given(st.lists(st.integers(0, 3), min_size=1, max_size=30), st.permutations(range(4)))
def test_hungarian_accuracy_of_a_relabelling_is_one(labels, perm):
    assert hungarian_accuracy(labels, [perm[v] for v in labels]) == 1.0


def test_probe_accuracy_separable_features_and_too_few_rows():
    rng = np.random.default_rng(0)
    labels = np.array(["a", "b"] * 20)
    x = np.where(labels[:, None] == "a", -3.0, 3.0) + 0.1 * rng.standard_normal((40, 2))
    assert probe_accuracy(x, labels) == 1.0
    assert math.isnan(probe_accuracy(x[:3], labels[:3]))  # fewer than 2 training rows
    assert math.isnan(probe_accuracy(x, np.array(["a"] * 20 + ["b"] * 20)))  # one class in the training half


def test_strategy_outputs_and_z_control_metrics_by_hand():
    pairs = [Pair("p", "3 1 2", "2 1 3"), Pair("q", "5 4", "4 5")]
    assert strategy_outputs(pairs, ["copy", "reverse", "sort_asc"]) == [["3 1 2", "2 1 3", "1 2 3"],
                                                                         ["5 4", "4 5", "4 5"]]

    class Tok:  # ids are the digits themselves
        @staticmethod
        def decode(ids):
            return " ".join(map(str, ids))

    table = {"s": [[2, 1, 3], [9, 9]], 0: [[3, 1, 2], [5, 4]], 1: [[2, 1, 3], [4, 5]]}  # latent 0 copies, 1 reverses
    decode = lambda z: table[z]  # noqa: E731
    res = z_control_metrics(decode, "s", [0, 1], [None, None], pairs, Tok(), ["copy", "reverse"])
    assert res == {"task/correctness": 0.5, "structure/z_control_accuracy": 1.0}
    res = z_control_metrics(decode, 0, None, [None, None], pairs, Tok(), ["copy", "reverse"])
    assert res["task/correctness"] == 1.0 and math.isnan(res["structure/z_control_accuracy"])


# ---------------------------------------------------------------------------- Gaussian latent


@given(arrays(np.float64, st.tuples(st.integers(1, 12), st.integers(1, 5)), elements=finite),
       st.floats(0.0, 5.0))
def test_active_units_equals_a_variance_count(mu, threshold):
    """Against the population variance per column in exact-rounded sums (math.fsum); columns within
    rounding of the threshold are left out (summation order may decide them either way)."""
    n = len(mu)
    var = []
    for d in range(mu.shape[1]):
        col = [float(v) for v in mu[:, d]]
        m = math.fsum(col) / n
        var.append(math.fsum((v - m) ** 2 for v in col) / n)
    for t in (threshold, ACTIVE_UNIT_THRESHOLD):
        assume(all(abs(v - t) > 1e-9 * (1 + t) for v in var))
    assert active_units(mu, threshold) == sum(v > threshold for v in var)
    assert active_units(mu) == sum(v > ACTIVE_UNIT_THRESHOLD for v in var)


def test_mutual_information_closed_form_limits():
    n = 64
    same = gaussian_mutual_information(np.zeros((n, 3)), np.zeros((n, 3)))  # q(z|i) = q(z): I = 0 exactly
    assert abs(same) < 1e-12
    apart = gaussian_mutual_information(np.arange(n, dtype=float)[:, None] * 50.0, np.full((n, 1), -2.0))
    assert apart == pytest.approx(math.log(n), abs=1e-9)  # no overlap: I = log N


@given(arrays(np.float64, st.tuples(st.integers(1, 8), st.just(2)), elements=finite),
       arrays(np.float64, (8, 2), elements=st.floats(-3, 3)), st.integers(0, 5))
def test_mutual_information_is_at_most_log_n(mu, logvar, seed):
    """Each term log q(z_i|i) - log (1/N) sum_j q(z_i|j) <= log N, whatever the draws."""
    est = gaussian_mutual_information(mu, logvar[: len(mu)], seed=seed)
    assert est <= math.log(len(mu)) + 1e-9


def test_mutual_information_of_two_overlapping_groups_matches_quadrature():
    """Half the rows N(-a, 1), half N(+a, 1): I = H(z) - H(z | group) with H(z) of the equal mixture
    by quadrature; the estimate lies within 4 Monte Carlo standard errors (N = 1000 single draws)."""
    a, n = 0.8, 1000
    grid = np.linspace(-12, 12, 200_001)
    phi = lambda m: np.exp(-0.5 * (grid - m) ** 2) / math.sqrt(2 * math.pi)  # noqa: E731
    mix = 0.5 * (phi(-a) + phi(a))
    h_mix = -np.sum(mix * np.log(mix)) * (grid[1] - grid[0])
    ref = h_mix - 0.5 * math.log(2 * math.pi * math.e)
    mu = np.repeat([[-a], [a]], n // 2, 0)
    lv = np.zeros_like(mu)
    # the per-row terms' spread from repeated estimates (seeds): a bound on one estimate's error
    ests = [gaussian_mutual_information(mu, lv, seed=s) for s in range(4)]
    se = max(np.std(ests, ddof=1), 0.01)
    assert 0 < ref < math.log(2)
    assert all(abs(e - ref) < 4 * se + 0.02 for e in ests), (ests, ref)
    assert abs(np.mean(ests) - ref) < 0.03


# ---------------------------------------------------------------------------- labels


def _labelled() -> pd.DataFrame:
    return pd.DataFrame({"posterior_argmax": [0, 0, 1, 1, 2, 2],
                         "label/colour": ["red", "red", "blue", "blue", None, None],
                         "label/size": ["s", "l", "s", "l", "s", "l"]})


def test_label_keys_and_label_confusion():
    pairs = [Pair("a", "1", "1", labels={"size": "s"}), Pair("b", "1", "1"), Pair("c", "1", "1", labels={"colour": 1})]
    assert label_keys(pairs) == ["colour", "size"] and label_keys([Pair("a", "1", "1")]) == []
    tab = label_confusion(_labelled(), "colour")
    assert tab.index.name == "latent value" and tab.columns.name == "colour"
    assert tab.to_dict() == {"blue": {0: 0, 1: 2}, "red": {0: 2, 1: 0}}  # rows without the label left out


def test_label_structure_metrics_with_and_without_an_assignment():
    df = _labelled()
    feats = np.arange(12, dtype=float).reshape(6, 2)
    out = label_structure_metrics(df, feats, df["posterior_argmax"].to_numpy())
    assert out["structure/alignment_nmi/colour"] == pytest.approx(1.0)  # 0 -> red, 1 -> blue
    assert out["structure/hungarian_accuracy/colour"] == 1.0
    assert out["structure/alignment_nmi/size"] == pytest.approx(0.0, abs=1e-12)  # size independent of z
    assert out["structure/hungarian_accuracy/size"] == pytest.approx(2 / 6)  # two values matched, 1 row each
    assert set(out) == {f"structure/{m}/{k}" for m in ("alignment_nmi", "hungarian_accuracy", "probe_accuracy",
                                                       "n_rows", "n_values", "majority_baseline")
                        for k in ("colour", "size")}
    assert (out["structure/n_rows/colour"], out["structure/n_values/colour"]) == (4, 2)  # rows holding it
    assert out["structure/majority_baseline/colour"] == 0.5 and out["structure/n_rows/size"] == 6
    none = label_structure_metrics(df, feats, None)
    assert math.isnan(none["structure/alignment_nmi/size"]) and math.isnan(none["structure/hungarian_accuracy/size"])
    asked = []

    def clusters(key, have, k):
        asked.append((key, int(have.sum()), k))
        return np.arange(int(have.sum())) % k

    label_structure_metrics(df, feats, None, n_clusters_of=clusters)
    assert asked == [("colour", 4, 2), ("size", 6, 2)]


def test_a_constant_label_is_nan_with_a_reason_and_few_rows_are_flagged():
    df = pd.DataFrame({"posterior_argmax": [0, 1, 0, 1], "label/one": ["a"] * 4,
                       "label/two": ["a", "b", "b", "b"]})
    out = label_structure_metrics(df, np.arange(8.0).reshape(4, 2), df["posterior_argmax"].to_numpy())
    for m in ("alignment_nmi", "hungarian_accuracy", "probe_accuracy"):  # one value: meaningless, not 1.0
        assert math.isnan(out[f"structure/{m}/one"])
    assert out["structure/n_values/one"] == 1 and out["structure/majority_baseline/one"] == 1.0
    assert out["structure/majority_baseline/two"] == 0.75 and out["structure/hungarian_accuracy/two"] == 0.75
    warn = label_warnings(out)
    assert len(warn) == 2 and "'one': one value on the 4 evaluated rows" in warn[0]
    assert f"'two': on 4 evaluated rows only (< {MIN_LABEL_ROWS})" in warn[1]
    big = {"structure/n_rows/k": float(MIN_LABEL_ROWS), "structure/n_values/k": 3.0,
           "structure/n_rows/old": float("nan")}  # a summary row of a run evaluated before these keys
    assert label_warnings(big) == [] and label_warnings(pd.Series(big)) == []


# ---------------------------------------------------------------------------- decodes of a tiny CVAE


@pytest.fixture(scope="module")
def cvae(tiny_lm):
    from zfree.models.discrete import DiscreteCVAE

    base, tok, _ = tiny_lm(n_layer=1, seed=2)
    return DiscreteCVAE(copy.deepcopy(base), n_latent=3).eval(), base, tok


def _base_greedy(base, prefix, eos_id, max_new):
    ids = list(prefix)
    with torch.no_grad():
        for _ in range(max_new):
            nxt = int(base(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(nxt)
            if nxt == eos_id:
                break
    gen = ids[len(prefix):]
    return gen[: gen.index(eos_id)] if eos_id in gen else gen


def test_every_latent_value_greedy_decodes_as_the_base_model_at_step_0(cvae):
    from tests.tiny import PAIRS

    model, base, tok = cvae
    enc = [encode_pair(tok, p) for p in PAIRS]
    prefixes = [e.prefix_ids for e in enc]
    want = [_base_greedy(base, p, tok.eos_token_id, 5) for p in prefixes]
    for k in range(3):
        assert greedy_decode(model, prefixes, [k] * len(prefixes), eos_id=tok.eos_token_id, max_new_tokens=5) == want
    digits = PAIRS[:2]
    res = decode_metrics(model, enc[:2], digits, np.full((2, 3), 1 / 3), tok, ["copy", "reverse"])
    assert set(res) == {"task/correctness", "structure/z_control_accuracy"}
    assert 0 <= res["task/correctness"] <= 1 and 0 <= res["structure/z_control_accuracy"] <= 1


def test_sampled_decodes_are_reproducible_and_bounded(cvae):
    from tests.tiny import PAIRS
    from zfree.models.decoding import decode_with_latents

    model, base, tok = cvae
    prefixes = [encode_pair(tok, p).prefix_ids for p in PAIRS]
    lat = torch.zeros(len(prefixes), 32)
    runs = [decode_with_latents(base, prefixes, lat, eos_id=tok.eos_token_id, max_new_tokens=4,
                                generator=torch.Generator().manual_seed(7)) for _ in range(2)]
    assert runs[0] == runs[1]
    assert all(len(g) <= 4 and tok.eos_token_id not in g for g in runs[0])
    tab = latent_samples(model, [encode_pair(tok, p) for p in PAIRS], PAIRS, tok, n_x=2)
    assert list(tab.columns) == ["id", "x", "reference", "latent", "greedy", "sampled"]
    assert len(tab) == 2 * 3 and tab.groupby("id")["greedy"].nunique().eq(1).all()  # step 0: z changes nothing
    assert latent_samples(model, [], [], tok).empty
    # decoded together (all x and values at once), each cell is what its row alone decodes to
    trained = copy.deepcopy(model)
    with torch.no_grad():
        trained.latent_embedding.weight.normal_(std=2.0, generator=torch.Generator().manual_seed(0))
    enc = [encode_pair(tok, p) for p in PAIRS]
    tab = latent_samples(trained, enc, PAIRS, tok, n_x=3, seed=4)
    again = latent_samples(trained, enc, PAIRS, tok, n_x=3, seed=4)
    pd.testing.assert_frame_equal(tab, again)
    row = {p.id: i for i, p in enumerate(PAIRS)}
    max_new = max(len(enc[row[i]].target_ids) for i in tab["id"].unique()) + 8
    for r in tab.itertuples():
        lat = trained.latent_embedding(torch.tensor([r.latent]))
        alone = decode_with_latents(trained.backbone, [enc[row[r.id]].prefix_ids], lat, eos_id=tok.eos_token_id,
                                    max_new_tokens=max_new, cache=False)[0]
        assert r.greedy == tok.decode(alone).strip(), (r.id, r.latent)
    assert tab.groupby("id")["greedy"].nunique().gt(1).any()  # the values now decode differently


def test_cached_decoder_equals_the_uncached_one_greedy_and_sampled(cvae):
    from tests.tiny import PAIRS
    from zfree.models.decoding import decode_with_latents

    model, base, tok = cvae
    prefixes = [encode_pair(tok, p).prefix_ids for p in PAIRS] * 3  # ragged lengths, repeated rows
    lat = torch.randn(len(prefixes), 32, generator=torch.Generator().manual_seed(0))
    kw = dict(eos_id=tok.eos_token_id, max_new_tokens=6)
    uncached = decode_with_latents(base, prefixes, lat, cache=False, **kw)
    assert decode_with_latents(base, prefixes, lat, cache=True, **kw) == uncached
    assert decode_with_latents(base, prefixes, lat, **kw) == uncached  # the default is the cached path
    a = decode_with_latents(base, prefixes, lat, cache=True, generator=torch.Generator().manual_seed(3), **kw)
    b = decode_with_latents(base, prefixes, lat, generator=torch.Generator().manual_seed(3), cache=False, **kw)
    assert a == b and len({tuple(g) for g in a}) > 1


def test_sampling_draws_the_first_token_from_the_softmax(cvae):
    from tests.tiny import PAIRS
    from zfree.models.decoding import decode_with_latents, next_token_probs

    model, base, tok = cvae
    prefix = encode_pair(tok, PAIRS[0]).prefix_ids
    n = 4000
    lat = torch.zeros(n, 32)
    got = decode_with_latents(base, [prefix] * n, lat, eos_id=-1, max_new_tokens=1, cache=True,
                              generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        p = next_token_probs(base(input_ids=torch.tensor([prefix])).logits[0, -1:])[0].numpy()
    freq = np.bincount([g[0] for g in got], minlength=len(p)) / n
    assert np.all(np.abs(freq - p) <= 4.5 * np.sqrt(p * (1 - p) / n) + 1e-9)  # binomial 4.5-sigma band per token


def test_multiref_outputs_greedy_per_value_and_samples_for_one_value(cvae):
    from tests.tiny import PAIRS

    model, base, tok = cvae
    pairs = [PAIRS[0], PAIRS[0], PAIRS[1], PAIRS[3]]
    enc = [encode_pair(tok, p) for p in pairs]
    assert first_distinct_x(pairs, 2) == [0, 2] and first_distinct_x(pairs, 9) == [0, 2, 3]
    refs = {PAIRS[0].x: ["3 2 1", "1 2 3"]}
    tab = multiref_outputs(model, enc, pairs, tok, refs, n_x=2, n_samples=5)
    assert list(tab.columns) == ["id", "x", "kind", "index", "output", "references"]
    assert list(tab["index"]) == [0, 1, 2] * 2 and set(tab["kind"]) == {"greedy"}
    assert tab.groupby("id")["output"].nunique().eq(1).all()  # step 0: every value decodes as the base
    assert list(tab["references"].iloc[0]) == ["3 2 1", "1 2 3"] and list(tab["references"].iloc[3]) == [PAIRS[1].y]
    one = copy.copy(model)
    one.n_latent = 1  # a K = 1 model (the control): samples instead of one greedy y
    s1, s2 = (multiref_outputs(one, enc, pairs, tok, refs, n_x=2, n_samples=5, seed=4) for _ in range(2))
    assert set(s1["kind"]) == {"sampled"} and list(s1["index"]) == list(range(5)) * 2
    assert s1.equals(s2)  # seeded
    assert multiref_outputs(model, [], [], tok, {}, n_x=2, n_samples=2).empty


@pytest.mark.parametrize("cache", [True, False])
def test_decoding_never_runs_past_the_context(cache, capsys):
    """Prefixes that fill the context, leave it short of room or have room to spare: prefix + new
    tokens stay within the model's 16 positions (an IndexError in the position embedding before),
    the cut rows are named in a note, and rows with room decode as they did."""
    from zfree_lab.run.tokenizer import build_digit_tokenizer
    from zfree.models.base import build_synthetic_gpt2
    from zfree.models.decoding import decode_with_latents

    tok = build_digit_tokenizer(10)
    model = build_synthetic_gpt2(len(tok), n_positions=16, n_layer=1, n_embd=32, n_head=2, seed=0).eval()
    prefixes = [[1] + [5] * 15, [1] + [6] * 11 + [2], [1, 7, 2]]  # 16 (full), 13, 3 tokens
    latents = torch.zeros(3, 32)
    out = decode_with_latents(model, prefixes, latents, eos_id=10 ** 6, max_new_tokens=8, cache=cache)  # no eos: full length
    assert [len(o) for o in out] == [0, 3, 8]
    assert "note: 2 of 3 decoded rows were cut at the model's context of 16 tokens" in capsys.readouterr().out
    alone = decode_with_latents(model, prefixes[2:], latents[2:], eos_id=10 ** 6, max_new_tokens=8, cache=cache)
    assert out[2] == alone[0]
