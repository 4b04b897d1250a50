"""zfree.reference.prefix: the z-free reference of a prefix-route run (``injection: prefix``; issue 55 item 4).

The reference's b and b_t equal a float64 computation by hand (the base model fed its embeddings with the
route's initial soft token inserted before the separator, one unpadded row at a time); a prefix run (the
discrete CVAE, and the z-free control K = 1) trains through ``train_cvae``, its step-0 rho_recon is 1
against its stored prefix reference, and the check is a real one (a reference read through another soft
token fails it); a resumed prefix run reads its stored reference instead of rescoring.
"""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import pandas as pd
import pytest
import torch

from tests.tiny import PAIRS, tiny_flat, tiny_gpt2
from zfree.config import TrainConfig
from zfree.core.errors import InputError
from zfree.core.io import read_json
from zfree.data.batching import encode_pairs
from zfree.models.discrete import DiscreteCVAE
from zfree.models.routes import initial_soft_token
from zfree.reference.prefix import PREFIX_REFERENCE_DIR, prefix_reference, soft_token_sha256
from zfree.reference.reference import RHO0_TOL
from zfree.reference.scoring import score_pairs

TINY_D = 32  # tests.tiny.TINY_BASE's n_embd
B_ATOL = 1e-6  # nats per token: float32 scoring against float64 by hand


def _write_pairs(path, pairs) -> None:
    path.write_text("".join(json.dumps({"id": p.id, "x": p.x, "y": p.y}) + "\n" for p in pairs))


def _by_hand(model, enc, soft) -> list[np.ndarray]:
    """Per row: -log p(y_t | x, soft, sep, y_<t) over S in float64, the row alone (no padding, no batching)."""
    m = model.double()
    out = []
    for e in enc:
        seq, P = list(e.prefix_ids + e.target_ids), len(e.prefix_ids)
        with torch.no_grad():
            emb = m.get_input_embeddings()(torch.tensor([seq]))
            emb = torch.cat([emb[:, : P - 1], soft.double()[None, None], emb[:, P - 1 :]], 1)  # [x-prefix, s, sep, y]
            lp = torch.log_softmax(m(inputs_embeds=emb).logits[0], -1)  # extended position t predicts seq[t]
        out.append(np.array([-float(lp[t, seq[t]]) for t in range(P, len(seq))]))
    return out


def test_prefix_reference_equals_a_float64_computation_by_hand(tmp_path):
    model, tok = tiny_gpt2(n_layer=2, seed=3)
    data = tmp_path / "val.jsonl"
    _write_pairs(data, PAIRS)  # ragged lengths, an empty x
    soft = initial_soft_token(model)
    # the soft token the route starts from (u = 0 at step 0)
    torch.testing.assert_close(DiscreteCVAE(copy.deepcopy(model), n_latent=2, injection="prefix").injection.shared.detach(), soft,
                               atol=0, rtol=0)
    ref = prefix_reference(model, tok, data, soft, tmp_path / "ref")
    want = _by_hand(copy.deepcopy(model), encode_pairs(tok, PAIRS), soft)
    ids = [p.id for p in PAIRS]
    np.testing.assert_allclose(ref.b_of(ids), [w.mean() for w in want], atol=B_ATOL, rtol=0)
    for got, w in zip(ref.surprisal_of(ids), want):
        np.testing.assert_allclose(got, w, atol=B_ATOL, rtol=0)
    assert ref.c_base == pytest.approx(np.mean([w.mean() for w in want]), abs=B_ATOL)
    # the soft token matters: the plain z-free b differs (so the comparison above is not the plain reference's)
    plain = score_pairs(model, tok, PAIRS, cache=False).per_example["b"].to_numpy()
    assert np.abs(plain - np.array(ref.b_of(ids))).max() > 1e-3
    meta = read_json(tmp_path / "ref" / "reference.json")
    assert meta["route"] == "prefix" and meta["soft_token_sha256"] == soft_token_sha256(soft)
    assert ref.meta["rescored"] is True
    again = prefix_reference(model, tok, data, soft, tmp_path / "ref")  # the same inputs: read back
    assert again.meta["rescored"] is False and again.b_of(ids) == ref.b_of(ids)
    other = prefix_reference(model, tok, data, soft * 1.5, tmp_path / "ref")  # another soft token: scored again
    assert other.meta["rescored"] is True and other.b_of(ids) != ref.b_of(ids)


def _run_cfg(tiny_run, arm: str, **kw) -> TrainConfig:
    from zfree_lab.experiment.controls import control_params

    data, base = tiny_run
    flat = tiny_flat(data, base, **{"device": "cpu", "steps": 2, "eval_every": 2, "injection": "prefix", **kw})
    return TrainConfig.from_flat(control_params(flat) if arm == "control" else flat)


@pytest.mark.parametrize(("arm", "weighting"), [("cvae", "token"), ("control", "distribution")])
def test_a_prefix_run_trains_and_starts_at_rho_1_against_its_stored_prefix_reference(tiny_run, tmp_path, arm,
                                                                                       weighting):
    """Through the run's entry point (``train_cvae``): the discrete CVAE under the token weighting (b and b_t
    on training rows too) and the z-free control (K = 1). Its c_base and b are the prefix reference's."""
    from zfree_lab.run.training import train_cvae

    cfg = _run_cfg(tiny_run, arm, weighting=weighting)
    out = tmp_path / "run"
    s = train_cvae(cfg, out, progress=False)
    assert s["injection"] == "prefix" and s["n_latent"] == (1 if arm == "control" else cfg.model.n_latent)
    assert abs(s["init/loss/val/baseline_normalized_reconstruction_loss"] - 1) <= RHO0_TOL
    assert np.isfinite(s["loss/val/reconstruction_loss"])
    splits = {"val", "train"} if weighting == "token" else {"val"}
    assert {p.name for p in (out / PREFIX_REFERENCE_DIR).iterdir()} == splits
    meta = read_json(out / PREFIX_REFERENCE_DIR / "val" / "reference.json")
    assert meta["route"] == "prefix" and meta["estimator"] == "prefix_route"
    config = read_json(out / "config.json")
    assert config["_c_base"] == pytest.approx(meta["c_base"], rel=1e-12)
    assert config["_reference"]["route"] == "prefix"
    base_c = read_json(tiny_run[1] / "reference" / "reference.json")["c_base"]
    assert abs(meta["c_base"] - base_c) > 1e-3  # not the base run's (x, y) reference
    per_ex = pd.read_parquet(out / "per_example.parquet").set_index("id")
    stored = pd.read_parquet(out / PREFIX_REFERENCE_DIR / "val" / "per_example.parquet").set_index("id")
    np.testing.assert_allclose(per_ex["b"], stored.loc[per_ex.index, "b"], rtol=0, atol=1e-12)


def test_the_step0_check_fails_for_a_reference_read_through_another_soft_token(tiny_run, tmp_path, monkeypatch):
    """The check is real: a reference scored through s_0 + 0.3 r (r a fixed random direction; not the route's
    s_0) is refused at step 0. (Not s_0 + 0.3: GPT-2's layer norm removes a shift of every coordinate.)"""
    import zfree_lab.run.run_data as run_data
    from zfree_lab.run.training import train_cvae

    r = torch.randn(TINY_D, generator=torch.Generator().manual_seed(0))
    monkeypatch.setattr(run_data, "initial_soft_token", lambda bb: initial_soft_token(bb) + 0.3 * r)
    with pytest.raises(InputError, match="step-0 rho_recon"):
        train_cvae(_run_cfg(tiny_run, "cvae"), tmp_path / "run", progress=False)


def test_a_resumed_prefix_run_reads_its_stored_reference_without_rescoring(tiny_run, tmp_path, monkeypatch):
    import zfree.reference.prefix as prefix
    from zfree_lab.run.training import train_cvae

    cfg = _run_cfg(tiny_run, "cvae", steps=4, eval_every=2)
    out = tmp_path / "run"
    assert train_cvae(cfg, out, progress=False, stop_after=1) == {"stopped_at": 1}
    ref_json = out / PREFIX_REFERENCE_DIR / "val" / "reference.json"
    before = (ref_json.read_bytes(), os.stat(ref_json).st_mtime_ns)

    def refused(*a, **kw):
        raise AssertionError("a resumed prefix run rescored its reference")

    monkeypatch.setattr(prefix, "score_pairs", refused)
    s = train_cvae(cfg, out, progress=False)
    assert (ref_json.read_bytes(), os.stat(ref_json).st_mtime_ns) == before
    assert abs(s["init/loss/val/baseline_normalized_reconstruction_loss"] - 1) <= RHO0_TOL


def test_a_prefix_run_reads_its_gate_rows_b_through_the_prefix_too(tiny_run, tmp_path):
    """Every validation row evaluated (eval_rows 48 of 48), so the hand-over gate reads training rows, whose
    b the run has no training-row reference for: they get their own prefix reference (``gate``), of exactly
    the gate's rows, through the same soft token as the validation reference."""
    from zfree_lab.run.training import train_cvae

    cfg = _run_cfg(tiny_run, "cvae", aid="hard_em_then_soft", eval_rows=48, handover_rows=8)
    out = tmp_path / "run"
    s = train_cvae(cfg, out, progress=False)
    assert s["aid/gate_split"] == "train"
    assert {p.name for p in (out / PREFIX_REFERENCE_DIR).iterdir()} == {"val", "gate"}
    gate, val = (read_json(out / PREFIX_REFERENCE_DIR / k / "reference.json") for k in ("gate", "val"))
    assert gate["route"] == "prefix" and gate["split"] == "gate" and gate["data_file"].endswith("train.jsonl")
    assert gate["soft_token_sha256"] == val["soft_token_sha256"] and gate["model_sha256"] == val["model_sha256"]
    ids = pd.read_parquet(out / PREFIX_REFERENCE_DIR / "gate" / "per_example.parquet")["id"].tolist()
    assert ids == read_json(out / "config.json")["_gate_rows"]["ids"]


def test_a_prefix_studys_report_reads_the_runs_prefix_reference_not_the_base_runs(tiny_run, tmp_path):
    """``load_sweep`` on a folder of prefix runs loads the reference they used (the base through s_0, in each
    run folder): its c_base is the one their objectives read, its b the runs' per-example b, and the report's
    line names the route. With a run of another route beside them, the base run's reference is loaded and a
    note says the prefix runs read their own."""
    from zfree_lab.experiment.results import load_sweep
    from zfree_lab.report.report import reference_markdown
    from zfree_lab.run.training import train_cvae

    sweep = tmp_path / "sweep"
    for beta in (0.3, 1.0):
        train_cvae(_run_cfg(tiny_run, "cvae", beta=beta), sweep / "runs" / f"prefix_{beta}", progress=False)
    res = load_sweep(sweep)
    meta = read_json(sweep / "runs" / "prefix_0.3" / PREFIX_REFERENCE_DIR / "val" / "reference.json")
    assert res.reference["route"] == "prefix" and "note" not in res.reference
    assert res.reference["c_base"] == pytest.approx(meta["c_base"], rel=1e-12)
    base_c = read_json(tiny_run[1] / "reference" / "reference.json")["c_base"]
    assert abs(res.reference["c_base"] - base_c) > 1e-3
    for run_dir in sweep.glob("runs/*"):
        assert read_json(run_dir / "config.json")["_c_base"] == pytest.approx(res.reference["c_base"], rel=1e-12)
        per_ex = pd.read_parquet(run_dir / "per_example.parquet").set_index("id")
        b = res.examples.set_index("id").loc[per_ex.index, "b"]
        np.testing.assert_allclose(per_ex["b"], b, rtol=0, atol=1e-12)
    assert reference_markdown(res.reference).startswith("**Reference (prefix route")

    train_cvae(_run_cfg(tiny_run, "cvae", injection="embedding"), sweep / "runs" / "embedding", progress=False)
    mixed = load_sweep(sweep)
    assert mixed.reference.get("route") != "prefix"
    assert mixed.reference["c_base"] == pytest.approx(base_c, rel=1e-12)
    assert mixed.reference["note"].startswith("2 of 3 runs read their own prefix-route reference")
    assert "Note: 2 of 3 runs" in reference_markdown(mixed.reference)


@pytest.mark.parametrize("key", ["dtype", "scorer_version", "max_length"])
def test_runs_whose_prefix_references_were_scored_differently_keep_the_base_reference(tiny_run, tmp_path, key):
    """Every input a stored prefix reference is matched on (``MATCH_KEYS``) must agree across the runs for one
    of them to stand for all: two references of the same rows and soft token scored in another dtype, by
    another scorer version or with another context length are not one reference (before, only the model,
    tokenizer, rows, soft token and c_base were compared)."""
    from zfree.core.io import atomic_write_json
    from zfree_lab.experiment.results import load_sweep
    from zfree_lab.run.training import train_cvae

    sweep = tmp_path / "sweep"
    for beta in (0.3, 1.0):
        train_cvae(_run_cfg(tiny_run, "cvae", beta=beta), sweep / "runs" / f"prefix_{beta}", progress=False)
    assert "note" not in load_sweep(sweep).reference
    ref = sweep / "runs" / "prefix_1.0" / PREFIX_REFERENCE_DIR / "val" / "reference.json"
    meta = read_json(ref)
    atomic_write_json(ref, {**meta, key: f"{meta.get(key)}-other"})
    res = load_sweep(sweep)
    assert res.reference.get("route") != "prefix"
    assert res.reference["note"].startswith(f"the runs' prefix-route references differ in {key}")
