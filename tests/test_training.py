"""CVAE training on a tiny base run: the run folder contract, bad input, no overwrite."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from tests.tiny import make_tiny_run
from zfree.config import TrainConfig
from zfree.io import read_json, read_jsonl
from zfree.training import train_cvae


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_run(tmp_path_factory.mktemp("tiny"))


def _cfg(data, base, **kw):
    flat = {**TrainConfig().to_flat(), "data_dir": str(data), "base_dir": str(base), "steps": 6, "batch_size": 8,
            "eval_every": 3, "eval_rows": 24, "decode_rows": 8, "warmup_backbone": 2, **kw}
    return TrainConfig.from_flat(flat)


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
    assert pe0["loss/val/zfree_reconstruction_loss"] == pytest.approx(b.iloc[:24].mean(), abs=1e-6)
    assert pe0["loss/val/reconstruction_loss"] == pytest.approx(b.iloc[:24].mean(), abs=1e-6)
    assert pe0["reference/c_base"] == pytest.approx(ref["c_base"])
    for key in ("loss/val/reconstruction_loss", "loss/val/baseline_normalized_reconstruction_loss",
                "loss/val/kl_prior_loss", "loss_contrib/fraction_abs/reconstruction_loss",
                "loss_contrib/fraction_abs/kl_prior_loss", "structure/alignment_nmi", "task/correctness",
                "latent/oracle_rho", "latent/q_max_mean", "latent/codes_used", "objective/beta_eff_median"):
        assert key in s, key
    pe = pd.read_parquet(run / "per_example.parquet")
    for col in ("id", "strategy", "n_tokens", "b", "lbar", "rho_i", "kl", "beta_eff", "weight", "posterior_argmax"):
        assert col in pe, col
    # beta_eff = beta * |S| / w with w = 1 / c_base (DESIGN §1)
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


def test_missing_data_folder_names_the_file(tiny, tmp_path):
    data, base = tiny
    with pytest.raises(FileNotFoundError, match="train.jsonl"):
        train_cvae(_cfg(tmp_path / "nope", base), tmp_path / "run", progress=False)
