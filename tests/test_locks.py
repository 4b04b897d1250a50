"""One owner per folder: a second holder is refused naming the first one's pid; a lock left by a
SIGKILLed process is taken over."""

from __future__ import annotations

import json
import re
import os
import signal
import subprocess
import sys
import time

import pytest

from zfree.core.errors import LockHeldError
from zfree_lab.run.locks import LOCK_NAME, run_folder_lock

HOLD = """
import sys, time
from zfree_lab.run.locks import run_folder_lock
with run_folder_lock(sys.argv[1], "sweep folder"):
    print("held", flush=True)
    time.sleep(120)
"""


def hold_lock(folder) -> subprocess.Popen:
    """A child process holding ``folder``'s lock (returns once it holds it)."""
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_second_holder_in_the_same_process_is_refused(tmp_path):
    with run_folder_lock(tmp_path, "run folder"):
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
        with pytest.raises(LockHeldError, match=re.escape(f"run folder {tmp_path} is in use by pid {os.getpid()}")):
            with run_folder_lock(tmp_path):
                pass
    with run_folder_lock(tmp_path):  # released on exit
        pass


def test_other_process_is_named_and_a_killed_holders_lock_is_taken_over(tmp_path):
    holder = hold_lock(tmp_path)
    try:
        with pytest.raises(LockHeldError, match=f"pid {holder.pid}"):
            with run_folder_lock(tmp_path):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    t0 = time.time()
    with run_folder_lock(tmp_path):  # the kernel dropped the dead process's flock: no stale lock
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert time.time() - t0 < 5


def test_a_folder_locked_again_by_the_same_process_keeps_its_first_since(tmp_path, monkeypatch):
    """A study locks its folder for its preparation, then again for its runs: `zfree status` said "study process:
    pid N, since <when the runs began>" of a process that had been preparing for 50 minutes. The lock now says
    when this process first locked the folder; another folder keeps its own time."""
    from zfree_lab.run import locks

    stamps = iter(["2026-12-07T13:39:14", "2026-12-07T14:29:03", "2026-12-07T14:30:00"])
    monkeypatch.setattr(locks.time, "strftime", lambda fmt, *a: next(stamps))
    seen = []
    for folder in (tmp_path / "study", tmp_path / "study", tmp_path / "other"):
        with locks.run_folder_lock(folder) as lock_file:
            seen.append(json.loads(lock_file.read_text())["since"])
    assert seen == ["2026-12-07T13:39:14", "2026-12-07T13:39:14", "2026-12-07T14:29:03"]
    # the study's runs/ folder, locked once its preparation ended, takes the study folder's time: `zfree status`,
    # which reads the runs/ lock while the runs train, said "since" the end of the preparation (a new user's trial)
    with locks.run_folder_lock(tmp_path / "study" / "runs", "runs folder") as lock_file:
        assert json.loads(lock_file.read_text())["since"] == "2026-12-07T13:39:14"
    with locks.run_folder_lock(tmp_path / "studyx", "study folder") as lock_file:  # a sibling, not inside: its own
        assert json.loads(lock_file.read_text())["since"] == "2026-12-07T14:30:00"
