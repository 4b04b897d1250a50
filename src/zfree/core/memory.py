"""Peak bytes of live tensor storage during a block of code: a deterministic memory measure.

``LiveTensorBytes`` is a ``TorchDispatchMode``: every storage an operator returns (forward and, for
CPU tensors, backward) counts from its creation until it is freed. Unlike resident-set sampling it
depends on no allocator, timing or other process, so tests can assert bounds with it. Storages
created before the block are not counted; ``.grad`` buffers created inside are. One Python call per
operator: never time code under it.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveTensorBytes(TorchDispatchMode):
    """``with LiveTensorBytes() as m: ...`` then ``m.peak`` (bytes): the high-water mark of the
    summed ``nbytes`` of storages created inside the block and not yet freed; ``m.current`` is what
    is still alive. Counts each storage once (views share it)."""

    def __init__(self):
        super().__init__()
        self.current = 0
        self.peak = 0
        self._live: dict[int, weakref.finalize] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self._track(t.untyped_storage())
        return out

    def _track(self, storage) -> None:
        key = id(storage)
        if key in self._live:
            return
        n = storage.nbytes()
        self.current += n
        self.peak = max(self.peak, self.current)
        self._live[key] = weakref.finalize(storage, self._free, key, n)

    def _free(self, key: int, n: int) -> None:
        self.current -= n
        self._live.pop(key, None)

    @property
    def peak_mib(self) -> float:
        """``peak`` in MiB (2**20 bytes)."""
        return self.peak / 2**20
