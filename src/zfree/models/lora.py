"""LoRA adapters on the backbone: the base weights frozen and shared, a low-rank update
``W x + (alpha / r) B A x`` trained in their place (Hu et al. 2021, "LoRA: Low-Rank Adaptation of
Large Language Models", eq. 3), injected in place by ``peft.inject_adapter_in_model`` so the backbone
keeps its class and its forward (the latent injection, the shared-prefix cache and the model's own
head path see the same modules).

Exact at step 0: peft starts B at zero (``init_lora_weights=True``), so the adapted backbone computes
the base model's function exactly and rho_recon = 1 at step 0, as for full fine-tuning. Dropout is 0
(the objective stays deterministic, the K decoder passes see one function).

A checkpoint of a LoRA run holds only what trains (``trainable_tensors``: adapters, heads, latent
embeddings) and the optimizer state; the frozen base is referenced by the sha256 of its weights
(``base_state_dict``: the backbone's state dict under the base model's own names, adapters dropped),
which config.json records and a resume checks.
"""

from __future__ import annotations

import torch

#: what peft inserts into a parameter's name: its adapter weights (dropped from the base state),
#: and the wrapped base layer (the original name without it)
LORA_MARK, BASE_LAYER = "lora_", ".base_layer"


def lora_targets(backbone: torch.nn.Module, targets: str) -> list[str] | str:
    """The module names LoRA adapts: ``targets`` given as comma-separated module names (e.g.
    ``q_proj,v_proj``), or "auto": peft's per-architecture default (GPT-2 ``c_attn``, Llama
    ``q_proj,v_proj``, ...), else peft's "all-linear" (every linear layer but the output head).
    Raises ValueError naming ``lora_targets`` when a given name matches no module of the backbone."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    if targets != "auto":
        names = [t.strip() for t in targets.split(",") if t.strip()]
        present = {n.rsplit(".", 1)[-1] for n, _ in backbone.named_modules()}
        missing = [t for t in names if t not in present]
        if missing or not names:
            raise ValueError(f"lora_targets={targets!r}: {missing or 'no name'} is no module of the backbone "
                             f"({type(backbone).__name__})")
        return names
    model_type = getattr(getattr(backbone, "config", None), "model_type", None)
    return list(DEFAULTS.get(model_type, [])) or "all-linear"


def apply_lora(backbone: torch.nn.Module, rank: int, alpha: float, targets: str = "auto") -> list[str]:
    """Inject rank-``rank`` LoRA adapters (scale ``alpha / rank``, dropout 0, B = 0 so the function
    is unchanged) into ``backbone`` in place and freeze every other backbone weight; returns the
    names of the trainable adapter parameters. ``fan_in_fan_out`` is set for GPT-2's Conv1D
    layers (weights stored (in, out)). Raises ValueError for rank < 1 or unknown targets."""
    from peft import LoraConfig, inject_adapter_in_model

    if not isinstance(rank, int) or rank < 1:
        raise ValueError(f"lora_rank={rank!r} must be an integer >= 1 to apply LoRA")
    conv1d = any(type(m).__name__ == "Conv1D" for m in backbone.modules())
    cfg = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=lora_targets(backbone, targets),
                     fan_in_fan_out=conv1d, bias="none", init_lora_weights=True)
    inject_adapter_in_model(cfg, backbone)
    for name, p in backbone.named_parameters():
        p.requires_grad_(LORA_MARK in name)
    return [n for n, p in backbone.named_parameters() if p.requires_grad]


def has_lora(module: torch.nn.Module) -> bool:
    """True when ``module`` holds LoRA adapter parameters."""
    return any(LORA_MARK in n for n, _ in module.named_parameters())


def base_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``module.state_dict()`` without the adapters and under the base model's own names
    (``...c_attn.base_layer.weight`` -> ``...c_attn.weight``): equal, key for key, to the state
    dict of the model before ``apply_lora``, so its hash is the frozen base's."""
    return {k.replace(BASE_LAYER, ""): v for k, v in module.state_dict().items() if LORA_MARK not in k}


def trainable_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """name -> detached contiguous tensor of every parameter that trains (``requires_grad``) and of
    every saved buffer outside the backbone (BN-VAE's running statistics, which training updates):
    what a partial checkpoint stores (adapters, heads, latent embeddings; a few MB over a frozen base)."""
    out = {n: p.detach().contiguous() for n, p in model.named_parameters() if p.requires_grad}
    state = model.state_dict(keep_vars=True)
    out.update({n: b.detach().contiguous() for n, b in model.named_buffers()
                if not n.startswith("backbone.") and n in state})
    return out


def load_trainable(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Load a partial checkpoint (``trainable_tensors``) into ``model``. Raises RuntimeError when
    it names a tensor the model lacks, or leaves a trainable parameter unset (another run's file)."""
    trains = {n for n, p in model.named_parameters() if p.requires_grad}
    missing, unexpected = trains - set(tensors), set(tensors) - set(model.state_dict())
    if missing or unexpected:
        raise RuntimeError(f"partial checkpoint does not fit: missing {sorted(missing)[:5]}, "
                           f"unexpected {sorted(unexpected)[:5]}")
    model.load_state_dict(tensors, strict=False)
