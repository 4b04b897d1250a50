"""Everything a CVAE run folder holds (docs/reference/artifacts.md), read and written here (its
checkpoints in ``zfree_lab.run.checkpoint``):

  config.json           the flat config (as given) plus "_" metadata (versions, c_base, data and base-model
                        hashes, ``_rows_used``: the validation rows evaluated and decoded, at most the rows
                        there are; ``_gate_rows``: the ids of the hand-over gate's rows, where an aid reads
                        them); data_dir/base_dir in their portable form (``portable_path``)
  metrics.jsonl         one row per evaluation
  events.out.tfevents.* the same rows as TensorBoard scalars (``zfree_lab.run.live_curves``; field ``tensorboard``)
  checkpoint/           model.safetensors + state.safetensors/state.json (plain state, no pickle) + COMPLETE
                        (a manifest); the previous one kept as checkpoint.prev/ (``zfree_lab.run.checkpoint``,
                        ``zfree_lab.run.checkpoint_io.write_checkpoint_dir``)
  error.json            the step, batch ids and non-finite terms of a run that stopped
  summary.json          the final metrics; its presence marks the run finished (never rewritten)
  per_example.parquet   the final evaluation's per-example table

Every write is atomic (``zfree.core.io``); the checkpoint is swapped in by renames. Nothing
executable is loaded from a run folder: safetensors, JSON, or ``torch.load(weights_only=True)``
for the state.pt of older run folders.

Portable paths: config.json and summary.json store data_dir and base_dir in the
portable form of ``zfree.core.paths.portable_path`` (relative to the run folder inside its study or
sweep folder, ``zfree:<path>`` inside the repository, else absolute), so a copied or moved
study stays readable and resumable; config.json says so with ``"_paths_relative_to": "run
folder"``. ``read_run_config`` resolves them back, and ``check_same_config`` compares the
folders the paths name, so every form of one folder is equal.
"""

from __future__ import annotations

import importlib.metadata as md
import json
from pathlib import Path

import torch

from zfree.config import TrainConfig
from zfree.config.identity import identity_diff, run_identity
from zfree.core.errors import NonFiniteMetricError, ResumeRefusedError, ZfreeError
from zfree.core.io import (append_jsonl, atomic_write_json, atomic_write_parquet, atomic_write_text, nonfinite_keys,
                           read_json, read_jsonl, sha256_file, sha256_state_dict)
from zfree.core.paths import portable_path
from zfree.models.lora import base_state_dict
from zfree_lab.run.checkpoint import disk_write_error
from zfree_lab.run.checkpoint_parts import prune_finished
from zfree_lab.run.run_config import (PATH_BASE, TIMING_KEYS, USE_THRESHOLD, portable_flat, read_run_config,  # noqa: F401
                                      resolved_flat)



def device_memory(dev: torch.device) -> dict[str, int]:
    """On CUDA, the accelerator memory this process's run held at its peak and the device's total, in
    bytes (``compute/device_peak_bytes``: ``torch.cuda.max_memory_reserved``, the caching allocator's
    reserved bytes, which is what another process on the same device cannot have;
    ``compute/device_total_bytes``); {} elsewhere. The study's estimate fits runs per device with them
    (``zfree_lab.experiment.estimate.fit_device``)."""
    if dev.type != "cuda":
        return {}
    return {"compute/device_peak_bytes": int(torch.cuda.max_memory_reserved(dev)),
            "compute/device_total_bytes": int(torch.cuda.get_device_properties(dev).total_memory)}


class NonFiniteLossError(ZfreeError, RuntimeError):
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
    """The summary of a finished run folder, or None when it has none (check the folder's config
    first: ``check_same_config``)."""
    if not (out / "summary.json").exists():
        return None
    return read_json(out / "summary.json")


# ---------------------------------------------------------------------------- config record and hash checks


def loaded_base_sha(backbone: torch.nn.Module) -> str:
    """sha256 of the loaded base model's state dict (``io.sha256_state_dict``), hex; of the base
    weights alone under LoRA (``zfree.models.lora.base_state_dict``)."""
    return sha256_state_dict(base_state_dict(backbone))  # LoRA adapters dropped: the frozen base's hash


def check_same_config(out: Path, cfg: TrainConfig) -> None:
    """A folder that holds config.json must hold the same run (``zfree.config.run_identity``: path
    fields compared as the folders they name, so relative, ``zfree:`` and absolute forms of one folder
    are equal; the logging choices left out). Raises ResumeRefusedError (a ValueError) naming the
    fields that differ."""
    if not (out / "config.json").exists():
        return
    new = run_identity(cfg, "resolved")
    old = run_identity(read_run_config(out / "config.json"), "resolved")  # older records: paths relative to the cwd
    if diff := identity_diff(old, new):
        raise ResumeRefusedError(f"{out} holds a run of another config (fields {diff}: stored "
                                 f"{ {k: old.get(k) for k in diff} }, requested { {k: new.get(k) for k in diff} }); "
                                 "choose another folder")


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
                        backbone: torch.nn.Module, rows_used: dict[str, int] | None = None,
                        gate_rows: dict | None = None) -> None:
    """config.json (once): the flat config (as given), versions, c_base, train/val sha256, the base
    model's hashes (recorded and loaded), the reference's metadata (its data file and source folder
    portable), ``_rows_used`` (the validation rows evaluated and decoded, as used: at most the rows there
    are) and, for a run with gate rows, ``_gate_rows`` (``zfree_lab.run.run_data.gate_record``: split, rows, ids, ids_sha256);
    paths in their portable form."""
    if (out / "config.json").exists():
        return
    record = {**portable_flat(cfg.to_flat(), out), PATH_BASE: "run folder", "_versions": versions(), "_c_base": c_base,
              "_data_sha256": {s: sha256_file(data_dir / f"{s}.jsonl") for s in ("train", "val")},
              "_base_model_sha256": ref.meta.get("model_sha256"),
              "_reference": {**ref.meta, **{k: portable_path(ref.meta[k], out) for k in ("data_file", "source_dir")
                                            if isinstance(ref.meta.get(k), str)}},
              "_base_model_sha256_loaded": loaded_base_sha(backbone), **({"_rows_used": rows_used} if rows_used else {}),
              **({"_gate_rows": gate_rows} if gate_rows else {})}
    atomic_write_json(out / "config.json", record)


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
    rows = [r for r in read_jsonl(f, drop_torn_tail=True) if r["step"] <= resumed_step]  # a kill mid-append
    atomic_write_text(f, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    return rows


def append_metrics(out: Path, row: dict) -> None:
    """One evaluation row appended to metrics.jsonl (CheckpointWriteError, the last good checkpoint
    kept, when the disk is full: a torn line it may leave is dropped on resume)."""
    try:
        append_jsonl(out / "metrics.jsonl", row)
    except OSError as e:
        raise disk_write_error(out, row.get("step"), "the metrics row", e) from None


#: metrics that must be finite in every evaluation: the losses (validation reconstruction, KL,
#: objective, ELBO; the training terms). Others may be NaN by definition (undefined for the latent
#: kind or the data, never faked: e.g. latent/oracle_rho of a continuous latent).
FINITE_METRIC_PREFIXES = ("loss/",)


def check_finite_metrics(out: Path, step: int, row: dict) -> None:
    """An evaluation with a non-finite loss metric (``FINITE_METRIC_PREFIXES``) stops the run
    before it is stored or checkpointed: writes error.json (step, the non-finite keys) and raises
    NonFiniteMetricError naming them."""
    bad = nonfinite_keys({k: v for k, v in row.items() if k.startswith(FINITE_METRIC_PREFIXES)})
    if bad:
        atomic_write_json(out / "error.json", {"step": step, "non_finite_metrics": bad,
                                               "error": f"non-finite evaluation at step {step}: {bad}"})
        raise NonFiniteMetricError(f"non-finite evaluation at step {step}: metrics {bad} (see {out / 'error.json'}); "
                                   "the last good checkpoint is kept")


#: seconds between two writes of a run's ``progress.json``
PROGRESS_EVERY_S = 30.0
PROGRESS_FILE = "progress.json"


def write_progress(out: Path, step: int, steps: int, phase: str, elapsed_s: float) -> None:
    """``out/progress.json`` (atomic): where a run is while it trains -- its step of ``steps``, the
    phase (hard / soft / ...), the seconds since it started and the seconds left at its mean pace so
    far. A papermill run's bar goes to its notebook, unseen until the run ends: a long run on a real
    model (an hour a run) is watched with ``cat runs/<id>/progress.json``. At step 0 (its step-0 evaluation) no
    pace is known yet: ``eta_s`` null."""
    eta = round(elapsed_s / step * max(0, steps - step), 1) if step > 0 else None
    atomic_write_json(out / PROGRESS_FILE, {"step": step, "steps": steps, "phase": str(phase),
                                            "elapsed_s": round(elapsed_s, 1), "eta_s": eta})


def write_summary(out: Path, cfg: TrainConfig, ev, state, wall: float, extra: dict | None = None) -> dict:
    """per_example.parquet and summary.json of a finished run: the final evaluation's metrics, the
    flat config, the step-0 values (init/*), the use verdicts, the aid's record and ``extra`` (the
    plug-ins' keys, ``zfree.train.plugins.Plugin.summary``). Returns the summary."""
    atomic_write_parquet(out / "per_example.parquet", ev.per_example)
    if getattr(ev, "samples", None) is not None:  # greedy/sampled y per latent value (no notion of correct y)
        atomic_write_parquet(out / "samples.parquet", ev.samples)
    rows = read_jsonl(out / "metrics.jsonl")
    init = rows[0] if rows else {}
    gate_pass = [g["step"] for g in state.gate if g["pass"]]
    summary = {**ev.metrics, **portable_flat(cfg.to_flat(), out), "steps": cfg.optim.steps,
               "wall_s": rows[-1].get("wall_s", wall) if rows else wall,
               "init/task/correctness": init.get("task/correctness"),
               "init/structure/probe_accuracy": init.get("structure/probe_accuracy"),
               "init/loss/val/baseline_normalized_reconstruction_loss":
                   init.get("loss/val/baseline_normalized_reconstruction_loss"),
               "latent_used": bool(ev.metrics["latent/measured_use_fraction"] > USE_THRESHOLD),
               "predicted_latent_used": bool(ev.metrics["latent/predicted_use_fraction"] > USE_THRESHOLD),
               "aid/handover_step": state.handover_step, "aid/handover_forced": state.handover_forced,
               "aid/gate_first_pass_step": gate_pass[0] if gate_pass else None,
               "aid/gate": state.gate, "aid/restarts": state.restarts,
               "aid/aggressive_end_step": state.aggressive_end_step,
               "aid/aggressive_inner_steps": state.aggressive_inner_steps, "aid/aggressive_mi": state.aggressive_mi,
               **(extra or {})}
    # training compute (zfree_lab.run.compute): token positions through the decoder body, and the wall
    # time less the evaluations'
    summary["compute/forward_tokens"] = getattr(state, "forward_tokens", None)
    if getattr(state, "eval_wall_s", None) is not None:
        # wall_s is the last row's stamp, taken before that evaluation's checkpoint; eval_wall_s counts it
        summary["compute/train_wall_s"] = (summary["wall_s"] - state.eval_wall_s
                                           + getattr(state, "checkpoint_after_row_s", 0.0))
    # the first step's wall seconds (allocations and caches warm up in it): the estimate's probe
    # separates it from the steady steps (zfree_lab.experiment.estimate.probe)
    summary["compute/first_step_s"] = getattr(state, "first_step_s", None)
    atomic_write_json(out / "summary.json", summary)
    # one checkpoint per finished run, slimmed to its own tensors (nothing resumes a finished run)
    prune_finished(out, keep_prev=cfg.optim.keep_prev_checkpoint, base_dir=cfg.base_dir)
    return summary


#: steps between reads of the non-finite flags, per device type. Reading whether a loss is finite
#: is a device->host synchronisation; on the CPU it costs nothing, so every step is checked before
#: its update (the run stops at the bad step, its update never applied). On an accelerator the
#: per-step flags stay on the device and are read every FINITE_CHECK_EVERY steps and before every
#: evaluation, checkpoint and the end, so a non-finite loss still stops the run, naming the FIRST
#: bad step, its batch and terms, and no weights updated from it are ever saved (the updates of up
#: to N - 1 steps after it are discarded with the run).
FINITE_CHECK_EVERY = {"cpu": 1}
FINITE_CHECK_EVERY_ACCELERATOR = 25


class FiniteWatch:
    """The non-finite loss check without a per-step synchronisation (``FINITE_CHECK_EVERY``)."""

    def __init__(self, out: Path, device: torch.device):
        self.out = out
        self.every = FINITE_CHECK_EVERY.get(torch.device(device).type, FINITE_CHECK_EVERY_ACCELERATOR)
        self.pending: list[tuple[int, list[str], list[str], torch.Tensor]] = []

    def add(self, br, step: int, batch) -> None:
        """Record step ``step``'s finiteness flags (total, terms, contributions) on the device;
        check them when the step is due (every step on the CPU)."""
        named = [(k, v) for d in (br.terms, br.contributions) for k, v in d.items()]
        flags = torch.stack([torch.isfinite(br.total.detach())] + [torch.isfinite(v.detach()) for _, v in named])
        self.pending.append((step, list(batch.ids), [k for k, _ in named], flags))
        if step % self.every == 0:
            self.check()

    def check(self) -> None:
        """Read the pending flags (one synchronisation); NonFiniteLossError (after writing
        error.json) naming the first step whose total is NaN or infinite."""
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        ok = torch.stack([f[0] for *_, f in pending]).cpu()
        if bool(ok.all()):
            return
        step, ids, names, flags = pending[int((~ok).nonzero()[0, 0])]
        flags = flags.cpu()
        bad = sorted({k for k, f in zip(names, flags[1:].tolist()) if not f})
        # error.json of a non-finite loss: the step, the batch's row ids and the non-finite term names
        atomic_write_json(self.out / "error.json", {"step": step, "batch_ids": ids, "non_finite_terms": bad})
        raise NonFiniteLossError(f"non-finite loss at step {step}: terms {bad} (see {self.out / 'error.json'})")
