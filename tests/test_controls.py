"""The z-free control, the label oracles, the spread evaluation sample and the gains against the
control (issue "Real data, true numbers"): zfree.config (latent_source), zfree.models.discrete
(given z), zfree.objective.objectives (GIVEN), zfree_lab.run.split.spread_sample,
zfree_lab.experiment.controls, zfree_lab.experiment.gains."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from tests.tiny import PAIRS, pairs_batch, tiny_flat
from zfree.config import TrainConfig
from zfree.data.labels import label_keys_of, label_value, label_values
from zfree.data.pairs import Pair
from zfree_lab.run.split import spread_sample
from zfree_lab.run.metrics import measured_use
from zfree.models.discrete import DiscreteCVAE
from zfree.objective.losses import reconstruction_per_value
from zfree.objective.objectives import GIVEN, assemble
from zfree_lab.run.training import train_cvae
from zfree_lab.experiment.controls import LINKS_FILE, control_params, null_params, oracle_labels, oracle_params, with_controls
from zfree_lab.experiment.gains import interval, oracle_table, run_gains
from zfree_lab.experiment.spec import expand_grid


# ---------------------------------------------------------------------------- config


def test_latent_source_is_validated():
    TrainConfig.from_flat({**TrainConfig().to_flat(), "latent_source": "control", "n_latent": 1})
    TrainConfig.from_flat({**TrainConfig().to_flat(), "latent_source": "label:first_slot", "n_latent": 8})
    for bad, msg in [({"latent_source": "control"}, "n_latent"), ({"latent_source": "label:"}, "latent_source"),
                     ({"latent_source": "posterior", "n_latent": 1}, "n_latent"),
                     ({"latent_source": "label:x", "aid": "hard_em_then_soft"}, "aid must be 'none'"),
                     ({"latent_source": "label:x", "latent_kind": "continuous"}, "discrete")]:
        with pytest.raises(ValueError, match=msg):
            TrainConfig.from_flat({**TrainConfig().to_flat(), **bad})


# ---------------------------------------------------------------------------- the model with a given z


def _given_model(tok_model, source, K, index):
    model, tok = tok_model
    m = DiscreteCVAE(copy.deepcopy(model), K, latent_source=source).double()  # the session's model untouched
    m.set_given(index)
    return m, tok


def test_given_z_decodes_like_the_base_at_step_0_and_its_rate_is_minus_log_p(tiny_lm):
    model, tok, _ = tiny_lm()
    batch = pairs_batch(tok)
    m, _ = _given_model((model, tok), "label:k", 3, {"a": 0, "b": 2, "c": 1, "d": 2})
    with torch.no_grad():
        sel = m.forward_given(batch)
        full = m(batch)
    assert sel.posterior_logits.shape == (4, 3)
    q = torch.softmax(sel.posterior_logits, -1)
    assert torch.equal(q, torch.nn.functional.one_hot(torch.tensor([0, 2, 1, 2]), 3).to(q.dtype))  # exactly one-hot
    # the given value's decoder pass is the full K-way path's, gathered at z, and the base model's at init
    gathered = full.target_logprobs.gather(1, sel.z[:, None, None].expand(-1, 1, full.target_logprobs.shape[-1]))[:, 0]
    torch.testing.assert_close(sel.selected_logprobs, gathered, rtol=0, atol=1e-12)
    torch.testing.assert_close(sel.selected_logprobs, sel.zfree_target_logprobs, rtol=0, atol=1e-12)
    recon = reconstruction_per_value(-sel.selected_logprobs[:, None], batch.target_mask, TrainConfig().objective, None)
    br = assemble(GIVEN, TrainConfig().objective, recon=recon[:, 0], target_len=batch.target_len,
                  q_logits=sel.posterior_logits, p_logits=sel.prior_logits)
    # the router starts uniform: KL(one-hot || uniform) = log K exactly
    torch.testing.assert_close(br.per_example["kl"], torch.full((4,), math.log(3), dtype=torch.float64),
                               rtol=0, atol=1e-12)


def test_the_router_of_a_given_z_is_a_probe_its_loss_never_reaches_the_decoder(tiny_lm):
    model, tok, _ = tiny_lm()
    batch = pairs_batch(tok)
    m, _ = _given_model((model, tok), "label:k", 3, {"a": 0, "b": 2, "c": 1, "d": 2})
    sel = m.forward_given(batch)
    torch.nn.functional.cross_entropy(sel.prior_logits, sel.z).backward()
    assert m.router_head.weight.grad.abs().sum() > 0
    assert all(p.grad is None or p.grad.abs().sum() == 0 for n, p in m.named_parameters() if n.startswith("backbone."))


def test_a_control_has_one_value_and_zero_rate(tiny_lm):
    model, tok, _ = tiny_lm()
    m, _ = _given_model((model, tok), "control", 1, {p.id: 0 for p in PAIRS})
    with torch.no_grad():
        sel = m.forward_given(pairs_batch(tok))
    br = assemble(GIVEN, TrainConfig().objective, recon=torch.ones(4, dtype=torch.float64),
                  target_len=torch.ones(4, dtype=torch.long), q_logits=sel.posterior_logits,
                  p_logits=sel.prior_logits)
    assert torch.equal(br.per_example["kl"], torch.zeros(4, dtype=torch.float64))
    with pytest.raises(KeyError, match="no given latent value"):
        m.set_given({"a": 0})
        m.forward_given(pairs_batch(tok))


def test_measured_use_needs_two_codes():
    kl = np.array([1.0, 1.0, 0.0])
    bayes = np.full(3, np.nan)
    assert measured_use(kl, bayes, math.log(4)).tolist() == [True, True, False]
    assert measured_use(kl, bayes, math.log(4), codes_used=1).tolist() == [False, False, False]


# ---------------------------------------------------------------------------- labels and the evaluation sample


def test_labels_joint_keys_and_missing_rows():
    rows = [Pair("1", "x", "y", strategy="s", labels={"a": "u", "b": 2}), Pair("2", "x", "y", strategy="t", labels={"a": "v"})]
    assert label_value(rows[0], "a*b") == "u*2" and label_value(rows[1], "a*b") is None
    assert label_keys_of(rows) == ["strategy", "a"]
    assert label_values(rows, "a") == ["u", "v"]
    with pytest.raises(ValueError, match=r"val\.jsonl: row '2' has no label 'b'"):
        label_values(rows, "b", source="val.jsonl")


def test_spread_sample_covers_every_x_before_repeating_one():
    rows = [Pair(f"{x}-{i}", f"x{x}", "y") for x in range(10) for i in range(x + 1)]  # x9 has 10 rows, x0 one
    s = spread_sample(rows, 10)
    assert len({p.x for p in s}) == 10  # the first 10 rows: one per x
    assert [p.id for p in spread_sample(rows, 10)] == [p.id for p in s]  # the same sample every call
    assert [p.id for p in spread_sample(rows, 10, seed=1)] != [p.id for p in s]
    assert sorted(p.id for p in spread_sample(rows, 0)) == sorted(p.id for p in rows)
    first = rows[:12]  # first-in-file: x0..x4 only
    assert len({p.x for p in first}) < len({p.x for p in spread_sample(rows, 12)})
    with pytest.raises(ValueError, match="eval_rows"):
        spread_sample(rows, -1)


# ---------------------------------------------------------------------------- controls and oracles of a grid


def test_controls_share_one_recipe_and_reset_what_a_given_z_cannot_see():
    base = {**TrainConfig().to_flat(), "steps": 50}
    pts = expand_grid(base, {"beta": [0.1, 0.3], "variant": [{"aid": "none"}, {"aid": "hard_em_then_soft", "n_latent": 6}]})
    out, links = with_controls(pts, {"strategy": 4})
    given = out[len(pts):]
    assert [p.run_id.split("_")[0] for p in given] == ["control", "oracle-strategy", "null-strategy"]  # one control
    c = given[0].params
    assert (c["latent_source"], c["n_latent"], c["beta"], c["aid"], c["steps"]) == ("control", 1, 0.0, "none", 50)
    assert set(links["controls"].values()) == {given[0].run_id}
    assert links["oracles"] == {given[1].run_id: {"label": "strategy", "n_values": 4, "control": given[0].run_id}}
    assert links["nulls"] == {given[1].run_id: given[2].run_id}
    assert given[2].params["latent_source"] == "null:strategy" and given[2].params["n_latent"] == 4
    assert {k: v for k, v in given[2].params.items() if k != "latent_source"} == \
        {k: v for k, v in given[1].params.items() if k != "latent_source"}  # the oracle's recipe, z permuted
    assert oracle_params(pts[0].params, "a*b", 6)["latent_source"] == "label:a*b"
    other = control_params({**pts[0].params, "weighting": "example", "epsilon": 0.05})
    assert other != c  # the weighting shapes the decoder's training: its own control


def test_every_seed_gets_its_control_and_its_oracles_seed_by_seed():
    """Seeds as the unit of evidence (issue 54): each seed trains the run, its own control and each
    oracle, linked within the seed, and the plan runs seed by seed."""
    base = {**TrainConfig().to_flat(), "steps": 50}
    pts = expand_grid(base, {"beta": [0.1, 0.3], "seed": [0, 1, 2]})
    out, links = with_controls(pts, {"strategy": 4})
    assert [p.params["seed"] for p in out] == [0] * 5 + [1] * 5 + [2] * 5  # 2 runs, control, oracle, null per seed
    oracles = {o: link for o, link in links["oracles"].items()}
    assert len(oracles) == 3
    by_id = {p.run_id: p.params for p in out}
    for o, link in oracles.items():
        assert by_id[o]["seed"] == by_id[link["control"]]["seed"]  # the oracle's control is its own seed's
    for run, control in links["controls"].items():
        assert by_id[run]["seed"] == by_id[control]["seed"]


def test_oracle_arms_in_the_grid_get_their_own_recipes_control_and_null():
    """Issue 55's decisive design: oracle arms written as grid points (as shipped: one global clip, K own
    vectors; decoupled: the probe clipped on its own, K deltas on one shared vector), each linked to the
    control of its own recipe and given its null on that recipe; the oracle-only field router_clip is kept
    by the oracle and its null, reset in the control (a one-value router has no gradient)."""
    base = {**TrainConfig().to_flat(), "steps": 50}
    arms = [{"router_clip": "global", "latent_capacity": "per_value"},
            {"router_clip": "own", "latent_capacity": "shared_delta"}]
    pts = expand_grid(base, {"arm": [{**a, "latent_source": "label:complete", "n_latent": 2} for a in arms],
                             "seed": [0, 1]})
    out, links = with_controls(pts, {})
    by_id = {p.run_id: p.params for p in out}
    assert len(out) == 12 and set(links["oracles"]) == set(links["nulls"]) == {p.run_id for p in pts}
    assert len({link["control"] for link in links["oracles"].values()}) == 4  # one per arm and seed
    for o, link in links["oracles"].items():
        oracle, control, null = by_id[o], by_id[link["control"]], by_id[links["nulls"][o]]
        assert link == {"label": "complete", "n_values": 2, "control": link["control"]}
        assert (control["latent_source"], control["n_latent"], control["router_clip"]) == ("control", 1, "own")
        assert control["latent_capacity"] == oracle["latent_capacity"] and control["seed"] == oracle["seed"]
        assert null == {**oracle, "latent_source": "null:complete"}  # the oracle's own recipe, z permuted
    assert [p.params["seed"] for p in out] == [0] * 6 + [1] * 6
    # an oracle built from a run keeps the run's router_clip; its control does not need it
    run = {**base, "router_clip": "global", "latent_capacity": "shared_delta"}
    assert oracle_params(run, "complete", 2)["router_clip"] == null_params(run, "complete", 2)["router_clip"] == "global"
    assert control_params(run)["router_clip"] == "own" and control_params(run)["latent_capacity"] == "shared_delta"


def test_y_words_is_a_derived_label_named_only_where_a_study_asks_for_it():
    rows = [Pair("1", "x", " ".join(["w"] * 20)), Pair("2", "x", " ".join(["w"] * 21), labels={"a": "u"}),
            Pair("3", "x", " ".join(["w"] * 27), labels={"a": "v"}), Pair("4", "x", "one", labels={"y_words": "own"})]
    assert [label_value(p, "y_words") for p in rows] == ["1-20", "21-26", "27+", "own"]  # a row's own label wins
    assert label_value(rows[1], "a*y_words") == "u*21-26"
    assert "y_words" not in label_keys_of(rows[1:3])  # never among the labels every row carries


def test_the_null_oracle_permutes_the_label_over_the_rows(tiny_run):
    """z := another row's value: the same marginal (a permutation of the true values), seeded by the run's
    seed, and independent of the row (most rows get another value than their own)."""
    from collections import Counter

    from zfree.data.pairs import load_pairs
    from zfree.train.given import given_index

    data, base = tiny_run
    rows = {s: load_pairs(data / f"{s}.jsonl") for s in ("train", "val")}
    flat = {**TrainConfig().to_flat(), "data_dir": str(data), "base_dir": str(base)}
    n = oracle_labels(data)["strategy"]
    true = given_index(TrainConfig.from_flat(oracle_params(flat, "strategy", n)), rows, data)
    null = given_index(TrainConfig.from_flat(null_params(flat, "strategy", n)), rows, data)
    assert null.keys() == true.keys() and Counter(null.values()) == Counter(true.values())
    assert np.mean([null[i] == true[i] for i in true]) < 0.5
    again = given_index(TrainConfig.from_flat(null_params(flat, "strategy", n)), rows, data)
    other = given_index(TrainConfig.from_flat({**null_params(flat, "strategy", n), "seed": 1}), rows, data)
    assert again == null and other != null


def test_an_oracles_folder_name_is_safe_for_any_label_and_short_ascii_ones_keep_todays(tmp_path):
    """issue 61: a 300-character label key made the oracle's run folder name 300+ bytes ("File name too
    long"). Short ASCII labels keep today's names (existing studies resume); a long or non-ASCII label is
    named by its hash, ASCII and short; the label itself stays in the config (``latent_source``)."""
    from zfree_lab.experiment.spec import run_id

    base = TrainConfig().to_flat()

    def today(label: str) -> str:  # the oracle's folder name less its "_<weighting>_<hash>"
        return run_id(oracle_params(base, label, 3)).rsplit("_", 2)[0]

    assert [today(k) for k in ("strategy", "first slot", "a*b", "n_sentences.v2")] == \
        ["oracle-strategy", "oracle-first-slot", "oracle-axb", "oracle-n_sentences.v2"]
    labels = ["k" * 300, "k" * 299 + "j", "größe", "groesse", "первая_метка" * 7, "中文标签" * 20, "ラベル"]
    names = [run_id(oracle_params(base, k, 3)) for k in labels]
    assert len(set(names)) == len(names) and all(n.isascii() and n.startswith("oracle-") for n in names), names
    assert max(len(n) for n in names) <= 100, names
    for k, n in zip(labels, names):
        (tmp_path / "runs" / n).mkdir(parents=True)  # the file system takes it
        assert TrainConfig.from_flat(oracle_params(base, k, 3)).model.latent_source == f"label:{k}"


# ---------------------------------------------------------------------------- gains


def test_interval_is_the_mean_with_a_bootstrap_interval():
    rng = np.random.default_rng(0)
    d = rng.normal(1.0, 1.0, 400)
    est, lo, hi = interval(d)
    assert est == pytest.approx(d.mean()) and lo < est < hi
    assert hi - lo == pytest.approx(2 * 1.96 / 20, rel=0.2)  # ~ 2 * 1.96 * sd / sqrt(n)
    assert interval(np.full(5, 2.0)) == (2.0, 2.0, 2.0)


def _fake_run(runs, rid, lbar, kl, summary):
    d = runs / rid
    d.mkdir(parents=True)
    n = len(lbar)
    pd.DataFrame({"id": [f"r{i}" for i in range(n)], "n_tokens": np.full(n, 10), "lbar": lbar, "kl": kl,
                  "b": np.full(n, 1.0), "beta_eff": np.full(n, 0.2)}).to_parquet(d / "per_example.parquet")
    (d / "summary.json").write_text(json.dumps({"weighting": "plain", "beta": 0.1, **summary}))
    (d / "config.json").write_text(json.dumps({"data_dir": str(runs.parent / "data")}))


def test_gains_against_the_control_and_the_oracle(tmp_path):
    runs = tmp_path / "runs"
    n = 60
    data = tmp_path / "data"
    data.mkdir()
    row = lambda i, v: json.dumps({"id": i, "x": "x", "y": "y", "labels": {"a": v}}) + "\n"  # noqa: E731
    (data / "train.jsonl").write_text("".join(row(f"t{i}", "uvw"[i % 3]) for i in range(30)))
    (data / "val.jsonl").write_text("".join(row(f"r{i}", "uvw"[i % 3]) for i in range(n)))
    _fake_run(runs, "control_plain_1", np.full(n, 0.9), np.zeros(n), {"latent_source": "control"})
    _fake_run(runs, "oracle-a_plain_2", np.full(n, 0.7), np.full(n, 1.0), {"latent_source": "label:a"})
    _fake_run(runs, "plain_beta0.1_3", np.linspace(0.75, 0.85, n), np.full(n, 0.5), {"latent_used": True})
    (tmp_path / LINKS_FILE).write_text(json.dumps({"controls": {"plain_beta0.1_3": "control_plain_1"},
                                                   "oracles": {"oracle-a_plain_2": {"label": "a", "n_values": 3,
                                                                                    "control": "control_plain_1"}}}))
    o = oracle_table(tmp_path)
    assert o.loc[0, "delta_R"] == pytest.approx(2.0) and o.loc[0, "H"] == pytest.approx(1.0)  # 10 * (0.9 - 0.7)
    assert o.loc[0, "eta"] == pytest.approx(2.0) and bool(o.loc[0, "distinguishable"])
    assert o.loc[0, "H_source"] == "router"  # 1.0 nats beats the marginal's log 3 (add-one smoothed: the same)
    assert o.loc[0, "finetune_gain"] == pytest.approx(1.0)  # 10 * (1.0 - 0.9)
    from zfree_lab.experiment.results import collect_runs

    g = run_gains(tmp_path, collect_runs(runs), o).iloc[0]
    assert g["z_gain"] == pytest.approx(10 * (0.9 - 0.8)) and g["z_gain_lo"] > 0 and bool(g["z_used"])
    assert g["gain_share"] == pytest.approx(0.5) and g["best_label"] == "a"
    assert g["predicted_use_fraction_eta"] == 1.0  # beta_eff 0.2 < eta 2
    assert len(collect_runs(runs)) == 1 and len(collect_runs(runs, "given")) == 2


# ---------------------------------------------------------------------------- a real run


def test_a_control_and_an_oracle_train_and_read_one_at_step_0(tiny_run, tmp_path):
    data, base = tiny_run
    for src, k in (("control", 1), ("label:strategy", 4)):
        cfg = TrainConfig.from_flat(tiny_flat(data, base, latent_source=src, n_latent=k, beta=0.0))
        s = train_cvae(cfg, tmp_path / src.replace(":", "-"), progress=False)
        rows = [json.loads(x) for x in (tmp_path / src.replace(":", "-") / "metrics.jsonl").read_text().splitlines()]
        assert rows[0]["loss/val/baseline_normalized_reconstruction_loss"] == pytest.approx(1.0, abs=2e-6)
        assert s["reference/c_eval"] == pytest.approx(float(pd.read_parquet(
            tmp_path / src.replace(":", "-") / "per_example.parquet")["b"].mean()))
        assert s["latent/codes_used"] == (1 if src == "control" else 4) or src != "control"
    cfg = TrainConfig.from_flat(tiny_flat(data, base, latent_source="label:strategy", n_latent=3, beta=0.0))
    with pytest.raises(ValueError, match="n_latent=3 but label 'strategy' takes 4 values"):
        train_cvae(cfg, tmp_path / "bad", progress=False)


def test_evaluating_less_often_does_not_change_a_control(tiny_run, tmp_path):
    """control_params evaluates a control at step 0 and the end only: the same final numbers as
    evaluating every 2 steps (evaluation draws from its own seeded generators)."""
    data, base = tiny_run
    finals = []
    for every in (2, 4):
        cfg = TrainConfig.from_flat(tiny_flat(data, base, latent_source="control", n_latent=1, beta=0.0, eval_every=every))
        finals.append(train_cvae(cfg, tmp_path / f"every{every}", progress=False))
    for key in ("loss/val/reconstruction_loss", "task/correctness", "loss/val/baseline_normalized_reconstruction_loss"):
        assert finals[0][key] == finals[1][key], key


def test_an_evaluation_batch_is_bounded_by_the_logit_budget(tiny_run, monkeypatch, tmp_path):
    """Large vocabularies: fewer rows per evaluation batch (zfree_lab.run.metrics.EVAL_LOGIT_ELEMENTS),
    the same per-example numbers up to float32 rounding (other padding per batch)."""
    from zfree_lab.run import metrics

    data, base = tiny_run
    cfg = TrainConfig.from_flat(tiny_flat(data, base, steps=2, eval_every=2))
    a = train_cvae(cfg, tmp_path / "a", progress=False)
    monkeypatch.setattr(metrics, "EVAL_LOGIT_ELEMENTS", 4 * 10 * 20)  # a few rows a batch
    b = train_cvae(cfg, tmp_path / "b", progress=False)
    for key in ("loss/val/reconstruction_loss", "loss/val/kl_prior_loss", "latent/codes_used"):
        assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), key  # float32, other padding


def test_every_train_config_field_is_classified_for_the_control_exactly_once():
    """A TrainConfig field that is neither reset nor shared by a run's z-free control fails here
    (a new aid field left out of _RESET would give each run its own control, silently)."""
    from zfree.config import TrainConfig
    from zfree_lab.experiment.controls import _RESET, SHARED

    flat = set(TrainConfig().to_flat())
    assert not set(_RESET) & set(SHARED), set(_RESET) & set(SHARED)
    assert flat - set(_RESET) - set(SHARED) == set(), "classify these fields in zfree_lab.experiment.controls"
    assert set(_RESET) | set(SHARED) <= flat, (set(_RESET) | set(SHARED)) - flat


def test_a_run_trained_into_the_study_later_is_paired_with_its_recipes_control(tmp_path):
    """A variant not in controls.json (``zfree train --config <run>/config.json --set ... --out
    <study>/runs/variant-...``) gets the finished control whose config is its recipe's control; a
    control of another recipe (another backbone rate) is not taken, and a control written before a
    later field existed (no ``word_dropout`` key) still matches."""
    runs = tmp_path / "runs"
    n = 40
    flat = {**TrainConfig().to_flat(), "beta": 0.1, "aid": "hard_em_then_soft", "n_latent": 4}
    variant = {**flat, "handover_margin": 0.9}
    old_control = {k: v for k, v in control_params(flat).items() if k != "word_dropout"}
    other = {**control_params(flat), "lr_backbone": flat["lr_backbone"] * 3}
    _fake_run(runs, "a_control_of_another_recipe", np.full(n, 0.5), np.zeros(n), {"latent_source": "control"})
    _fake_run(runs, "control_plain_1", np.full(n, 0.9), np.zeros(n), {"latent_source": "control"})
    _fake_run(runs, "variant-late", np.full(n, 0.8), np.full(n, 0.5), {"latent_used": True})
    for rid, cfg in (("a_control_of_another_recipe", other), ("control_plain_1", old_control), ("variant-late", variant)):
        (runs / rid / "config.json").write_text(json.dumps(cfg))
    from zfree_lab.experiment.results import collect_runs

    g = run_gains(tmp_path, collect_runs(runs), pd.DataFrame()).iloc[0]
    assert g["run_id"] == "variant-late" and g["control_run_id"] == "control_plain_1"
    assert g["z_gain"] == pytest.approx(10 * (0.9 - 0.8))
