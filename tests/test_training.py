"""CVAE training on a tiny base run: the run folder contract, bad input, no overwrite."""

from __future__ import annotations

import hashlib
import json
import math
import shutil

import pandas as pd
import pytest
import torch

from tests.tiny import poison_loss_at, tiny_flat
from zfree.config import TrainConfig
from zfree.core.io import read_json, read_jsonl
from zfree_lab.run.run_folder import NonFiniteLossError
from zfree_lab.run.training import train_cvae


@pytest.fixture(scope="module")
def tiny(tiny_run):
    return tiny_run


def _cfg(data, base, **kw):
    return TrainConfig.from_flat(tiny_flat(data, base, **{"steps": 6, "eval_every": 3, "device": "cpu", **kw}))


def test_run_folder_contract_and_step0_equivalence(tiny, tmp_path):
    data, base = tiny
    s = train_cvae(_cfg(data, base, weighting="distribution", beta=0.3), tmp_path / "run", progress=False)
    run = tmp_path / "run"
    for f in ("config.json", "metrics.jsonl", "summary.json", "per_example.parquet", "checkpoint/model.safetensors"):
        assert (run / f).exists(), f
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 3, 6]
    # step 0: zero latent injection -> the decoder is the base model: rho_recon = 1 exactly
    ref = read_json(base / "reference" / "reference.json")
    b = pd.read_parquet(base / "reference" / "per_example.parquet").set_index("id")["b"]
    pe0 = rows[0]
    evaluated = pd.read_parquet(run / "per_example.parquet")["id"]  # the seeded spread sample of 24 rows
    assert len(evaluated) == 24 and list(evaluated) != list(b.index[:24])
    assert pe0["loss/val/zfree_reconstruction_loss"] == pytest.approx(b.loc[evaluated].mean(), abs=1e-6)
    assert pe0["loss/val/reconstruction_loss"] == pytest.approx(b.loc[evaluated].mean(), abs=1e-6)
    assert pe0["reference/c_eval"] == pytest.approx(b.loc[evaluated].mean())
    assert pe0["loss/val/baseline_normalized_reconstruction_loss"] == pytest.approx(1.0, abs=2e-6)
    assert pe0["reference/c_base"] == pytest.approx(ref["c_base"])
    for key in ("loss/val/reconstruction_loss", "loss/val/baseline_normalized_reconstruction_loss",
                "loss/val/kl_prior_loss", "loss_contrib/fraction_abs/reconstruction_loss",
                "loss_contrib/fraction_abs/kl_prior_loss", "structure/alignment_nmi", "task/correctness",
                "latent/oracle_rho", "latent/q_max_mean", "latent/codes_used", "objective/beta_eff_median"):
        assert key in s, key
    pe = pd.read_parquet(run / "per_example.parquet")
    for col in ("id", "strategy", "n_tokens", "b", "lbar", "rho_i", "kl", "beta_eff", "weight", "posterior_argmax"):
        assert col in pe, col
    # beta_eff = beta * |S| / w with w = 1 / c_base (docs/concepts/theory.md)
    assert (pe["beta_eff"] - 0.3 * pe["n_tokens"] * ref["c_base"]).abs().max() < 1e-4
    cfg = read_json(run / "config.json")
    assert TrainConfig.from_flat({k: v for k, v in cfg.items() if not k.startswith("_")}).objective.beta == 0.3


def test_finished_run_is_never_rewritten(tiny, tmp_path):
    data, base = tiny
    run = tmp_path / "run"
    train_cvae(_cfg(data, base), run, progress=False)
    before = (run / "summary.json").read_bytes(), (run / "metrics.jsonl").read_bytes()
    train_cvae(_cfg(data, base), run, progress=False)
    assert ((run / "summary.json").read_bytes(), (run / "metrics.jsonl").read_bytes()) == before


def test_base_run_without_reference_is_a_clear_error(tiny, tmp_path):
    data, base = tiny
    broken = tmp_path / "base"
    shutil.copytree(base, broken)
    shutil.rmtree(broken / "reference")
    with pytest.raises(FileNotFoundError, match="reference.json"):
        train_cvae(_cfg(data, broken), tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "summary.json").exists()


@pytest.mark.parametrize("bad", [0.0, -1.0, None, "nan"])
def test_non_positive_or_missing_c_base_is_a_clear_error(tiny, tmp_path, bad):
    data, base = tiny
    broken = tmp_path / "base"
    shutil.copytree(base, broken)
    ref = read_json(broken / "reference" / "reference.json")
    ref["c_base"] = float(bad) if bad == "nan" else bad
    (broken / "reference" / "reference.json").write_text(json.dumps(ref).replace("NaN", '"nan"'))
    with pytest.raises(ValueError, match="c_base"):
        train_cvae(_cfg(data, broken, weighting="distribution"), tmp_path / "run", progress=False)


def test_a_stale_stored_reference_stops_the_run_at_step_0(tiny, tmp_path):
    """The entangled-run reference is checked, not trusted: b scaled by 1.02 (consistent c_base, hashes
    intact: what other scoring code leaves behind) stops the run at its first evaluation with one
    line naming reference.json and the difference; nothing is recorded as a result."""
    from zfree.core.errors import InputError
    from zfree.core.io import atomic_write_json, atomic_write_parquet

    data, base = tiny
    stale = tmp_path / "base"
    shutil.copytree(base, stale)
    ref_dir = stale / "reference"
    pe = pd.read_parquet(ref_dir / "per_example.parquet")
    pe["b"] = pe["b"] * 1.02
    atomic_write_parquet(ref_dir / "per_example.parquet", pe)
    meta = read_json(ref_dir / "reference.json")
    meta["c_base"] = float(pe["b"].mean())
    atomic_write_json(ref_dir / "reference.json", meta)
    with pytest.raises(InputError, match=r"reference\.json: step-0 rho_recon is 0\.98\d+, not 1 within 0\.001"):
        train_cvae(_cfg(data, stale), tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "summary.json").exists() and not (tmp_path / "run" / "metrics.jsonl").exists()
    # the shipped one reads 1 at step 0 (the check passes on a reference the code reproduces)
    train_cvae(_cfg(data, base, steps=1, eval_every=1), tmp_path / "ok", progress=False)
    rho0 = read_jsonl(tmp_path / "ok" / "metrics.jsonl")[0]["loss/val/baseline_normalized_reconstruction_loss"]
    assert abs(rho0 - 1) < 1e-5


def test_missing_data_folder_names_the_file(tiny, tmp_path):
    data, base = tiny
    with pytest.raises(FileNotFoundError, match="train.jsonl"):
        train_cvae(_cfg(tmp_path / "nope", base), tmp_path / "run", progress=False)


def _strip_timing(s: dict) -> dict:
    from zfree_lab.run.run_folder import TIMING_KEYS

    return {k: v for k, v in s.items() if k not in TIMING_KEYS}


def test_resume_gives_the_uninterrupted_summary(tiny, tmp_path):
    """Stopped after a checkpoint and resumed, a run (hard EM, restarts, hand-over gate included)
    ends with the same summary as an uninterrupted one, timing aside."""
    data, base = tiny
    cfg = _cfg(data, base, steps=8, eval_every=4, aid="hard_em_then_soft", handover_check_every=2, hard_em_max_steps=4,
               restart_dead_every=2, handover_rows=16, weighting="distribution", beta=0.3, checkpoint_every=1)
    full = train_cvae(cfg, tmp_path / "full", progress=False)
    assert train_cvae(cfg, tmp_path / "res", progress=False, stop_after=5) == {"stopped_at": 5}
    assert not (tmp_path / "res" / "summary.json").exists()
    resumed = train_cvae(cfg, tmp_path / "res", progress=False)
    assert _strip_timing(resumed) == _strip_timing(full)
    assert [r["step"] for r in read_jsonl(tmp_path / "res" / "metrics.jsonl")] == [0, 4, 8]
    # where a run is, while it trains (written every PROGRESS_EVERY_S and at the last step)
    progress = json.loads((tmp_path / "res" / "progress.json").read_text())
    assert progress["step"] == progress["steps"] == 8 and progress["eta_s"] == 0 and progress["phase"] in ("hard", "soft")


def test_resume_folder_of_another_config_is_refused(tiny, tmp_path):
    data, base = tiny
    train_cvae(_cfg(data, base, steps=6), tmp_path / "run", progress=False, stop_after=3)
    with pytest.raises(ValueError, match="beta"):
        train_cvae(_cfg(data, base, steps=6, beta=0.5), tmp_path / "run", progress=False)


def test_hard_em_records_the_gate_and_hands_over(tiny, tmp_path):
    data, base = tiny
    s = train_cvae(_cfg(data, base, steps=6, aid="hard_em_then_soft", handover_check_every=2, hard_em_max_steps=4,
                        handover_rows=16, weighting="distribution", beta=0.3), tmp_path / "run", progress=False)
    gate = s["aid/gate"]
    assert [g["step"] for g in gate][:2] == [2, 4] or gate[0]["pass"]
    for g in gate:  # distribution weighting: the gate is oracle_rho + beta * log K < 1 (w = 1/c_base)
        assert g["best_objective"] == pytest.approx(g["oracle_rho"] + 0.3 * math.log(4), rel=1e-6)
        assert g["collapsed_objective"] == pytest.approx(1.0, rel=1e-6) or g["collapsed_objective"] > 0
        assert g["pass"] == (g["best_objective"] < g["collapsed_objective"])
    assert s["aid/handover_step"] is not None and s["aid/handover_step"] <= 4
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert rows[-1]["aid/phase_soft"] == 1.0  # the final evaluation is under the true objective, after hand-over


@pytest.mark.parametrize("eval_rows, split", [(24, "val"), (48, "train")])
def test_the_gate_reads_rows_that_are_never_evaluated(tiny, tmp_path, monkeypatch, eval_rows, split):
    """Issue 54, item 4: the rows the hand-over gate actually reads (recorded at each call) and no
    evaluation row (per_example.parquet's ids) are disjoint; config.json lists them and summary.json
    their split, count and sha256. The tiny benchmark has 48 validation rows: 24 evaluated leave 24
    for 16 gate rows; 48 evaluated leave none, so the gate reads 16 training rows. Before the gate
    split, it read the first 16 evaluation rows."""
    from zfree.train import aids

    seen, gate = [], aids.handover_gate

    def recording_gate(model, encoded, b, *a, **k):
        seen.append([e.id for e in encoded])
        assert len(b) == len(encoded)
        return gate(model, encoded, b, *a, **k)

    monkeypatch.setattr(aids, "handover_gate", recording_gate)
    data, base = tiny
    run = tmp_path / "run"
    s = train_cvae(_cfg(data, base, steps=4, eval_every=2, eval_rows=eval_rows, aid="hard_em_then_soft",
                        handover_check_every=2, hard_em_max_steps=4, handover_rows=16, weighting="distribution",
                        beta=0.3), run, progress=False)
    evaluated = set(pd.read_parquet(run / "per_example.parquet")["id"])
    assert len(evaluated) == eval_rows and seen
    for ids in seen:
        assert len(ids) == 16 and not set(ids) & evaluated
        assert all(i.startswith(split) for i in ids)  # the benchmark's ids: val-000000, train-000000
    sha = hashlib.sha256("\n".join(seen[0]).encode()).hexdigest()  # the ids in gate order, one a line
    assert read_json(run / "config.json")["_gate_rows"] == {"split": split, "rows": 16, "ids": seen[0], "ids_sha256": sha}
    assert (s["aid/gate_split"], s["aid/gate_rows"], s["aid/gate_ids_sha256"]) == (split, 16, sha)


def test_non_finite_loss_stops_with_step_and_batch(tiny, tmp_path, monkeypatch):
    data, base = tiny
    poison_loss_at(monkeypatch, 3)
    with pytest.raises(NonFiniteLossError, match="step 3"):
        train_cvae(_cfg(data, base), tmp_path / "run", progress=False)
    err = read_json(tmp_path / "run" / "error.json")
    assert err["step"] == 3 and len(err["batch_ids"]) == 8 and "kl_prior_loss" in err["non_finite_terms"]


def _same_beta_over_w(tiny, tmp_path, optimizer, lr_new):
    """plain at beta * c_base against distribution at beta: the same beta/w (docs/concepts/weightings.md)."""
    data, base = tiny
    c_base = read_json(base / "reference" / "reference.json")["c_base"]
    kw = dict(steps=6, eval_every=6, grad_clip=0.0, weight_decay=0.0, decode_rows=0, optimizer=optimizer,
              lr_new=lr_new, lr_backbone=lr_new / 10)
    a = train_cvae(_cfg(data, base, weighting="plain", beta=0.3 * c_base, **kw), tmp_path / f"{optimizer}-p", progress=False)
    b = train_cvae(_cfg(data, base, weighting="distribution", beta=0.3, **kw), tmp_path / f"{optimizer}-d", progress=False)
    keys = ("loss/val/kl_prior_loss", "loss/val/reconstruction_loss", "latent/q_max_mean", "latent/oracle_rho")
    return {k: (a[k], b[k]) for k in keys}


def test_adam_trains_identically_along_constant_beta_over_w(tiny, tmp_path):
    """Adam is invariant to the loss scale (up to its eps), so the seed's global rescaling is a change
    of beta: the two runs agree to 1e-4 relative; under SGD the same pair does not."""
    adam = _same_beta_over_w(tiny, tmp_path, "adamw", 1e-2)
    for k, (a, b) in adam.items():
        assert a == pytest.approx(b, rel=1e-4, abs=1e-6), k
    sgd = _same_beta_over_w(tiny, tmp_path, "sgd", 1.0)
    assert any(abs(a - b) > 1e-3 * max(abs(a), abs(b), 1e-6) for a, b in sgd.values()), sgd


def test_resume_on_a_changed_base_model_is_refused(tiny, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    data, base = tiny
    mine = tmp_path / "base"
    shutil.copytree(base, mine)
    cfg = _cfg(data, mine, steps=6, c_base_source="pretrained_source")
    train_cvae(cfg, tmp_path / "run", progress=False, stop_after=3)
    m = AutoModelForCausalLM.from_pretrained(mine / "model", local_files_only=True)
    with torch.no_grad():
        next(m.parameters()).add_(0.01)
    m.save_pretrained(mine / "model")
    with pytest.raises(ValueError, match="refusing to resume"):
        train_cvae(cfg, tmp_path / "run", progress=False)


def test_rows_longer_than_the_context_are_cut_like_the_reference_or_refused(tiny, tmp_path, capsys):
    """A y that does not fit the base model's context is an error naming the row; a long x is cut
    from the left (as the z-free reference scorer does) and said, never a crash inside the model."""
    data, base = tiny
    n_ctx = read_json(base / "model" / "config.json")["n_positions"]
    for name, x, y, ok in (("long_x", "1 " * (n_ctx + 5), "2 3", True), ("long_y", "1 2", "3 " * (n_ctx + 5), False)):
        d = tmp_path / name
        shutil.copytree(data, d)
        with open(d / "train.jsonl", "a") as f:
            f.write(json.dumps({"id": f"row-{name}", "x": x.strip(), "y": y.strip(), "strategy": None}) + "\n")
        cfg = _cfg(d, base, steps=2, eval_every=2)
        if ok:
            train_cvae(cfg, tmp_path / f"run-{name}", progress=False)
            assert "1 train rows had x cut from the left" in capsys.readouterr().out
        else:
            with pytest.raises(ValueError, match=f"row-{name}.*does not fit"):
                train_cvae(cfg, tmp_path / f"run-{name}", progress=False)


def test_hard_phase_reconstruction_scale_does_not_depend_on_the_weighting_scale(tiny):
    """hard_em_recon_scale='c_base': plain and distribution run the same hard phase (weight 1/c_base);
    'weighting': plain's reconstruction term is c_base times distribution's."""
    import torch

    from zfree.data.batching import collate, encode_pair, pad_id_of
    from zfree.data.pairs import load_pairs
    from zfree.models.base import load_base
    from zfree.models.discrete import DiscreteCVAE
    from zfree.objective.objectives import hard_em_objective

    data, base = tiny
    backbone, tok = load_base(base / "model")
    torch.manual_seed(0)
    model = DiscreteCVAE(backbone, 3)
    batch = collate([encode_pair(tok, p) for p in load_pairs(data / "val.jsonl")[:8]], pad_id=pad_id_of(tok))
    c_base = 0.4
    rec = {}
    for scale in ("c_base", "weighting"):
        for w in ("plain", "distribution"):
            cfg = _cfg(data, base, weighting=w, aid="hard_em_then_soft", hard_em_decoder="best", hard_em_recon_scale=scale)
            br = hard_em_objective(model, batch, cfg, 0, c_base, None)
            rec[scale, w] = br.contributions["hard_reconstruction"].item()
    assert rec["c_base", "plain"] == pytest.approx(rec["c_base", "distribution"], rel=1e-6)
    assert rec["weighting", "plain"] == pytest.approx(c_base * rec["weighting", "distribution"], rel=1e-6)
    assert rec["weighting", "distribution"] == pytest.approx(rec["c_base", "distribution"], rel=1e-6)
    with pytest.raises(ValueError, match="hard_em_recon_scale"):
        _cfg(data, base, hard_em_recon_scale="mean")


def test_frozen_decoder_phase_updates_only_the_posterior_side(tiny, tmp_path):
    from safetensors.torch import load_file

    data, base = tiny
    s0 = train_cvae(_cfg(data, base, steps=2, eval_every=2, frozen_decoder_steps=2, lr_new=0.05), tmp_path / "frozen",
                    progress=False)
    assert s0["frozen_decoder_steps"] == 2
    after = load_file(str(tmp_path / "frozen" / "checkpoint" / "model.safetensors"))
    base_w = load_file(str(base / "model" / "model.safetensors"))
    moved = {k for k in after if k.startswith(("posterior_head", "router_head", "latent_embedding"))
             and float(after[k].abs().max()) > 0 and k.endswith("bias")}
    assert moved == {"posterior_head.bias"}  # router and latent embedding stay at their zero init
    assert float(after["latent_embedding.weight"].abs().max()) == 0.0
    # the backbone is untouched: the finished run's record compared every body weight with the base's
    # (and, the base's, the body is not kept: issue 59 item 5)
    from zfree_lab.run.checkpoint_io import load_plain_state

    assert load_plain_state(tmp_path / "frozen" / "checkpoint")["finished"]["body"] == "the base's"
    assert base_w and not [k for k in after if k.startswith("backbone.")]


def test_a_finished_run_keeps_its_own_tensors_and_trained_body_not_the_optimizer(tiny, tmp_path):
    """Issue 59 item 5: a finished full fine-tune is never resumed (its summary is returned), so its
    checkpoint keeps the run's own tensors (latent embedding, router, posterior), its trained body (the
    only copy: the CVAE stays loadable) and its TrainState, and drops the optimizer's moments and the RNG
    states, saying so; an
    interrupted run keeps its whole last checkpoint and resumes to the uninterrupted summary;
    keep_prev_checkpoint keeps both whole."""
    from safetensors.torch import load_file

    from zfree_lab.run.checkpoint_io import load_plain_state
    from zfree_lab.run.checkpoint_parts import disk_use

    data, base = tiny
    cfg = _cfg(data, base, weighting="distribution", beta=0.3)
    assert train_cvae(cfg, tmp_path / "run", progress=False, stop_after=3) == {"stopped_at": 3}
    ck = tmp_path / "run" / "checkpoint"
    whole = load_file(str(ck / "model.safetensors"))
    assert any(k.startswith("backbone.") for k in whole) and "optimizer" in load_plain_state(ck)  # resumable
    interrupted = disk_use(tmp_path / "run")[1]
    s = train_cvae(cfg, tmp_path / "run", progress=False)
    kept = load_file(str(ck / "model.safetensors"))
    assert set(kept) == set(whole) and "latent_embedding.weight" in kept  # own tensors and the trained body
    state = load_plain_state(ck)
    assert set(state) == {"state", "finished"} and state["state"]["step"] == 6
    assert state["finished"]["body"] == "trained" and "the trained body" in state["finished"]["kept"]
    assert "optimizer" in state["finished"]["dropped"]
    assert not load_file(str(ck / "state.safetensors")) and not (tmp_path / "run" / "checkpoint.prev").exists()
    total, ckpt = disk_use(tmp_path / "run")
    assert 0 < ckpt < interrupted / 2 and total > ckpt  # no optimizer moments, no previous checkpoint
    assert train_cvae(cfg, tmp_path / "run", progress=False) == s  # finished: nothing to resume, the summary
    uninterrupted = train_cvae(cfg, tmp_path / "once", progress=False)
    assert _strip_timing(uninterrupted) == _strip_timing(s)
    kept_once = load_file(str(tmp_path / "once" / "checkpoint" / "model.safetensors"))
    assert all(torch.equal(kept_once[k], v) for k, v in kept.items())
    both = tmp_path / "both"
    assert train_cvae(_cfg(data, base, weighting="distribution", beta=0.3, keep_prev_checkpoint=True), both,
                      progress=False)
    assert "optimizer" in load_plain_state(both / "checkpoint") and (both / "checkpoint.prev").is_dir()
    assert any(k.startswith("backbone.") for k in load_file(str(both / "checkpoint" / "model.safetensors")))


def test_index_collapse_is_warned(tiny, tmp_path, capsys, monkeypatch):
    import zfree_lab.run.training as T

    real = T.evaluate

    def one_value_takes_all(*a, **kw):
        ev = real(*a, **kw)
        ev.metrics["latent/max_usage"] = 0.95
        return ev

    monkeypatch.setattr(T, "evaluate", one_value_takes_all)
    data, base = tiny
    s = train_cvae(_cfg(data, base, steps=2, eval_every=2), tmp_path / "ix", progress=False)
    assert "index collapse" in capsys.readouterr().out
    usage = [s[f"latent/usage/{k}"] for k in range(s["n_latent"])]
    assert sum(usage) == pytest.approx(1.0) and all(0 <= u <= 1 for u in usage)


@pytest.mark.parametrize("aid", ["none", "hard_em_then_soft"])
def test_optimal_posterior_trains_and_is_evaluated_with_its_own_q(tiny, tmp_path, aid):
    """posterior_features='optimal': no posterior head; the run's per-example q is the optimal
    posterior of the evaluated decoders (its argmax is the oracle value when beta is small)."""
    data, base = tiny
    s = train_cvae(_cfg(data, base, aid=aid, posterior_features="optimal", weighting="distribution", beta=0.01,
                        handover_check_every=2, hard_em_max_steps=2, handover_rows=16, n_latent=3),
                   tmp_path / "run", progress=False)
    pe = pd.read_parquet(tmp_path / "run" / "per_example.parquet")
    assert math.isfinite(s["loss/val/kl_prior_loss"])
    # J(q*) <= J(one-hot on the best value) gives lbar - min_k r_k <= (beta / w) * (-log p_min); the
    # router is near uniform after 6 steps, so (beta * c_base) * 2 log K bounds it (an amortized head
    # near uniform at these decoders sits at the mean over values instead)
    gap = pe["lbar"] - pe["oracle_nll"]
    assert (gap >= -1e-5).all()
    assert gap.max() <= 0.01 * s["reference/c_base"] * 2 * math.log(3)


def test_optimal_posterior_needs_the_discrete_latent():
    with pytest.raises(ValueError, match="posterior_features='optimal'"):
        TrainConfig.from_flat({**TrainConfig().to_flat(), "latent_kind": "continuous", "posterior_features": "optimal"})


def test_evaluation_uses_the_optimal_posterior_of_the_evaluated_decoders(tiny):
    """With distinct decoders (random latent embeddings), the per-example q of ``evaluate`` is
    softmax(log p - w r / beta) recomputed from the model's own forward pass (not the zero logits)."""
    from zfree.config import ObjectiveConfig
    from zfree.data.batching import collate, encode_pair, pad_id_of
    from zfree.data.pairs import load_pairs
    from zfree.models.nll import masked_mean_token_nll
    from zfree.objective.losses import optimal_posterior_logits
    from zfree_lab.run.metrics import evaluate
    from zfree.models.base import load_base
    from zfree.models.discrete import DiscreteCVAE

    data, base = tiny
    torch.manual_seed(0)
    backbone, tok = load_base(base / "model")
    model = DiscreteCVAE(backbone, 3, "optimal").eval()
    with torch.no_grad():
        model.latent_embedding.weight.normal_(std=1.0)
    pairs = load_pairs(data / "val.jsonl")[:20]
    enc = [encode_pair(tok, p) for p in pairs]
    c_base, beta = 1.3, 0.05
    b = torch.full((len(pairs),), 1.0).numpy()
    ev = evaluate(model, enc, pairs, b=b, c_base=c_base, objective=ObjectiveConfig(weighting="distribution", beta=beta),
                  step=0, pad_id=pad_id_of(tok))
    with torch.no_grad():
        batch = collate(enc, pad_id=pad_id_of(tok))
        o = model(batch)
        r = masked_mean_token_nll(-o.target_logprobs, batch.target_mask)
        q = torch.softmax(optimal_posterior_logits(r, o.prior_logits, torch.full((len(pairs),), 1 / c_base), beta), -1)
    assert q.max(-1).values.mean() > 0.6  # the decoders differ: q is far from uniform (1/3)
    assert ev.per_example["posterior_argmax"].tolist() == q.argmax(-1).tolist()
    assert ev.per_example["q_max"].to_numpy() == pytest.approx(q.max(-1).values.numpy(), abs=1e-5)


def test_hard_phase_rate_of_the_heads_applies_until_the_handover(tiny, tmp_path, monkeypatch):
    """hard_em_lr_new (issue 15) sets the ``new`` group's rate in the hard phase only; 0 keeps lr_new."""
    from zfree.train import aids
    from zfree_lab.run import run_setup

    seen = []

    class Recording(torch.optim.AdamW):
        def step(self, closure=None):
            seen.append(self.param_groups[1]["lr"])
            return super().step(closure)

    monkeypatch.setitem(run_setup.OPTIMIZERS, "adamw", Recording)
    cfg = _cfg(data := tiny[0], tiny[1], steps=6, aid="hard_em_then_soft", handover_check_every=4,
               hard_em_max_steps=4, handover_rows=16, weighting="distribution", beta=0.3, lr_new=1e-3,
               hard_em_lr_new=5e-3)
    s = train_cvae(cfg, tmp_path / "run", progress=False)
    h = s["aid/handover_step"]
    assert data and h == 4 and seen == [5e-3] * h + [1e-3] * (6 - h)
    assert aids.new_lr(cfg.replace(hard_em_lr_new=0.0), "hard") == 1e-3
    with pytest.raises(ValueError, match="hard_em_lr_new"):
        cfg.replace(hard_em_lr_new=-1.0)


def test_the_training_curve_has_a_row_every_ten_steps_and_survives_resume(tiny, tmp_path):
    """curve.jsonl: window means of the training terms every CURVE_EVERY steps and at the end; the
    means over all rows (weighted by n) equal metrics.jsonl's interval mean; a resumed run keeps
    the rows up to its checkpoint and continues."""
    from zfree_lab.run.curve import read_curve

    data, base = tiny
    cfg = _cfg(data, base, steps=25, eval_every=25, checkpoint_every=10)
    run = tmp_path / "run"
    assert train_cvae(cfg, run, progress=False, stop_after=20) == {"stopped_at": 20}
    assert [r["step"] for r in read_curve(run)] == [10, 20]
    train_cvae(cfg, run, progress=False)
    rows = read_curve(run)
    assert [(r["step"], r["n"]) for r in rows] == [(10, 10), (20, 10), (25, 5)]
    key = "loss/train/reconstruction_loss"
    mean = sum(r[key] * r["n"] for r in rows) / 25
    last = read_jsonl(run / "metrics.jsonl")[-1]
    assert last[key] == pytest.approx(mean, rel=1e-9)


# ---------------------------------------------------------------------------- no hidden coupling (issue 55)


def _decoder_after_training(cfg, out, monkeypatch, probe_trained: bool) -> dict[str, torch.Tensor]:
    """Every parameter but the router's after ``train_cvae(cfg, out)``, the router/probe trained
    (``probe_trained``) or frozen at its zero start (its head built without gradient)."""
    from zfree_lab.run import run_setup

    built, real = [], run_setup.build_cvae

    def build(cfg, backbone):
        model = real(cfg, backbone)
        model.router_head.requires_grad_(probe_trained)
        built.append(model)
        return model

    monkeypatch.setattr(run_setup, "build_cvae", build)
    train_cvae(cfg, out, progress=False)
    return {n: p.detach().clone() for n, p in built[0].named_parameters() if not n.startswith("router_head.")}


#: float64 runs of 5 steps whose decoder must not see the router: a label oracle (the router a probe of
#: detached features, its cross-entropy in J at weight 1) under a clip that binds, with the whole backbone
#: or LoRA adapters over the frozen base training, and the hard phase of
#: the aided run under the optimal posterior (the router's cross-entropy toward k* at weight 1); and with
#: equal capacity (issue 55 item 2: the K values deltas on one shared vector) the oracle, the null oracle on
#: the memory route (its projection shared by every value) and the hard phase
_DECOUPLED_ARMS = {
    "oracle": {"latent_source": "label:strategy", "n_latent": 4, "beta": 0.0, "weighting": "example", "epsilon": 0.05},
    "oracle_lora": {"latent_source": "label:strategy", "n_latent": 4, "beta": 0.0, "lora_rank": 4, "lr_backbone": 1e-3},
    "hard_phase": {"aid": "hard_em_then_soft", "posterior_features": "optimal", "hard_em_decoder": "best",
                   "n_latent": 4, "weighting": "distribution", "beta": 0.3, "hard_em_max_steps": 50,
                   "handover_check_every": 50, "handover_rows": 16},
}
_DECOUPLED_ARMS.update({
    "oracle_shared_delta": {**_DECOUPLED_ARMS["oracle"], "latent_capacity": "shared_delta"},
    "null_shared_delta_memory": {**_DECOUPLED_ARMS["oracle"], "latent_source": "null:strategy",
                                 "latent_capacity": "shared_delta", "injection": "memory"},
    "hard_phase_shared_delta": {**_DECOUPLED_ARMS["hard_phase"], "latent_capacity": "shared_delta"},
})


@pytest.mark.parametrize("arm", sorted(_DECOUPLED_ARMS))
def test_the_router_cannot_move_the_decoder(tiny, tmp_path, monkeypatch, arm):
    """Issue 55's decisive test: in float64, the decoder's parameters (backbone, latent embeddings)
    after 5 steps are the same whether the router/probe trains or stays frozen: its gradient is
    clipped on its own (``router_clip='own'``), and the hard phase's router cross-entropy reaches
    the router head only (``hard_em_router_features='detached'``)."""
    data, base = tiny
    cfg = _cfg(data, base, steps=5, eval_every=5, eval_rows=16, decode_rows=0, precision="fp64", lr_new=1e-2,
               c_base_source="pretrained_source",  # b scored by the float64 model (the stored b are float32)
               grad_clip=0.05, **_DECOUPLED_ARMS[arm])
    trained = _decoder_after_training(cfg, tmp_path / "trained", monkeypatch, probe_trained=True)
    frozen = _decoder_after_training(cfg, tmp_path / "frozen", monkeypatch, probe_trained=False)
    assert trained.keys() == frozen.keys() and trained["latent_embedding.weight"].dtype == torch.float64
    moved = [n for n in trained if not torch.equal(trained[n], frozen[n])]
    torch.testing.assert_close(trained, frozen, rtol=1e-13, atol=1e-15, msg=lambda m: f"{arm}, moved {moved}: {m}")
    if "shared_delta" in arm:  # the shared vector is part of the decoder, and it trains (away from its zero start)
        assert trained["latent_shared"].shape == trained["latent_embedding.weight"].shape[1:]
        assert float(trained["latent_shared"].abs().max()) > 0


@pytest.mark.parametrize("arm,setting", [("oracle", {"router_clip": "global"}),
                                         ("oracle_shared_delta", {"router_clip": "global"}),
                                         ("hard_phase", {"hard_em_router_features": "attached"})])
def test_the_settings_before_issue_55_let_the_router_move_the_decoder(tiny, tmp_path, monkeypatch, arm, setting):
    """The other side of ``test_the_router_cannot_move_the_decoder`` (so it can fail): one global clip
    norm (the oracle) or the hard phase's router reading the body's separator state moves the decoder."""
    data, base = tiny
    cfg = _cfg(data, base, steps=5, eval_every=5, eval_rows=16, decode_rows=0, precision="fp64", lr_new=1e-2,
               c_base_source="pretrained_source", grad_clip=0.05, **_DECOUPLED_ARMS[arm], **setting)
    trained = _decoder_after_training(cfg, tmp_path / "trained", monkeypatch, probe_trained=True)
    frozen = _decoder_after_training(cfg, tmp_path / "frozen", monkeypatch, probe_trained=False)
    assert max(float((trained[n] - frozen[n]).abs().max()) for n in trained) > 1e-7


def _stop_once(monkeypatch, name: str, when):
    """Make ``zfree_lab.run.training.<name>`` raise KeyboardInterrupt the first time ``when(*args, **kw)``
    holds (a stop the way Ctrl-C or SIGTERM reaches the loop), and count every call; returns the counter."""
    import zfree_lab.run.training as T

    real, calls = getattr(T, name), {"n": 0, "stopped": False}

    def wrapped(*a, **kw):
        calls["n"] += 1
        if not calls["stopped"] and when(*a, **kw):
            calls["stopped"] = True
            raise KeyboardInterrupt
        return real(*a, **kw)
    monkeypatch.setattr(T, name, wrapped)
    return calls


def test_a_run_stopped_in_its_final_evaluation_resumes_at_its_last_step(tiny, tmp_path, monkeypatch):
    """The last step is checkpointed before the final evaluation (on a real model that evaluation and the
    outputs after it are most of a run): stopped inside it, the run resumes there, trains no step again,
    and ends with the uninterrupted run's summary and metrics rows (timing aside)."""
    from zfree.core.errors import Interrupted

    data, base = tiny
    cfg = _cfg(data, base, weighting="distribution", beta=0.3, checkpoint_every=0)
    full = train_cvae(cfg, tmp_path / "full", progress=False)
    _stop_once(monkeypatch, "evaluate", lambda *a, step, **kw: step == 6)
    with pytest.raises(Interrupted, match=r"interrupted at step 6 \(the checkpoint of step 6 is kept\)"):
        train_cvae(cfg, tmp_path / "res", progress=False)
    assert [r["step"] for r in read_jsonl(tmp_path / "res" / "metrics.jsonl")] == [0, 3]
    monkeypatch.undo()
    steps = _stop_once(monkeypatch, "_take_step", lambda *a: False)
    resumed = train_cvae(cfg, tmp_path / "res", progress=False)
    assert steps["n"] == 0  # no step trained again
    assert _strip_timing(resumed) == _strip_timing(full)
    rows = [{k: v for k, v in r.items() if k != "wall_s"} for r in read_jsonl(tmp_path / "res" / "metrics.jsonl")]
    assert rows == [{k: v for k, v in r.items() if k != "wall_s"} for r in read_jsonl(tmp_path / "full" / "metrics.jsonl")]


def _stopped_at_then_resumed(cfg, run, monkeypatch, step: int, message: str) -> dict:
    """Train ``cfg`` into ``run``, stopped (``Interrupted``, its message matching ``message``) as step ``step``
    begins, then resumed; returns the resumed run's summary."""
    from zfree.core.errors import Interrupted

    _stop_once(monkeypatch, "_take_step", lambda loop, s: s == step)
    with pytest.raises(Interrupted, match=message):
        train_cvae(cfg, run, progress=False)
    monkeypatch.undo()
    return train_cvae(cfg, run, progress=False)


def test_a_run_stopped_after_its_step0_evaluation_does_not_write_that_row_twice(tiny, tmp_path, monkeypatch):
    """Stopped at its first step, after the step-0 evaluation and its checkpoint, a run resumes at step 0
    without evaluating it again: one row per evaluated step, and the uninterrupted summary."""
    data, base = tiny
    cfg = _cfg(data, base, weighting="distribution", beta=0.3, checkpoint_every=0)
    full = train_cvae(cfg, tmp_path / "full", progress=False)
    resumed = _stopped_at_then_resumed(cfg, tmp_path / "res", monkeypatch, 1, r"the checkpoint of step 0 is kept")
    assert [r["step"] for r in read_jsonl(tmp_path / "res" / "metrics.jsonl")] == [0, 3, 6]
    assert _strip_timing(resumed) == _strip_timing(full)


@pytest.mark.parametrize("every_s, kept", [(0.0, 3), (1e-9, 4)])
def test_checkpoints_by_the_clock_keep_the_last_steps_and_change_no_number(tiny, tmp_path, monkeypatch, every_s, kept):
    """``checkpoint_every_s``: a checkpoint once that many seconds have passed since the last one (1e-9: after
    every step; 0: off, so only the evaluation of step 3 is kept). Stopped at step 5, the run keeps the
    checkpoint of step 4 (resp. 3), resumes to the summary of a run trained without the clock's
    checkpoints, and its run id is that run's (the field is log-only)."""
    from zfree.config import run_hash

    data, base = tiny
    cfg = _cfg(data, base, weighting="distribution", beta=0.3, checkpoint_every_s=every_s)
    plain = _cfg(data, base, weighting="distribution", beta=0.3, checkpoint_every_s=0.0)
    full = train_cvae(plain, tmp_path / "full", progress=False)
    resumed = _stopped_at_then_resumed(cfg, tmp_path / "res", monkeypatch, 5,
                                       rf"interrupted at step 4 \(the checkpoint of step {kept} is kept\)")
    assert resumed.pop("checkpoint_every_s") == every_s and full.pop("checkpoint_every_s") == 0.0
    assert _strip_timing(resumed) == _strip_timing(full)
    assert run_hash(cfg) == run_hash(plain)


def test_progress_says_step_0_evaluation_before_the_first_step(tiny, tmp_path, monkeypatch):
    """`zfree status` said "starting (no step written yet)" for the 10 minutes a SmolLM2 run spends in its step-0
    evaluation; progress.json now says so while it runs, with no time left guessed before a step's pace is known."""
    from zfree_lab.run import training

    data, base = tiny
    run, seen = tmp_path / "run", []
    real = training._record_evaluation

    def record(out, *a, **k):
        if not seen:
            seen.append(json.loads((out / "progress.json").read_text()))
        return real(out, *a, **k)

    monkeypatch.setattr(training, "_record_evaluation", record)
    train_cvae(_cfg(data, base, steps=2, eval_every=2), run, progress=False)
    assert seen[0]["step"] == 0 and seen[0]["phase"] == "step-0 evaluation" and seen[0]["eta_s"] is None
    assert json.loads((run / "progress.json").read_text())["step"] == 2
