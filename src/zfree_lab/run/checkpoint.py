"""A run's checkpoint (``checkpoint/``, the previous one kept as ``checkpoint.prev/``): the model
tensors (``zfree_lab.run.checkpoint_parts``), the optimizer, numpy and torch RNG states and the
``TrainState``, as plain data (safetensors and JSON, no pickle), written beside the last good one
and switched in by renames (``zfree_lab.run.checkpoint_io.write_checkpoint_dir``); loading falls back
to the previous checkpoint when the newest is damaged. Part of the run folder
(``zfree_lab.run.run_folder``).
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from zfree.core.errors import CheckpointError, CheckpointWriteError
from zfree_lab.run.checkpoint_io import (load_checkpoint_dir, load_plain_state, safe_torch_load,
                                      save_plain_state, safetensors_os_error, write_checkpoint_dir)
from zfree.core.io import atomic_write_json
from zfree_lab.run.checkpoint_parts import FINISHED_KEY, load_model_tensors, save_model_tensors


def _plain(obj):
    """numpy scalars and arrays in a TrainState (usage counts, gate values) as Python values."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, (np.generic, np.ndarray)):
        return obj.tolist()
    return obj


def save_checkpoint(out: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, rng: np.random.Generator,
                    state) -> None:
    """checkpoint/ = model.safetensors (under LoRA only what trains, ``checkpoint_parts``) +
    state.safetensors/state.json (optimizer, numpy and torch RNG states, the TrainState as a dict;
    ``checkpoint_io.save_plain_state``, no pickle) + COMPLETE, written
    beside the last good one and switched in by renames; the previous one is kept as
    checkpoint.prev/ (``checkpoint_io.write_checkpoint_dir``)."""
    def write(d: Path) -> None:
        try:
            partial = save_model_tensors(model, d / "model.safetensors")
            save_plain_state(d, {"optimizer": opt.state_dict(), "rng": rng.bit_generator.state, **partial,
                                 "torch_rng": torch.get_rng_state(), "state": _plain(dataclasses.asdict(state))})
        except SafetensorError as e:  # its I/O errors (disk full) name no file and are no OSError
            raise _as_os_error(e, d) from None

    try:
        write_checkpoint_dir(out / "checkpoint", write)
    except OSError as e:  # disk full, quota, read-only: nothing existing was touched
        raise disk_write_error(out, getattr(state, "step", None), "the checkpoint", e) from None


def _as_os_error(e: Exception, path: Path) -> Exception:
    """safetensors' I/O error (any version's wording) as the OSError it was (ENOSPC ...), naming
    ``path``; other errors as they are (``zfree_lab.run.checkpoint_io.safetensors_os_error``)."""
    return safetensors_os_error(e, path)


def disk_write_error(out: Path, step: int | None, what: str, e: OSError) -> CheckpointWriteError:
    """The one-line CheckpointWriteError of ``what`` (the checkpoint, the metrics row) that could not
    be written at ``step`` in run folder ``out`` for the OSError ``e`` (disk full, quota, read-only):
    its reason and file, the checkpoints kept, how to resume. Writes error.json when it still fits
    (the message then names it); returns the error for the caller to raise."""
    why = e.strerror or str(e) or type(e).__name__
    kept = [d.name for d in (out / "checkpoint", out / "checkpoint.prev") if (d / "COMPLETE").is_file()]
    keep = f"the last good checkpoint is kept ({', '.join(kept)})" if kept else "no earlier checkpoint exists"
    msg = (f"cannot write {what} of step {step} in {out} ({why}"
           f"{f': {e.filename}' if e.filename else ''}); {keep}; free space and resume with "
           f"`zfree train --resume {out}`")
    try:
        atomic_write_json(out / "error.json", {"step": step, "error": msg, "errno": e.errno})
        msg += f" (see {out / 'error.json'})"
    except OSError:  # the disk is too full for error.json too: the message alone says it
        pass
    return CheckpointWriteError(msg)


def _read_checkpoint(d: Path) -> tuple[dict, dict]:
    """(model tensors, plain state) of checkpoint folder ``d``, read only (nothing is filled yet),
    so a damaged file fails here and the previous checkpoint is tried.
    The plain-state layout, else the state.pt of older run folders (``weights_only=True``)."""
    f = d / "model.safetensors"
    if not f.is_file() or f.stat().st_size == 0:
        raise CheckpointError(f"{f} is {'missing' if not f.is_file() else 'empty'}")
    try:
        tensors = load_file(str(f))
    except Exception as e:  # noqa: BLE001 - SafetensorError names no file
        raise CheckpointError(f"{f} is damaged ({type(e).__name__}: {e})") from None
    old_layout = (d / "state.pt").exists() and not (d / "state.json").exists()
    ck = safe_torch_load(d / "state.pt") if old_layout else load_plain_state(d)
    if isinstance(ck, dict) and FINISHED_KEY in ck:
        raise CheckpointError(f"{d} is a finished run's record (its own tensors, no optimizer state): a finished run "
                              "is not resumed")
    if not isinstance(ck, dict) or not {"optimizer", "rng", "torch_rng", "state"} <= set(ck):
        raise CheckpointError(f"{d}: the checkpoint state lacks optimizer, rng, torch_rng or state")
    return tensors, ck


def _finished_record(d: Path) -> bool:
    """Whether checkpoint folder ``d`` is a finished run's record (``checkpoint_parts.slim_finished``)."""
    try:
        packed = json.loads((d / "state.json").read_text())  # (``checkpoint_io.save_plain_state``'s nest)
        return FINISHED_KEY in {k for k, _ in packed.get("__dict__", [])}
    except (OSError, ValueError, TypeError, AttributeError):
        return False


def load_checkpoint(out: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, rng: np.random.Generator,
                    state_cls, warn=None) -> object | None:
    """Restore the newest usable checkpoint (checkpoint/, else checkpoint.prev/, else the
    .checkpoint.old/ an older version could leave mid-swap) into ``model``, ``opt``, ``rng`` and
    torch's RNG; returns ``state_cls(**saved state)``, or None without one (or with only a finished
    run's record, ``slim_finished``, whose summary.json was removed: it trains again from step 0,
    said through ``warn``). A checkpoint that
    fails to load (missing, empty, truncated, altered, or not plain data) is reported through
    ``warn`` (default: a UserWarning) naming the file, and the previous one is used; raises
    CheckpointError listing the files when none loads."""
    if _finished_record(out / "checkpoint") and not (out / "checkpoint.prev").exists():
        (warn or (lambda m: warnings.warn(m, stacklevel=2)))(
            f"{out / 'checkpoint'} is a finished run's record, not a point to resume from (its summary.json is "
            "gone): the run trains again from step 0")
        return None
    found = load_checkpoint_dir([out / "checkpoint", out / "checkpoint.prev", out / ".checkpoint.old"],
                                _read_checkpoint, warn=warn)
    if found is None:
        return None
    d, (_, ck) = found
    try:
        load_model_tensors(model, d / "model.safetensors", ck)  # verified and read above; tied weights as saved
        opt.load_state_dict(ck["optimizer"])
        rng.bit_generator.state = ck["rng"]
        torch.set_rng_state(ck["torch_rng"])
        return state_cls(**ck["state"])
    except (RuntimeError, KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{d} does not fit this run ({type(e).__name__}: {str(e)[:300]}); "
                              "delete the checkpoint folders to restart the run from step 0") from None
