"""Everything a CVAE run folder holds (DESIGN §5), read and written in one place:

  config.json           the flat config plus "_" metadata (versions, c_base, data and base-model hashes)
  metrics.jsonl         one row per evaluation
  checkpoint/           model.safetensors + state.pt + COMPLETE (``save_checkpoint`` / ``load_checkpoint``)
  error.json            the step, batch ids and non-finite terms of a run that stopped
  summary.json          the final metrics; its presence marks the run finished (never rewritten)
  per_example.parquet   the final evaluation's per-example table

Every write is atomic (``zfree.io``); the checkpoint is swapped in by renames.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata as md
import json
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_model, save_model

from zfree.config import TrainConfig
from zfree.io import (append_jsonl, atomic_write_json, atomic_write_parquet, atomic_write_text, read_json, read_jsonl,
                      sha256_file, sha256_state_dict)

TIMING_KEYS = ("wall_s",)  # the only summary keys that differ between a resumed and an uninterrupted run


class NonFiniteLossError(RuntimeError):
    """The training loss went NaN or infinite; ``error.json`` in the run folder says where."""


def versions() -> dict[str, str]:
    """Installed versions of the packages a run's numbers depend on (those that are installed)."""
    out = {}
    for p in ("zfree", "torch", "transformers", "tokenizers", "numpy", "pandas"):
        try:
            out[p] = md.version(p)
        except md.PackageNotFoundError:
            pass
    return out


def finished_summary(out: Path) -> dict | None:
    """The summary of a finished run folder, or None when it has none."""
    return read_json(out / "summary.json") if (out / "summary.json").exists() else None


# ---------------------------------------------------------------------------- config record and hash checks


def loaded_base_sha(backbone: torch.nn.Module) -> str:
    """sha256 of the loaded base model's state dict (``io.sha256_state_dict``), hex."""
    return sha256_state_dict(backbone.state_dict())


def check_same_config(out: Path, cfg: TrainConfig) -> None:
    """A folder that holds config.json must hold this config. Raises ValueError naming the fields that differ."""
    if not (out / "config.json").exists():
        return
    old = {k: v for k, v in read_json(out / "config.json").items() if not k.startswith("_")}
    if old != cfg.to_flat():
        diff = sorted(k for k in set(old) | set(cfg.to_flat()) if old.get(k) != cfg.to_flat().get(k))
        raise ValueError(f"{out} holds a run of another config (fields {diff}); choose another folder")


def check_same_base(out: Path, backbone: torch.nn.Module, base_dir: Path) -> None:
    """A resumed run must continue on the very same base model. Raises ValueError when the stored
    ``_base_model_sha256_loaded`` differs from the loaded model's."""
    if not (out / "config.json").exists():
        return
    stored = read_json(out / "config.json").get("_base_model_sha256_loaded")
    now = loaded_base_sha(backbone)
    if stored is not None and stored != now:
        raise ValueError(f"{out} was trained from a base model with sha256 {stored[:12]}..., but "
                         f"{base_dir / 'model'} now has {now[:12]}...; refusing to resume")


def write_config_record(out: Path, cfg: TrainConfig, c_base: float, ref, data_dir: Path,
                        backbone: torch.nn.Module) -> None:
    """config.json (once): the flat config, versions, c_base, train/val sha256, the base model's
    hashes (recorded and loaded) and the reference's metadata."""
    if (out / "config.json").exists():
        return
    atomic_write_json(out / "config.json", {
        **cfg.to_flat(), "_versions": versions(), "_c_base": c_base,
        "_data_sha256": {s: sha256_file(data_dir / f"{s}.jsonl") for s in ("train", "val")},
        "_base_model_sha256": ref.meta.get("model_sha256"), "_reference": ref.meta,
        "_base_model_sha256_loaded": loaded_base_sha(backbone)})


# ---------------------------------------------------------------------------- checkpoints


def save_checkpoint(out: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, rng: np.random.Generator,
                    state) -> None:
    """checkpoint/ = model.safetensors + state.pt (optimizer, numpy and torch RNG states, the
    TrainState as a dict) + COMPLETE, written to .checkpoint.tmp and swapped in by renames."""
    tmp, final, old = out / ".checkpoint.tmp", out / "checkpoint", out / ".checkpoint.old"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_model(model, str(tmp / "model.safetensors"))
    torch.save({"optimizer": opt.state_dict(), "rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state(),
                "state": dataclasses.asdict(state)}, tmp / "state.pt")
    (tmp / "COMPLETE").write_text("ok\n")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(out: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, rng: np.random.Generator,
                    state_cls) -> object | None:
    """Restore the newest complete checkpoint (checkpoint/, else .checkpoint.old) into ``model``,
    ``opt``, ``rng`` and torch's RNG; returns ``state_cls(**saved state)``, or None without one."""
    for d in (out / "checkpoint", out / ".checkpoint.old"):
        if (d / "COMPLETE").exists() and (d / "state.pt").exists():
            load_model(model, str(d / "model.safetensors"))
            ck = torch.load(d / "state.pt", weights_only=False)
            opt.load_state_dict(ck["optimizer"])
            rng.bit_generator.state = ck["rng"]
            torch.set_rng_state(ck["torch_rng"])
            return state_cls(**ck["state"])
    return None


# ---------------------------------------------------------------------------- metrics, errors, summary


def reset_metrics(out: Path, resumed_step: int | None) -> list[dict]:
    """metrics.jsonl at the start of a run: removed for a fresh run (``resumed_step`` None), cut to
    the evaluations up to the checkpoint's step for a resumed one. Returns the rows kept."""
    f = out / "metrics.jsonl"
    if resumed_step is None:
        f.unlink(missing_ok=True)
        return []
    if not f.exists():
        return []
    rows = [r for r in read_jsonl(f) if r["step"] <= resumed_step]
    atomic_write_text(f, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    return rows


def append_metrics(out: Path, row: dict) -> None:
    """One evaluation row appended to metrics.jsonl."""
    append_jsonl(out / "metrics.jsonl", row)


def write_error(out: Path, step: int, batch_ids: list[str], bad_terms: list[str]) -> Path:
    """error.json of a non-finite loss: the step, the batch's row ids and the non-finite term names."""
    return atomic_write_json(out / "error.json", {"step": step, "batch_ids": batch_ids, "non_finite_terms": bad_terms})


def write_summary(out: Path, cfg: TrainConfig, ev, state, wall: float) -> dict:
    """per_example.parquet and summary.json of a finished run: the final evaluation's metrics, the
    flat config, the step-0 values (init/*), the use verdicts and the aid's record. Returns the summary."""
    atomic_write_parquet(out / "per_example.parquet", ev.per_example)
    if getattr(ev, "samples", None) is not None:  # greedy/sampled y per latent value (no notion of correct y)
        atomic_write_parquet(out / "samples.parquet", ev.samples)
    rows = read_jsonl(out / "metrics.jsonl")
    init = rows[0] if rows else {}
    gate_pass = [g["step"] for g in state.gate if g["pass"]]
    summary = {**ev.metrics, **cfg.to_flat(), "steps": cfg.optim.steps,
               "wall_s": rows[-1].get("wall_s", wall) if rows else wall,
               "init/task/correctness": init.get("task/correctness"),
               "init/structure/probe_accuracy": init.get("structure/probe_accuracy"),
               "init/loss/val/baseline_normalized_reconstruction_loss":
                   init.get("loss/val/baseline_normalized_reconstruction_loss"),
               "latent_used": bool(ev.metrics["latent/measured_use_fraction"] > 0.5),
               "predicted_latent_used": bool(ev.metrics["latent/predicted_use_fraction"] > 0.5),
               "aid/handover_step": state.handover_step, "aid/handover_forced": state.handover_forced,
               "aid/gate_first_pass_step": gate_pass[0] if gate_pass else None,
               "aid/gate": state.gate, "aid/restarts": state.restarts}
    atomic_write_json(out / "summary.json", summary)
    return summary
