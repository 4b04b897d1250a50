"""Why a notebook kernel died: the peak resident memory of a worker's kernels is polled
while a point runs (``KernelWatch``), so a kernel killed for memory leaves error.json saying so (its
peak RSS, the machine's limit) instead of papermill's bare 'DeadKernelError: Kernel died'."""

from __future__ import annotations

import os
import threading
from contextlib import suppress

GB = 2**30


class KernelWatch:
    """A context manager polling the summed RSS of this process's descendants (the notebook kernel)
    every ``every`` seconds; ``peak`` holds the largest in bytes."""

    def __init__(self, every: float = 0.5):
        self.every, self.peak = every, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psutil  # lazy: only a running point needs it

        me = psutil.Process(os.getpid())
        while not self._stop.is_set():
            with suppress(psutil.Error):
                self.peak = max(self.peak, sum(p.memory_info().rss for p in me.children(recursive=True)))
            self._stop.wait(self.every)

    def __enter__(self) -> "KernelWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


def died_message(e: BaseException, peak: int) -> str | None:
    """The one-line reason of a kernel that died (papermill's DeadKernelError), else None: killed,
    most likely for memory, with its peak RSS and the machine's memory (total, available now)."""
    if type(e).__name__ != "DeadKernelError" and "Kernel died" not in str(e):
        return None
    import psutil

    vm = psutil.virtual_memory()
    return (f"the notebook kernel was killed (most likely for memory: its peak RSS {peak / GB:.2f} GB; this machine "
            f"has {vm.total / GB:.1f} GB, {vm.available / GB:.1f} GB available now); rerun with fewer workers "
            "(--workers 1), a smaller batch_size or micro_batch, or a smaller model")
