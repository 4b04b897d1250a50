"""What a checkpoint's ``model.safetensors`` holds: the whole model for full
fine-tuning (safetensors' ``save_model``, tied weights once), only what trains for a LoRA run
(``zfree.models.lora.trainable_tensors``: adapters, heads, latent embeddings), the frozen base
referenced by the sha256 of its weights; and a finished run's checkpoints pruned to one, slimmed
to the run's own tensors (``slim_finished``: a finished run is never resumed).

SmolLM2-135M measured (README "Real models that fit the machine"): a full checkpoint is the whole
model plus Adam's two moments per weight; a LoRA one a few MB.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from zfree.core.io import sha256_state_dict
from zfree.models.lora import LORA_MARK, base_state_dict, has_lora, load_trainable, trainable_tensors

#: the state.json key of a partial checkpoint: {"frozen_base_sha256": ..., "n_tensors": ...}
PARTIAL_KEY = "partial"


def frozen_base_sha(model: torch.nn.Module) -> str:
    """sha256 of the frozen base's weights (computed once per model and cached on it: it never changes;
    a bf16 run computes it before storing the base in bfloat16, ``run_setup.store_frozen_body``)."""
    sha = getattr(model, "_zfree_frozen_base_sha256", None)
    if sha is None:
        sha = sha256_state_dict(base_state_dict(model.backbone))
        model._zfree_frozen_base_sha256 = sha
    return sha


def save_model_tensors(model: torch.nn.Module, path: Path) -> dict:
    """Write the model's tensors to ``path`` (safetensors): all of them, or under LoRA only those
    that train. Returns the extra plain-state entries of the checkpoint (``{PARTIAL_KEY: {...}}``
    for a partial one, else ``{}``). Raises what safetensors raises (the caller maps I/O errors)."""
    if not has_lora(model):
        save_model(model, str(path))
        return {}
    tensors = trainable_tensors(model)
    save_file(tensors, str(path))
    return {PARTIAL_KEY: {"frozen_base_sha256": frozen_base_sha(model), "n_tensors": len(tensors)}}


def load_model_tensors(model: torch.nn.Module, path: Path, state: dict) -> None:
    """Load ``path`` into ``model``: a partial checkpoint (``state`` has ``PARTIAL_KEY``) onto the
    frozen base already loaded, whose hash must match; else the whole model (strict). Raises
    RuntimeError when the file or the base does not fit the model."""
    part = state.get(PARTIAL_KEY)
    if part is None:
        load_model(model, str(path))
        return
    sha = frozen_base_sha(model)  # (cached: the run computed it before any cast)
    if not has_lora(model):
        raise RuntimeError(f"{path} holds LoRA adapters but the run's model has none (lora_rank=0)")
    if part.get("frozen_base_sha256") != sha:
        raise RuntimeError(f"{path} was trained over another frozen base (sha256 "
                           f"{str(part.get('frozen_base_sha256'))[:12]}..., loaded {sha[:12]}...)")
    load_trainable(model, load_file(str(path)))


#: the state.json key of a finished run's checkpoint (``slim_finished``): what it keeps and what its
#: body was
FINISHED_KEY = "finished"


def _own(name: str) -> bool:
    """A tensor of the run's own (not the base model's body): outside ``backbone.``, or a LoRA adapter."""
    return not name.startswith("backbone.") or LORA_MARK in name


def _body_record(tensors: dict[str, torch.Tensor], base_dir: Path | str | None) -> str:
    """What the finished run's body was: "the base's" where every ``backbone.`` tensor of the
    checkpoint equals the base model's weight of that name (or the checkpoint holds none: LoRA over
    the frozen base), "trained" where one differs, "not compared" where the base's weights cannot be
    read (a GGUF file, no ``base_dir``)."""
    body = {k[len("backbone."):]: v for k, v in tensors.items() if not _own(k)}
    if not body:
        return "the base's"
    files = sorted((Path(base_dir) / "model").glob("*.safetensors")) if base_dir else []
    if not files:
        return "not compared"
    base: dict[str, torch.Tensor] = {}
    for f in files:
        base.update(load_file(str(f)))
    shared = [k for k in body if k in base]  # (a tied weight may be saved under the other of its names)
    if not shared:
        return "not compared"
    same = all(base[k].shape == body[k].shape and torch.equal(base[k].to(body[k].dtype), body[k]) for k in shared)
    return "the base's" if same else "trained"


def slim_finished(out: Path, base_dir: Path | str | None = None) -> None:
    """Make a finished run's ``checkpoint/`` the record of its result, not a point to resume from
    (a finished run is never resumed: ``zfree train --resume`` and a study return its summary.json,
    and the report reads none of its weights): ``model.safetensors`` keeps the run's own tensors
    (latent embedding, router, posterior, LoRA adapters, buffers outside the body:
    ``analysis/results/e2e-smollm2/latent_scale.py`` reads the latent embedding there) and, where the
    body was trained (a full fine-tune: it cannot be rebuilt from the base), the trained body, so the
    CVAE can still be loaded and decoded; ``state.json`` the TrainState and ``FINISHED_KEY`` (what was
    dropped, and whether the body was the base's: ``_body_record``). The optimizer's moments (twice the
    trainable weights) and the RNG states are dropped, and a body equal to the base's is not stored
    again (SmolLM2-135M: 1.6 GB a run, 11 GB for a 7-run smoke study before). Swapped in by renames
    like any checkpoint; a checkpoint already slimmed, or none, is left as it is."""
    from zfree_lab.run.checkpoint_io import load_plain_state, save_plain_state, write_checkpoint_dir

    d = out / "checkpoint"
    if not (d / "COMPLETE").is_file() or not (d / "state.json").is_file():
        return
    ck = load_plain_state(d)
    if FINISHED_KEY in ck:
        return
    tensors = load_file(str(d / "model.safetensors"))
    body = "the base's" if PARTIAL_KEY in ck else _body_record(tensors, base_dir)
    keep_body = body != "the base's"  # trained (or not comparable): the only copy of those weights
    own = {k: v.contiguous() for k, v in tensors.items() if _own(k) or keep_body}
    record = {"kept": "the run's own tensors" + (", the trained body" if keep_body else " (the body is the base's)")
                      + " and its TrainState",
              "dropped": "the optimizer state, the RNG states", "body": body, "resumable": False}

    def write(tmp: Path) -> None:
        save_file(own, str(tmp / "model.safetensors"))
        save_plain_state(tmp, {"state": ck["state"], FINISHED_KEY: record,
                               **({PARTIAL_KEY: ck[PARTIAL_KEY]} if PARTIAL_KEY in ck else {})})
    write_checkpoint_dir(d, write, previous=out / ".checkpoint.old")
    shutil.rmtree(out / ".checkpoint.old", ignore_errors=True)


def prune_finished(out: Path, keep_prev: bool = False, base_dir: Path | str | None = None) -> None:
    """A finished run keeps one checkpoint, slimmed to the record of its result (``slim_finished``;
    ``base_dir``: the base model's folder, whose weights the body is compared with):
    ``checkpoint.prev/`` (and an older version's ``.checkpoint.old/``) are removed. With
    ``keep_prev`` (``keep_prev_checkpoint``) both checkpoints are kept whole, as written."""
    if keep_prev:
        return
    for d in (out / "checkpoint.prev", out / ".checkpoint.old"):
        shutil.rmtree(d, ignore_errors=True)
    slim_finished(out, base_dir)


def disk_use(folder: Path | str) -> tuple[int, int]:
    """(bytes of the files under ``folder``, of those in checkpoint folders), symlinks not followed
    (a study's ``base/model`` links the model, never copies it)."""
    total = ckpt = 0
    for f in Path(folder).rglob("*"):
        try:
            if f.is_symlink() or not f.is_file():
                continue
            n = f.stat().st_size
        except OSError:
            continue
        total += n
        if any(part.startswith(("checkpoint", ".checkpoint")) for part in f.relative_to(folder).parts[:-1]):
            ckpt += n
    return total, ckpt
