"""LoRA adapters on a frozen backbone (Hu et al. 2021, eq. 3; docs/howto/lora.md).

A low-rank update ``W x + (alpha / r) B A x`` trained in place of the base weights ("LoRA: Low-Rank
Adaptation of Large Language Models"), injected by ``peft.inject_adapter_in_model`` so the backbone
keeps its class and forward.

Exact at step 0 (B starts at zero) and deterministic (dropout 0). A LoRA checkpoint holds only what
trains (``trainable_tensors``); the frozen base is referenced by the sha256 of ``base_state_dict``.
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
    """Inject rank-``rank`` LoRA adapters (scale ``alpha / rank``, dropout 0, B = 0) into ``backbone`` in
    place and freeze every other backbone weight; returns the trainable adapter parameters' names.
    Raises ValueError for rank < 1 or unknown targets."""
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
    """name -> detached contiguous tensor of every parameter that trains and every saved buffer outside
    the backbone (BN-VAE's running statistics): what a partial checkpoint stores."""
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
