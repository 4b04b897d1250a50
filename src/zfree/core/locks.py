"""One owner per folder: an OS advisory lock (``fcntl.flock``) on ``<folder>/.zfree.lock``.

The kernel releases a flock when the holding process dies (even by SIGKILL), so a lock left
by a killed process is never stale: the next process simply takes it and overwrites the pid
recorded in the file. A second live process is refused with ``LockHeldError`` naming the
holder's pid. flock locks belong to an open file description: a second ``run_folder_lock`` on
the same folder from the same process is refused too (it would be a second writer).

Linux and macOS only (``fcntl``); on NFS, Linux emulates flock with POSIX byte-range locks.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from zfree.core.errors import LockHeldError

LOCK_NAME = ".zfree.lock"


def _holder(lock_file: Path) -> str:
    """Who holds ``lock_file``, read from its contents (the holder writes them right after locking)."""
    for _ in range(20):  # the holder may be between flock() and write()
        try:
            info = json.loads(lock_file.read_text() or "null")
        except (OSError, ValueError):
            info = None
        if isinstance(info, dict) and "pid" in info:
            return f"pid {info['pid']} on {info.get('host', '?')} ({info.get('command', '?')}, since {info.get('since', '?')})"
        time.sleep(0.05)
    return "an unknown process"


def _open_no_link(lock_file: Path) -> int:
    """The lock file opened for writing without following a link: zfree never makes it a symlink,
    so one found there was planted and is replaced by a regular file (its target is never written)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        return os.open(lock_file, flags, 0o644)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        lock_file.unlink()
        return os.open(lock_file, flags | os.O_EXCL, 0o644)


@contextmanager
def run_folder_lock(path: Path | str, what: str = "run folder") -> Iterator[Path]:
    """Hold the exclusive lock on folder ``path`` (created if missing) for the ``with`` block.

    Yields the lock file. Raises ``LockHeldError`` ("<what> <path> is in use by pid N on HOST
    (...)") at once, without waiting, when another open lock holds it. The lock file stays
    behind after release (removing it would race with a process that has just opened it).
    """
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    lock_file = folder / LOCK_NAME
    fd = _open_no_link(lock_file)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LockHeldError(f"{what} {folder} is in use by {_holder(lock_file)}; "
                                f"wait for it to finish or stop that process") from None
        info = {"pid": os.getpid(), "host": socket.gethostname(), "command": " ".join(sys.argv[:3])[:200],
                "since": time.strftime("%Y-%m-%dT%H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        try:
            yield lock_file
        finally:
            os.ftruncate(fd, 0)  # released: no pid left that could be mistaken for a holder
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
