"""Device placement checks without a GPU (issue 16): ``FactoryRecorder`` records every tensor
factory call (torch.zeros, ones, full, empty, arange, tensor, as_tensor, rand*, eye, linspace,
...) made under it, with its ``device=`` argument and the innermost zfree frame, and every
tensor an op returns on a device other than the expected one.

On a CPU-only machine a tensor built without ``device=`` lands on the CPU and looks right; on
CUDA it would be on the wrong device (a cross-device error, or a silent host round trip). So a
factory call without an explicit device, or with one that is not the model's, is a placement
bug whichever machine runs the test."""

from __future__ import annotations

import functools
import os

import torch
from torch.overrides import TorchFunctionMode

import zfree
import zfree_lab.run

FACTORIES = {torch.zeros, torch.ones, torch.full, torch.empty, torch.arange, torch.tensor, torch.as_tensor,
             torch.randn, torch.rand, torch.randint, torch.eye, torch.linspace, torch.scalar_tensor}
_PASS_THROUGH = {torch.as_tensor}  # as_tensor(t) of a tensor keeps t's device


#: the folders of the library and of the lab's run (``zfree_lab.run``: the training loop and the run's
#: evaluation): frames are told apart by them, never by a path's text (a clone whose folder is named
#: ``zfree`` holds the tests under ``.../zfree/tests``, which contains "/zfree/" too)
_PACKAGE = os.path.dirname(os.path.realpath(zfree.__file__))
_RUN = os.path.dirname(os.path.realpath(zfree_lab.run.__file__))
_SRC = os.path.dirname(_PACKAGE)


@functools.lru_cache(maxsize=None)
def _in_package(filename: str) -> bool:
    """True for a source file inside the installed zfree package or zfree_lab.run (editable or not)."""
    real = os.path.realpath(filename)  # "<frozen ...>" and "<string>" resolve under the cwd: not the package
    return any(os.path.commonpath([real, top]) == top for top in (_PACKAGE, _RUN))


#: torch.optim's own folder: AdamW keeps each parameter's step count as a host scalar
#: (``torch.tensor(0.0)`` in ``_init_group``, updated in place) unless ``capturable`` or ``fused`` is set, by
#: design (the update reads it on the host); the lent H200 showed it as the only "host tensor" of a CUDA
#: step (tests/test_gpu.py, 2026-12-04). Calls made from there are torch's placement, not zfree's.
_TORCH_OPTIM = os.path.dirname(os.path.realpath(torch.optim.__file__))


def _from_torch_optim() -> bool:
    """True when the innermost Python frame outside this file is in torch.optim."""
    import sys

    f = sys._getframe(1)
    while f is not None and os.path.realpath(f.f_code.co_filename) == os.path.realpath(__file__):
        f = f.f_back
    return f is not None and os.path.realpath(f.f_code.co_filename).startswith(_TORCH_OPTIM + os.sep)


def _where() -> str:
    """The zfree frames of the current stack, innermost first: ``file:line qualname`` joined by
    " < ", the innermost with its source line."""
    import linecache
    import sys

    chain, f = [], sys._getframe(2)
    while f is not None:
        fn = f.f_code.co_filename
        if _in_package(fn):
            where = f"{os.path.relpath(os.path.realpath(fn), _SRC)}:{f.f_lineno} {f.f_code.co_qualname}"
            if not chain:
                where += f": {linecache.getline(fn, f.f_lineno).strip()}"
            chain.append(where)
        f = f.f_back
    return " < ".join(chain) or "(outside zfree)"


class FactoryRecorder(TorchFunctionMode):
    """Under ``with FactoryRecorder(device) as rec``: ``rec.bad_factories`` lists (function,
    device argument, zfree frame) of factory calls whose device is missing or not ``device``;
    with ``check_outputs``, ``rec.bad_outputs`` lists ops whose returned tensor is elsewhere."""

    def __init__(self, device, check_outputs: bool = True):
        super().__init__()
        self.device = torch.device(device)
        self.check_outputs = check_outputs
        self.bad_factories: list[tuple[str, object, str]] = []
        self.bad_outputs: list[tuple[str, str, str]] = []
        self.n_factories = 0

    def _same(self, dev) -> bool:
        d = torch.device(dev)
        return d.type == self.device.type and (d.index or 0) == (self.device.index or 0)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _from_torch_optim():  # the optimizer's host-side step counts (``_TORCH_OPTIM``)
            return func(*args, **kwargs)
        if func in FACTORIES:
            self.n_factories += 1
            dev = kwargs.get("device")
            tensor_arg = func in _PASS_THROUGH and args and isinstance(args[0], torch.Tensor)
            if not tensor_arg and (dev is None or not self._same(dev)):
                self.bad_factories.append((func.__name__, dev, _where()))
        out = func(*args, **kwargs)
        if self.check_outputs and isinstance(out, torch.Tensor) and not self._same(out.device) \
                and getattr(func, "__name__", "") not in ("cpu", "numpy", "tolist", "item"):
            self.bad_outputs.append((getattr(func, "__name__", str(func)), str(out.device), _where()))
        return out
