"""Mixed precision of the CVAE step (``optim.precision``): the backbone body under bfloat16
autocast, everything from the output head on in float32.

Under ``bf16`` the transformer body's matmuls run in bfloat16 (``torch.autocast``; the weights and
the optimizer stay float32), the output head runs in float32 regardless (``zfree.models.head``
disables autocast there), and ``model_outputs_fp32`` casts every floating output of the model's
forward (posterior / router logits, Gaussian parameters, features) to float32 before the
objective is assembled outside autocast, so log-softmax, the KLs and the losses are float32 as in
``zfree.reference.scoring``. Evaluation is not autocast (its metrics compare with the float32 reference).
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

#: optim.precision -> the autocast dtype of the body (None: no autocast). ``fp64`` is the reference
#: mode: weights, optimizer, head, log-softmax and losses in float64 (slow; for checks against
#: float32 and the portable golden runs, tests/golden_runs.py, where CPU kernels differ by ~1e-16)
PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp64": None}
#: optim.precision -> the dtype the weights are loaded in (``zfree.models.loading.DTYPES`` names)
WEIGHT_DTYPES: dict[str, str] = {"fp32": "float32", "bf16": "float32", "fp64": "float64"}


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """Build modules with parameters of ``dtype`` (``torch.set_default_dtype`` inside, restored on
    exit). Initialising a float64 model directly in float64 keeps its random init portable: the
    float32 normal sampler rounds differently between CPU kernels (~3e-7 relative between the
    vectorised and the scalar path), the float64 one only at ~1e-16."""
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
    """``out`` (a model-output dataclass, possibly nested) with every floating tensor of a dtype
    other than float32/float64 cast to float32, in place; float32 tensors are left as they are
    (the same objects: an fp32 run is unchanged bit for bit). Returns ``out``."""
    if not dataclasses.is_dataclass(out):
        return out
    for f in dataclasses.fields(out):
        v = getattr(out, f.name)
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dtype not in (torch.float32, torch.float64):
            setattr(out, f.name, v.float())
        elif dataclasses.is_dataclass(v):
            model_outputs_fp32(v)
    return out
