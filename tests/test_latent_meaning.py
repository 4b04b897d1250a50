"""zfree_lab.run.latent_meaning: what each latent value carries (lifts, properties, exemplars)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import mutual_info_score, normalized_mutual_info_score

from zfree.data.pairs import Pair
from zfree.data.synth import STRATEGIES
from zfree_lab.run.latent_meaning import (MeaningRows, _quartile_bins, exemplars, latent_meaning, ngram_lifts,
                                           per_value_alignment, posterior_mi, property_alignment, text_properties,
                                           token_lifts, value_sentences)


def test_token_lifts_equal_the_formula_row_by_row_in_float64():
    g = torch.Generator().manual_seed(0)
    B, K, T = 3, 4, 5
    lp = torch.log_softmax(torch.randn(B, K, T, 7, generator=g, dtype=torch.float64), -1)[..., 0]
    q = torch.softmax(torch.randn(B, K, generator=g, dtype=torch.float64), -1)
    q[2] = torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=torch.float64)  # all mass on one value
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 3:] = False
    lift = token_lifts(lp, q, mask)
    for b in range(B):
        for k in range(K):
            others = [j for j in range(K) if j != k]
            w = np.array([q[b, j].item() for j in others])
            w = w / w.sum() if w.sum() > 1e-9 else np.full(K - 1, 1 / (K - 1))
            for t in range(T):
                want = lp[b, k, t].item() - math.log(sum(wj * math.exp(lp[b, j, t].item()) for wj, j in zip(w, others)))
                assert lift[b, k, t].item() == pytest.approx(want if mask[b, t] else 0.0, abs=1e-12)


def test_token_lifts_are_zero_when_every_value_predicts_the_same():
    lp = torch.full((2, 3, 4), -1.3)
    q = torch.softmax(torch.randn(2, 3), -1)
    assert torch.allclose(token_lifts(lp, q, torch.ones(2, 4, dtype=torch.bool)), torch.zeros(2, 3, 4), atol=1e-6)


def test_token_lifts_refuse_one_value_and_wrong_shapes():
    with pytest.raises(ValueError, match="K >= 2"):
        token_lifts(torch.zeros(2, 1, 3), torch.ones(2, 1), torch.ones(2, 3, dtype=torch.bool))
    # the shape check is ours; under the test tier's jaxtyping hook the annotation catches it first
    with pytest.raises((ValueError, TypeError), match=r"expected \(B, K, T\)|Type-check error"):
        token_lifts(torch.zeros(2, 2, 3), torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool))


def test_ngram_lifts_rank_the_planted_token_first_for_its_value():
    rows = MeaningRows()
    rng = np.random.default_rng(0)
    for r in range(40):
        toks = [5, 6, 7, 9] if r % 2 else [5, 8, 7, 9]
        lift = rng.normal(0, 0.01, (2, 4))
        lift[0, 1] += 2.0 if toks[1] == 6 else 0.0  # value 0 promotes token 6
        lift[1, 1] += 1.5 if toks[1] == 8 else 0.0  # value 1 promotes token 8
        rows.tokens.append(toks)
        rows.lifts.append(lift)
        rows.ids.append(str(r))
    tab = ngram_lifts(rows, decode=lambda ids: "".join(chr(ord("a") + i) for i in ids))
    top = tab[(tab["n"] == 1) & (tab["rank"] == 1)].set_index("value")
    assert top.loc[0, "text"] == "g" and top.loc[0, "count"] == 20 and top.loc[0, "mean_lift"] == pytest.approx(2.0, abs=0.02)
    assert top.loc[1, "text"] == "i" and top.loc[1, "mean_lift"] == pytest.approx(1.5, abs=0.02)
    bi = tab[(tab["n"] == 2) & (tab["value"] == 0) & (tab["rank"] == 1)].iloc[0]
    assert bi["text"] in ("fg", "gh") and bi["mean_lift"] == pytest.approx(2.0, abs=0.05)
    # an n-gram under MIN_COUNT occurrences is never ranked
    rows.tokens.append([1, 2]); rows.lifts.append(np.full((2, 2), 9.0)); rows.ids.append("x")
    assert "b" not in set(ngram_lifts(rows, decode=lambda ids: "".join(chr(ord("a") + i) for i in ids))["text"])


def test_property_alignment_matches_sklearn_and_finds_a_planted_property():
    rng = np.random.default_rng(1)
    assign = rng.integers(0, 3, 300)
    props = pd.DataFrame({"planted": np.where(assign == 2, "long", "short"), "noise": rng.choice(list("abcd"), 300),
                          "constant": ["same"] * 300})
    tab, notes = property_alignment(props, assign, seed=0)
    t = tab.set_index("property")
    assert t.loc["planted", "mi"] == pytest.approx(mutual_info_score(assign, props["planted"]), rel=1e-9)
    assert t.loc["noise", "nmi"] == pytest.approx(normalized_mutual_info_score(assign, props["noise"]), rel=1e-9)
    assert bool(t.loc["planted", "passes"]) and not bool(t.loc["noise", "passes"])
    assert t.loc["noise", "p_value"] > 0.05 and t.loc["planted", "p_value"] == pytest.approx(1 / 1001)
    assert tab["property"].iloc[0] == "planted" and "constant" not in set(tab["property"])
    assert notes == ["property 'constant' has a single value on these rows: skipped"]


def test_a_collapsed_run_passes_nothing():
    rng = np.random.default_rng(2)
    props = pd.DataFrame({"p": rng.choice(list("ab"), 100), "q": rng.choice(list("xyz"), 100)})
    tab, _ = property_alignment(props, np.zeros(100, dtype=int), seed=0)
    assert (tab["mi"] == 0).all() and not tab["passes"].any() and (tab["p_value"] == 1).all()
    from zfree_lab.run.latent_meaning import per_value_alignment

    assert not any(t["passes"].any() for t in per_value_alignment(props, np.zeros(100, dtype=int), 4).values())


def test_posterior_mi_is_the_argmax_mi_for_a_certain_posterior_and_zero_for_a_constant_one():
    rng = np.random.default_rng(3)
    assign, b = rng.integers(0, 4, 400), rng.integers(0, 3, 400)
    b = np.where(rng.random(400) < 0.5, assign % 3, b)  # dependent
    assert posterior_mi(b, np.eye(4)[assign]) == pytest.approx(mutual_info_score(b, assign), rel=1e-12)
    assert posterior_mi(b, np.full((400, 4), 0.25)) == pytest.approx(0.0, abs=1e-15)
    # the joint of the soft assignment, in float64 by hand
    q = rng.dirichlet(np.ones(4), 400)
    joint = np.array([[q[b == i, k].sum() for k in range(4)] for i in range(3)]) / 400
    ref = float(np.nansum(joint * np.log(joint / joint.sum(1, keepdims=True) / joint.sum(0, keepdims=True))))
    assert posterior_mi(b, q) == pytest.approx(ref, rel=1e-12)


def test_an_unused_zs_argmax_that_follows_y_passes_nothing_with_its_posterior():
    """The collapsed runs of the default study: a near-uniform posterior (z unused, rate ~ 1e-5 nats)
    whose argmax still follows y. The argmax alone passes its permutation test; the posterior carries
    ~1e-9 nats of it, so nothing passes. A confident posterior with the same argmax passes."""
    rng = np.random.default_rng(4)
    n, K = 300, 4
    first = rng.choice(["The", "A", "In"], n)
    tilt = np.zeros((n, K))
    tilt[np.arange(n), pd.factorize(first)[0]] = 1e-4  # the argmax follows the first word
    near_uniform = np.exp(tilt + 1e-6 * rng.standard_normal((n, K)))
    near_uniform /= near_uniform.sum(1, keepdims=True)
    assign = near_uniform.argmax(1)
    props = pd.DataFrame({"first word": first, "noise": rng.choice(list("ab"), n)})
    bare, _ = property_alignment(props, assign, seed=0)
    assert bool(bare.set_index("property").loc["first word", "passes"])  # what the argmax alone says
    tab, notes = property_alignment(props, assign, seed=0, q=near_uniform)
    t = tab.set_index("property")
    assert not tab["passes"].any() and t.loc["first word", "mi_posterior"] < 1e-6 < t.loc["first word", "mi"]
    assert any("'first word'" in n and "not passed, z carries too little" in n for n in notes)
    assert not any(v["passes"].any() for v in per_value_alignment(props, assign, K, q=near_uniform).values())
    confident = np.full((n, K), 0.01)
    confident[np.arange(n), assign] = 0.97
    assert bool(property_alignment(props, assign, seed=0, q=confident)[0].set_index("property").loc["first word",
                                                                                                     "passes"])


def test_per_value_tables_from_the_shared_shuffles_equal_the_indicators_own():
    """Each value's table is collapsed from the assignment's counts; its MI and NMI are those of the
    indicator [argmax = k] itself (scikit-learn), and a planted value-specific property passes."""
    rng = np.random.default_rng(5)
    assign = rng.integers(0, 4, 400)
    props = pd.DataFrame({"is two": np.where(assign == 2, "yes", "no"), "noise": rng.choice(list("abc"), 400)})
    per_value = per_value_alignment(props, assign, 5)
    assert sorted(per_value) == [0, 1, 2, 3]  # value 4 has no rows
    for k, tab in per_value.items():
        t = tab.set_index("property")
        for c in props:
            assert t.loc[c, "mi"] == pytest.approx(mutual_info_score(assign == k, props[c]), rel=1e-9, abs=1e-15)
            assert t.loc[c, "nmi"] == pytest.approx(normalized_mutual_info_score(assign == k, props[c]), rel=1e-9,
                                                    abs=1e-15)
    assert per_value[2]["property"].iloc[0] == "is two" and bool(per_value[2]["passes"].iloc[0])
    assert not per_value[0].set_index("property").loc["noise", "passes"]


def test_property_alignment_refuses_mismatched_lengths_and_notes_too_few_rows():
    with pytest.raises(ValueError, match="3 property rows but 2 posterior assignments"):
        property_alignment(pd.DataFrame({"p": list("abc")}), np.array([0, 1]))
    tab, notes = property_alignment(pd.DataFrame({"p": ["a"]}), np.array([0]))
    assert tab.empty and notes == ["1 evaluated row(s): no property is tested"]


def test_shuffles_within_groups_permute_each_x_uniformly_and_leave_single_rows_alone():
    """``permute_within_groups``: every shuffle keeps each x's codes on that x's rows, a row alone in its
    x keeps its code, and the 3! orders of a 3-row x are equally likely (chi-square on 6000 shuffles,
    5 degrees of freedom: a uniform sampler exceeds the 1e-4 critical value with probability 1e-4)."""
    from scipy.stats import chi2

    from zfree_lab.run.property_alignment import permute_within_groups

    codes = np.array([0, 7, 1, 2, 5, 5, 9])
    groups = np.array(["a", "solo", "a", "a", "b", "b", "other"], dtype=object)
    perms = permute_within_groups(codes, groups, 6000, np.random.default_rng(0))
    assert perms.shape == (6000, 7)
    assert (perms[:, [1, 6]] == [7, 9]).all() and (perms[:, [4, 5]] == 5).all()
    triples = perms[:, [0, 2, 3]]
    assert (np.sort(triples, axis=1) == [0, 1, 2]).all()
    counts = pd.Series([tuple(t) for t in triples]).value_counts()
    assert len(counts) == 6
    stat = float(((counts - 1000) ** 2 / 1000).sum())
    assert stat < chi2.isf(1e-4, 5), counts.to_dict()


def _x_confounded_rows(rng, n_x: int = 100, per_x: int = 4, beyond: float = 0.0, noise: float = 0.3):
    """Rows where a property follows x (x mod 3 with probability 0.6, else uniform over 3) and the
    argmax follows x (x mod 3, replaced with probability ``noise`` by a uniform draw independent of the
    property); with probability ``beyond`` the argmax is the row's property instead: z then carries the
    property beyond x. Returns (props, assign, x)."""
    x = np.repeat(np.arange(n_x), per_x)
    prop = np.where(rng.random(len(x)) < 0.6, x % 3, rng.integers(0, 3, len(x)))
    assign = np.where(rng.random(len(x)) < noise, rng.integers(0, 3, len(x)), x % 3)
    assign = np.where(rng.random(len(x)) < beyond, prop, assign)
    return pd.DataFrame({"property": prop.astype(str)}), assign, x


def test_a_z_that_follows_x_alone_passes_nothing_and_one_that_carries_the_property_beyond_x_passes():
    """Issue 54, item 8, on 200 seeded data sets of 100 x with 4 rows each (199 shuffles each). Under H0
    (the argmax follows x, plus noise independent of the property) the shuffles within x reject at most
    21 of 200 (a valid level-0.05 test does so with probability >= 1 - 1.2e-3; Binomial(200, 0.05)); the
    shuffles across all rows reject nearly all of them (the confound this fixes). With the argmax equal
    to the property on half the rows, the within-x test passes at least 190 of 200 (a test of power
    0.99 falls below 190 with probability 7e-6)."""
    null_within = null_plain = power = 0
    for seed in range(200):
        props, assign, x = _x_confounded_rows(np.random.default_rng(seed))
        null_within += bool(property_alignment(props, assign, seed=seed, groups=x, n_perm=199)[0]["passes"].iloc[0])
        null_plain += bool(property_alignment(props, assign, seed=seed, n_perm=199)[0]["passes"].iloc[0])
        props, assign, x = _x_confounded_rows(np.random.default_rng(1000 + seed), beyond=0.5)
        power += bool(property_alignment(props, assign, seed=seed, groups=x, n_perm=199)[0]["passes"].iloc[0])
    assert null_within <= 21 and null_plain >= 190 and power >= 190, (null_within, null_plain, power)


def test_a_z_that_is_a_function_of_x_passes_nothing_however_strongly_it_aligns():
    """The argmax a deterministic function of x: every shuffle within x leaves it as it is, so p = 1;
    across all rows it passed at p = 1/1001. Per value too."""
    props, assign, x = _x_confounded_rows(np.random.default_rng(7), noise=0.0)
    plain = property_alignment(props, assign, seed=0)[0].iloc[0]
    assert bool(plain["passes"]) and plain["p_value"] == pytest.approx(1 / 1001)
    tab, notes = property_alignment(props, assign, seed=0, groups=x)
    assert tab["p_value"].iloc[0] == 1.0 and not tab["passes"].any()
    assert tab["mi"].iloc[0] == pytest.approx(plain["mi"], rel=1e-12)  # MI stays that of all rows
    assert notes[0].startswith("the argmax is shuffled only among rows of equal x (what z carries beyond x): 400 of "
                               "the 400 rows share their x with another row (100 x)")
    assert not any(t["passes"].any() for t in per_value_alignment(props, assign, 3, groups=x).values())


def test_with_every_x_distinct_nothing_can_be_tested():
    """No x on two rows: no shuffle within x moves a row, so the table says it could not test (p NaN)
    and nothing passes, even a property the argmax equals."""
    assign = np.arange(60) % 3
    props = pd.DataFrame({"same as z": assign.astype(str)})
    tab, notes = property_alignment(props, assign, seed=0, groups=np.arange(60))
    assert np.isnan(tab["p_value"]).all() and np.isnan(tab["null95"]).all() and not tab["passes"].any()
    assert notes[0].startswith("could not test what z carries beyond x: no x has 2 or more of the 60 rows")
    assert all(np.isnan(t["p_value"]).all() and not t["passes"].any()
               for t in per_value_alignment(props, assign, 3, groups=np.arange(60)).values())
    with pytest.raises(ValueError, match="and 59 x"):
        property_alignment(props, assign, groups=np.arange(59))


def test_latent_meaning_tests_what_z_carries_beyond_x():
    """The default study's case (issue 54): y's first word follows x and a confident argmax follows x
    alone; across all rows 'first word' passed. ``latent_meaning`` shuffles within x: nothing passes."""
    rng = np.random.default_rng(11)
    words = ["The", "A", "In", "Near", "At"]
    pairs, assign = [], []
    for i in range(50):  # 50 x, 4 rows each
        for j in range(4):
            w = words[i % 5] if rng.random() < 0.8 else words[int(rng.integers(0, 5))]
            pairs.append(Pair(f"{i}-{j}", f"name[N{i}] area[A{i % 5}]", f"{w} place {i} serves food."))
            assign.append(i % 5 % 3)
    assign = np.array(assign)
    q = np.full((200, 3), 0.01)
    q[np.arange(200), assign] = 0.98
    props = text_properties(pairs)
    assert bool(property_alignment(props, assign, seed=0, q=q)[0].set_index("property").loc["first word", "passes"])
    doc, _ = latent_meaning(assign, pairs, q=q)
    assert not any(p["passes"] for p in doc["properties"]) and "equal x" in doc["rule"]
    assert next(p for p in doc["properties"] if p["property"] == "first word")["p_value"] == 1.0


def test_quartile_bins_cover_every_value_with_ordered_names():
    v = np.arange(1, 21, dtype=float)
    bins = _quartile_bins(v)
    assert len(set(bins)) == 4 and bins[0] == "1-5" and bins[-1].endswith("-20")
    assert _quartile_bins(np.full(5, 7.0)) == ["7"] * 5


def test_text_properties_from_text_labels_and_the_generators_relations():
    pairs = [Pair("a", "name[X], area[city]", "X is in the city. It is cheap.", labels={"n": "2"}),
             Pair("b", "name[Y]", "The Y serves food!", labels={"n": "1"}),
             Pair("c", "3 1 2", "1 2 3"), Pair("d", "3 1 2", "2 1 3")]
    props = text_properties(pairs, n_tokens=[9, 5, 4, 4], strategies=["sort_asc", "reverse", "copy"])
    assert list(props["sentences"]) == ["2", "1", "1", "1"]
    assert list(props["first word"]) == ["x", "the", "1", "2"]
    assert list(props["last punctuation"]) == [".", "!", "none", "none"]
    assert list(props["y opens with a word of x"]) == ["True", "False", "True", "True"]
    assert list(props["label/n"]) == ["2", "1", "", ""]
    assert list(props["y = s(x)"]) == ["none", "none", "sort_asc", "reverse"]
    assert "y = s(x)" not in text_properties(pairs)  # only where the generator's metadata lists strategies


def test_on_generated_rows_the_relation_property_tops_the_ranking_when_z_is_the_strategy():
    rng = np.random.default_rng(3)
    names = ["sort_asc", "sort_desc", "reverse", "copy"]
    pairs, assign = [], []
    for i in range(400):
        x = tuple(int(d) for d in rng.integers(0, 10, rng.integers(4, 9)))
        s = int(rng.integers(0, 4))
        pairs.append(Pair(str(i), " ".join(map(str, x)), " ".join(map(str, STRATEGIES[names[s]](x)))))
        assign.append(s)
    assign = np.array(assign)
    props = text_properties(pairs, strategies=names)
    tab, _ = property_alignment(props, assign, seed=0)
    assert tab["property"].iloc[0] == "y = s(x)" and bool(tab["passes"].iloc[0]) and tab["nmi"].iloc[0] >= 0.9
    from zfree_lab.run.latent_meaning import per_value_alignment

    per_value = per_value_alignment(props, assign, 4)
    for k in range(4):  # each value's own top-ranked property is the strategy-defining relation
        assert per_value[k]["property"].iloc[0] == "y = s(x)" and bool(per_value[k]["passes"].iloc[0])
    sentences = value_sentences(assign, props, tab, pd.DataFrame(columns=["value", "rank", "n"]), None, 4, per_value)
    assert f"y = s(x) = '{names[3]}'" in sentences[3]
    assert "y = s(x) = 'sort_asc'" in sentences[0] and sentences[0].startswith(f"value 0 ({(assign == 0).mean():.0%} of rows)")


def test_exemplars_are_each_values_most_confident_rows_at_full_length():
    pairs = [Pair(str(i), "x" * 200, f"y{i} " * 50) for i in range(5)]
    q = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.1, 0.9], [0.5, 0.5]])
    ex = exemplars(q, pairs, n=2)
    assert list(ex[ex["value"] == 0]["id"]) == ["0", "2"] and list(ex[ex["value"] == 1]["id"]) == ["3", "1"]
    assert ex["y"].iloc[0] == pairs[0].y and len(ex["x"].iloc[0]) == 200


def test_latent_meaning_assembles_a_document_and_a_tidy_table():
    rng = np.random.default_rng(4)
    pairs = [Pair(str(i), "a b", ("Short one." if i % 2 else "A much longer sentence here. And more.")) for i in range(60)]
    assign = np.arange(60) % 2
    q = np.eye(2)[assign] * 0.8 + 0.1
    rows = MeaningRows()
    for i in range(60):
        rows.ids.append(str(i)); rows.tokens.append([1, 2, 3]); rows.lifts.append(rng.normal(0, 0.1, (2, 3)))
    doc, tidy = latent_meaning(assign, pairs, q=q, rows=rows, n_tokens=[3 + 5 * (1 - a) for a in assign])
    assert doc["K"] == 2 and doc["rows"] == 60 and doc["descriptive"] is True
    assert {v["value"] for v in doc["values"]} == {0, 1} and all(len(v["exemplars"]) == 3 for v in doc["values"])
    assert "longer: median 8 tokens vs 3" in doc["values"][0]["sentence"]
    assert set(tidy["kind"]) == {"ngram", "property"}
    assert doc["properties"][0]["passes"]  # length and sentences separate the two values exactly


def test_a_run_folder_gets_its_meaning_after_the_final_evaluation(tiny_run, tmp_path):
    """A discrete run writes latent_meaning.json/.parquet (the generator's relations among the
    properties, one entry per value); the z-free control of the same data writes none."""
    import json

    from tests.tiny import tiny_flat
    from zfree.config import TrainConfig
    from zfree_lab.run.training import train_cvae

    data, base = tiny_run
    run = tmp_path / "run"
    train_cvae(TrainConfig.from_flat(tiny_flat(data, base, steps=4, eval_every=4, device="cpu")), run, progress=False)
    doc = json.loads((run / "latent_meaning.json").read_text())
    assert doc["source"] == "posterior argmax" and doc["rows"] == 24 and len(doc["values"]) == doc["K"] >= 2
    assert "y = s(x)" in {p["property"] for p in doc["properties"]} | set(n.split("'")[1] for n in doc["notes"]
                                                                          if "'" in n)
    # whether the decoder uses z is the summary's own verdict, and a run that does not use it says so first
    assert doc["decoder_uses_z"] == json.loads((run / "summary.json").read_text())["latent_used"]
    assert doc["decoder_uses_z"] or doc["notes"][0].startswith("the decoder does not use z on these rows")
    tidy = pd.read_parquet(run / "latent_meaning.parquet")
    assert set(tidy["kind"]) <= {"ngram", "property"} and (tidy["kind"] == "property").any()
    control = tmp_path / "control"
    train_cvae(TrainConfig.from_flat(tiny_flat(data, base, steps=2, eval_every=2, device="cpu",
                                               latent_source="control", n_latent=1)), control, progress=False)
    assert not (control / "latent_meaning.json").exists()


def test_the_report_part_keeps_text_from_data_as_text(tmp_path):
    import json

    from zfree_lab.report.meaning_report import meaning_markdown, promoted_table, property_table, read_meaning

    doc = {"source": "posterior argmax", "rows": 10, "rule": "p < 0.05 / 2", "notes": ["property 'x' skipped"],
           "properties": [{"property": "first word", "levels": 3, "mi": 0.2, "nmi": 0.5, "null95": 0.05,
                           "p_value": 0.001, "passes": True}],
           "values": [{"value": 0, "sentence": "value 0 (50% of rows): first word = '<b>*x*</b>'",
                       "tokens": [{"text": "<script>", "mean_lift": 1.234, "count": 4, "rows": 3}], "phrases": []}]}
    (tmp_path / "latent_meaning.json").write_text(json.dumps(doc))
    got = read_meaning(tmp_path)
    md = meaning_markdown(got)
    assert "<b>" not in md and "*x*" not in md and "&#60;b&#62;" in md and "Descriptive" in md
    assert property_table(got).loc["first word", "passes"]
    assert promoted_table(got).iloc[0]["text"] == "'<script>'"  # escaped by pandas' HTML writer, not here
    (tmp_path / "latent_meaning.json").write_text("{torn")
    assert read_meaning(tmp_path) is None and read_meaning(tmp_path / "absent") is None
    none_pass = {**doc, "properties": [{**doc["properties"][0], "passes": False}]}
    assert "nothing here says what z carries" in meaning_markdown(none_pass)


def test_conditioning_on_the_router_rejects_a_z_read_from_x_and_keeps_one_beyond_it():
    """The shipped presets evaluate one row per x, so shuffles within equal x can move nothing; the run's
    own router (z read from x alone) is the strata ``write_latent_meaning`` passes. A collapsed posterior
    (q ~ p: the argmax is the router's) passes nothing; a planted relation that x cannot predict (the router
    one stratum, the argmax the strategy) still passes."""
    from zfree_lab.run.latent_meaning import tied_router_argmax

    rng = np.random.default_rng(5)
    words = ["The", "A", "In", "Near", "At"]
    n = 300
    xs = rng.integers(0, 5, n)  # every x distinct, its class known to the router
    strategy = rng.integers(0, 3, n)  # what x cannot predict
    pairs = [Pair(str(i), f"name[N{i}] area[A{xs[i]}]", f"{words[xs[i]] if rng.random() < 0.8 else 'The'} place "
                  f"{i}" + (" serves food." if strategy[i] == 0 else " is nice!" if strategy[i] == 1 else " ok"))
             for i in range(n)]
    router = np.full((n, 3), 0.1)
    router[np.arange(n), xs % 3] = 0.8
    collapsed = tied_router_argmax(router)  # q ~ p: the argmax follows x
    q = np.full((n, 3), 0.01)
    q[np.arange(n), collapsed] = 0.98
    doc, _ = latent_meaning(collapsed, pairs, q=q, strata=tied_router_argmax(router), strata_name="router argmax")
    assert not any(p["passes"] for p in doc["properties"]) and "router argmax" in doc["rule"]
    plain, _ = latent_meaning(collapsed, pairs, q=q, strata=np.zeros(n))  # no conditioning: the x-confound passes
    assert any(p["passes"] for p in plain["properties"])
    q2 = np.full((n, 3), 0.01)
    q2[np.arange(n), strategy] = 0.98
    doc2, _ = latent_meaning(strategy, pairs, q=q2, strata=tied_router_argmax(np.full((n, 3), 1 / 3)),
                             strata_name="router argmax")
    assert next(p for p in doc2["properties"] if p["property"] == "last punctuation")["passes"]
    assert tied_router_argmax(np.array([[0.5, 0.5], [0.2, 0.8]])).tolist() == [0, 1]


def test_the_promoted_table_reads_by_value_and_shows_no_negative_zero():
    """The smoke study's table listed a lift of -0.0 (a -0.001 rounded) beside 0.0 and a raw row
    number 0…39 before the value column; the rows are indexed by value and kind instead."""
    from zfree_lab.report.meaning_report import promoted_table

    doc = {"values": [{"value": 0, "tokens": [{"text": "5", "mean_lift": 0.0004, "count": 28, "rows": 23},
                                              {"text": "0", "mean_lift": -0.0012, "count": 22, "rows": 19}],
                       "phrases": [{"text": "5 4", "mean_lift": 0.31, "count": 3, "rows": 3}]}]}
    t = promoted_table(doc)
    assert t.index.names == ["value", "kind"] and list(t["text"]) == ["'5 4'"]  # '5' and '0' read 0.0: not promoted
    assert "-0.0" not in t.to_html() and list(t["mean lift (nats)"]) == [0.31]


def test_a_collapsed_runs_table_lists_no_token_at_zero_lift_and_says_so_in_words():
    """The review: a collapsed run's "what z learned" table listed its values' "promoted" tokens at a lift of
    0.0. A token whose mean lift reads 0.0 or below at the table's precision is not promoted: not listed; a
    value left with none is named in words, and a run where no value promotes anything says so (its note that
    the decoder does not use z stays in the sentences above)."""
    from zfree_lab.report.meaning_report import meaning_markdown, promoted_table, unpromoted_markdown

    flat = [{"text": "the", "mean_lift": 0.0, "count": 40, "rows": 20}, {"text": ".", "mean_lift": 0.004, "count": 30,
                                                                          "rows": 20},
            {"text": "a", "mean_lift": -0.02, "count": 12, "rows": 9}]
    note = "the decoder does not use z on these rows (measured use 0%, not above 50%): what passes here ..."
    collapsed = {"source": "posterior argmax", "rows": 40, "rule": "p < 0.05 / 6", "properties": [], "notes": [note],
                 "values": [{"value": k, "sentence": f"value {k} (50% of rows)", "tokens": flat,
                             "phrases": [{"text": "the .", "mean_lift": 0.001, "count": 9, "rows": 9}]}
                            for k in (0, 1)]}
    assert promoted_table(collapsed).empty
    assert unpromoted_markdown(collapsed) == ("*No value promotes a token or phrase over the other values: none has "
                                              "a mean lift above 0.00 nats.*")
    assert "- note: the decoder does not use z on these rows" in meaning_markdown(collapsed)  # the note is kept
    one = {**collapsed, "values": [collapsed["values"][0],
                                   {"value": 1, "tokens": [*flat, {"text": "food", "mean_lift": 0.41, "count": 5,
                                                                   "rows": 5}], "phrases": []}]}
    t = promoted_table(one)
    assert list(t.index) == [(1, "token")] and list(t["text"]) == ["'food'"] and list(t["mean lift (nats)"]) == [0.41]
    assert unpromoted_markdown(one) == ("*Value 0 promotes no token or phrase over the other values: none has a mean "
                                        "lift above 0.00 nats.*")
    assert unpromoted_markdown({"values": [one["values"][1]]}) == ""  # every value promotes one: no line


def test_a_value_whose_lifts_are_zero_promotes_nothing_in_its_sentence_or_its_lists():
    """A collapsed run's decoders agree: every lift is 0 (or within rounding of it). Its values' sentences
    promised "promotes 'a' (+0.00 nats, 60x)" and its JSON listed the tokens as promoted; a value whose lift
    is planted still promotes its token in both."""
    rng = np.random.default_rng(6)
    pairs = [Pair(str(i), "a b", "Short one." if i % 2 else "A longer one here.") for i in range(60)]
    assign = np.arange(60) % 2
    q = np.eye(2)[assign] * 0.8 + 0.1
    rows = MeaningRows()
    for i in range(60):
        lift = np.zeros((2, 3))
        lift[1, 1] = 0.6 + rng.normal(0, 0.01)  # value 1 promotes token 2; value 0 changes nothing
        lift[0] = -1e-4 * rng.random(3)  # a collapsed value: 0 to -0.0001 nats
        rows.ids.append(str(i)); rows.tokens.append([1, 2, 3]); rows.lifts.append(lift)
    doc, tidy = latent_meaning(assign, pairs, q=q, rows=rows, decode=lambda ids: " ".join(f"t{i}" for i in ids))
    zero, planted = doc["values"]
    assert "promotes" not in zero["sentence"] and zero["tokens"] == [] and zero["phrases"] == []
    assert "promotes 't2' (+0.60 nats, 60x)" in planted["sentence"]
    assert [t["text"] for t in planted["tokens"]] == ["t2"] and all(p["mean_lift"] > 0 for p in planted["phrases"])
    assert len(tidy[(tidy["kind"] == "ngram") & (tidy["value"] == 0)]) == 6  # the tidy table keeps every n-gram


def test_a_value_no_row_picks_is_named_once_and_a_rare_one_by_its_count_not_as_0_percent():
    """"What z learned" listed "value 3 (0% of rows)" for a value no row's argmax picked and for one that 1
    of 300 rows picked: the first is named on one line with the others left unused, the second by its count."""
    from zfree_lab.report.meaning_report import meaning_markdown

    pairs = [Pair(str(i), "a b", "Short one." if i % 2 else "A longer one here.") for i in range(300)]
    assign = np.arange(300) % 2
    assign[7] = 2  # one row of 300 picks value 2; values 3 and 4 none
    doc, _ = latent_meaning(assign, pairs, q=np.eye(5)[assign] * 0.9 + 0.02)
    sentences = [v["sentence"] for v in doc["values"]]
    assert sentences[2].startswith("value 2 (1 of 300 rows)") and sentences[0].startswith("value 0 (50% of rows)")
    md = meaning_markdown(doc)
    assert "- values 3, 4: no evaluated row (the posterior argmax never picks them)" in md
    assert "value 3 &#40;0&#37; of rows" not in md and "value 2 &#40;1 of 300 rows&#41;" in md  # (md_text's escapes)
