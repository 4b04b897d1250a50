"""Signals as exceptions: for the length of a ``with interruptible():`` block, SIGINT (Ctrl-C) and
SIGTERM raise ``zfree.core.errors.Interrupted`` in the main thread, so ``finally`` blocks release
the locks, stop the workers and keep the last checkpoint; ``zfree_lab.cli.main`` turns it into one line
and exit 128 + signal (130 / 143)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager

from zfree.core.errors import Interrupted


def _on_signal(signum, frame):  # noqa: ARG001 - the signal module's signature
    """SIGINT/SIGTERM: raise ``Interrupted`` in the main thread (the ``finally`` blocks release the
    locks and stop the workers); a second signal while that cleanup runs exits at once."""
    signal.signal(signal.SIGINT, _exit_now)
    signal.signal(signal.SIGTERM, _exit_now)
    raise Interrupted(signum)


def _exit_now(signum, frame):  # noqa: ARG001
    print(f"zfree: interrupted again (signal {signum}): exiting now", file=sys.stderr, flush=True)
    os._exit(128 + signum)


@contextmanager
def interruptible():
    """SIGINT and SIGTERM raise ``Interrupted`` for the command's duration (main thread only;
    the previous handlers are restored after it, as for a test calling ``main`` in process)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
