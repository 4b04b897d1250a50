"""Mixed precision of the CVAE step (``optim.precision``): the backbone body in bfloat16,
everything that trains and everything from the output head on in float32.

Under ``bf16`` the body's matmuls run in bfloat16 (``torch.autocast`` around the step's forward); the
output head runs in float32 regardless (``zfree.models.head``), and ``model_outputs_fp32`` casts the
forward's outputs to float32 before the objective, so log-softmax, KLs and losses are float32.

  frozen body (LoRA)   the frozen weights are *stored* in bfloat16 (``store_frozen_weights``): no cast
                       per call, half the memory; what trains (adapters, latent embeddings, route,
                       heads: their inputs cast up, ``heads_input``) stays float32.
  trained body         float32 master weights and optimizer state under bfloat16 autocast (AdamW's
                       small updates would round away in bfloat16 weights).

Evaluation is not autocast (a bfloat16-stored body takes the low-precision step-0 tolerance,
``zfree.reference.reference.RHO0_TOL_LOW_PRECISION``); only the CUDA training step uses TF32
(``tf32_matmuls``).
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

#: optim.precision -> the autocast dtype of the body (None: no autocast). ``fp64``: the reference mode,
#: everything in float64 (the portable golden runs, docs/howto/reproducibility.md)
PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp64": None}
#: optim.precision -> the dtype the weights are loaded in (``zfree.models.loading.DTYPES`` names)
WEIGHT_DTYPES: dict[str, str] = {"fp32": "float32", "bf16": "float32", "fp64": "float64"}
#: optim.precision -> the dtype the *frozen* body weights are stored in once the run is built (None:
#: as loaded); a trained body keeps ``WEIGHT_DTYPES`` (module docstring)
FROZEN_DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp64": None}


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """Build modules with parameters of ``dtype`` (``torch.set_default_dtype`` inside, restored on
    exit): a float64 model initialised in float64 has a random init portable across CPU kernels."""
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(prev)


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the output head, log-softmax and losses run in for a model (or tensor) of ``dtype``:
    float64 for a float64 model (the ``fp64`` reference mode), float32 for every other dtype
    (float32, and the bfloat16 / float16 bodies of mixed precision)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def store_frozen_weights(module: torch.nn.Module, dtype: torch.dtype | None) -> int:
    """Store every parameter of ``module`` that does not require grad in ``dtype``, in place; trained
    parameters and buffers are left as they are; ``dtype`` None: nothing. Returns the elements cast.
    Call after ``apply_lora`` and before the optimizer is built."""
    if dtype is None:
        return 0
    n = 0
    for p in module.parameters():  # parameters() yields a shared (tied) parameter once
        if not p.requires_grad and p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)
            n += p.numel()
    return n


def heads_input(h: torch.Tensor) -> torch.Tensor:
    """The body's hidden states as the float32 heads read them (``acc_dtype``): a bfloat16 / float16
    body's cast up; float32 and float64 returned as they are (the same object)."""
    acc = acc_dtype(h.dtype)
    return h if h.dtype == acc else h.to(acc)


@contextlib.contextmanager
def tf32_matmuls(device: torch.device | str):
    """Inside: float32 matrix products and convolutions on CUDA may use TF32 tensor cores (10-bit
    mantissa, float32 accumulation); restored on exit. On any other device nothing changes."""
    if torch.device(device).type != "cuda":
        yield
        return
    prev = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A host tensor on ``device`` without a host round-trip: on CUDA a non-blocking copy from pinned
    memory; on the CPU ``t`` itself; elsewhere a plain copy."""
    device = torch.device(device)
    if device.type == "cpu" or t.device == device:
        return t
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def body_autocast(precision: str, device: torch.device | str):
    """A context manager for the model's forward: nothing for ``fp32``, bfloat16 autocast on
    ``device``'s type for ``bf16`` (CPU allowed, slower there). Raises KeyError listing the precisions."""
    if precision not in PRECISIONS:
        raise KeyError(f"precision={precision!r} is not one of {sorted(PRECISIONS)}")
    dtype = PRECISIONS[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


def model_outputs_fp32(out):
    """``out`` (a model-output dataclass, possibly nested) with every floating tensor other than
    float32/float64 cast to float32, in place (float32 tensors are the same objects). Returns ``out``."""
    if not dataclasses.is_dataclass(out):
        return out
    for f in dataclasses.fields(out):
        v = getattr(out, f.name)
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dtype not in (torch.float32, torch.float64):
            setattr(out, f.name, v.float())
        elif dataclasses.is_dataclass(v):
            model_outputs_fp32(v)
    return out
