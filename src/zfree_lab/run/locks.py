"""One owner per folder: an OS advisory lock (``fcntl.flock``) on ``<folder>/.zfree.lock``.

The kernel releases a flock when its holder dies (even by SIGKILL), so a lock is never stale. A
second live holder, in another process or the same one (flock belongs to an open file description),
is refused with ``LockHeldError`` naming the holder's pid. Linux and macOS only (``fcntl``).
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
#: folder -> when this process first locked it: a study locks its folder for its preparation, then again for
#: its runs (and its runs/ folder), and the lock's "since" says how long the process has worked on the folder,
#: not the last lock; a folder inside one it locked before takes that one's time
_FIRST_LOCKED: dict[tuple[int, Path], str] = {}


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


def lock_owner(folder: Path | str) -> dict | None:
    """Who holds ``folder``'s lock, read from its lock file without taking the lock (taking it, even for
    a moment, could refuse a study starting at that instant): the holder's record (``pid``, ``host``,
    ``command``, ``since``) with ``alive``: True when that pid runs on this host, False when it does not
    (a holder killed by SIGKILL leaves its record, and the kernel has dropped its lock), None when the
    holder's host is another. None when nobody holds it (no lock file, or an empty one: a released lock
    is truncated). A reused pid reads as alive."""
    try:
        info = json.loads((Path(folder) / LOCK_NAME).read_text() or "null")
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or not isinstance(info.get("pid"), int):
        return None
    alive = None
    if info.get("host") == socket.gethostname():
        try:
            os.kill(info["pid"], 0)
            alive = True
        except ProcessLookupError:
            alive = False
        except PermissionError:  # another user's live process
            alive = True
    return {**info, "alive": alive}


def _open_no_link(lock_file: Path) -> int:
    """The lock file opened for writing without following a link (a symlink found there is replaced)."""
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

    Yields the lock file. Raises ``LockHeldError`` at once, without waiting, naming the holder's pid
    and host. The lock file stays after release (removing it would race with a new opener).
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
        key = (os.getpid(), folder.resolve())  # a forked worker is another process: its own key
        if key not in _FIRST_LOCKED:  # a folder inside one this process locked before (a study's runs/) takes its time
            mine = [t for (pid, f), t in _FIRST_LOCKED.items() if pid == key[0] and key[1].is_relative_to(f)]
            _FIRST_LOCKED[key] = min(mine) if mine else time.strftime("%Y-%m-%dT%H:%M:%S")
        since = _FIRST_LOCKED[key]
        info = {"pid": os.getpid(), "host": socket.gethostname(), "command": " ".join(sys.argv[:3])[:200],
                "since": since}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        try:
            yield lock_file
        finally:
            os.ftruncate(fd, 0)  # released: no pid left that could be mistaken for a holder
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


#: what marks a folder as zfree's own: the lock file it gets on first use, or a run folder's config.json
OWNER_MARKS = (LOCK_NAME, "config.json")
#: what marks a study or sweep folder as zfree's own: its lock, a study's plan.json or a sweep's spec.json
STUDY_MARKS = (LOCK_NAME, "plan.json", "spec.json")


def check_own_folder(path: Path | str, what: str = "run folder", marks: tuple[str, ...] = OWNER_MARKS) -> None:
    """ConfigError naming the folder and a few of its entries when ``path`` lies inside the installed
    package (``zfree.core.paths.check_not_in_package``) or is a non-empty folder without any of
    ``marks`` (``OWNER_MARKS`` for a run, ``STUDY_MARKS`` for a study): zfree would write over the
    user's files. A missing or empty folder, or one of zfree's, passes."""
    from zfree.core.errors import ConfigError
    from zfree.core.paths import check_not_in_package

    folder = Path(path)
    check_not_in_package(folder, what)
    if not folder.is_dir() or any(os.path.lexists(folder / m) for m in marks):
        return
    names = sorted(p.name for p in folder.iterdir())
    if names:
        shown = ", ".join(names[:4]) + (f", ... ({len(names)} entries)" if len(names) > 4 else "")
        raise ConfigError(f"{folder} is not empty and not a zfree {what} ({shown}; no {' or '.join(marks)}): "
                          f"zfree would write its files over these; give a new or empty folder")


def claim_folder(path: Path | str, what: str = "run folder", marks: tuple[str, ...] = OWNER_MARKS) -> Path:
    """``check_own_folder``, then mark ``path`` as zfree's own (created if missing) by taking and
    releasing its lock, for a caller that writes into it before the code that locks it. Returns ``path``."""
    check_own_folder(path, what, marks)
    with run_folder_lock(path, what):
        pass
    return Path(path)
