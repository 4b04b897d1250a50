"""What a checkpoint's ``model.safetensors`` holds: the whole model for full
fine-tuning (safetensors' ``save_model``, tied weights once), only what trains for a LoRA run
(``zfree.models.lora.trainable_tensors``: adapters, heads, latent embeddings), the frozen base
referenced by the sha256 of its weights; and a finished run's checkpoints pruned to one.

SmolLM2-135M measured (README "Real models that fit the machine"): a full checkpoint is the whole
model plus Adam's two moments per weight; a LoRA one a few MB.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from zfree.core.io import sha256_state_dict
from zfree.models.lora import base_state_dict, has_lora, load_trainable, trainable_tensors

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
    if not has_lora(model):
        raise RuntimeError(f"{path} holds LoRA adapters but the run's model has none (lora_rank=0)")
    if part.get("frozen_base_sha256") != frozen_base_sha(model):
        raise RuntimeError(f"{path} was trained over another frozen base (sha256 "
                           f"{str(part.get('frozen_base_sha256'))[:12]}..., loaded {frozen_base_sha(model)[:12]}...)")
    load_trainable(model, load_file(str(path)))


def prune_finished(out: Path, keep_prev: bool = False) -> None:
    """A finished run keeps one checkpoint (``checkpoint/``): ``checkpoint.prev/`` (and an older
    version's ``.checkpoint.old/``) are removed unless ``keep_prev`` (``keep_prev_checkpoint``)."""
    if keep_prev:
        return
    for d in (out / "checkpoint.prev", out / ".checkpoint.old"):
        shutil.rmtree(d, ignore_errors=True)
