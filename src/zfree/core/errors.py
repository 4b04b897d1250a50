"""Expected errors: the ones ``zfree`` reports as one line ``zfree: error: ...`` with exit 2.

A ``ZfreeError`` is a problem with the user's input, config or files (or a refusal, such as a locked
folder), not a bug: the CLI prints its message on one line, never a traceback. The subclasses that
are also ``ValueError`` stay catchable as such.
"""

from __future__ import annotations


class ZfreeError(Exception):
    """Base of every expected zfree error; the message names the file, field or row at fault."""


class ConfigError(ZfreeError, ValueError):
    """A config value, ``--set`` override, sweep spec or notebook parameter is malformed."""


class InputError(ZfreeError, ValueError):
    """An input file (data, reference, spec) is malformed; the message names the file and row."""


class LockHeldError(ZfreeError):
    """A run or sweep folder is owned by another live process (the message names its pid)."""


class CheckpointError(ZfreeError):
    """A checkpoint cannot be loaded (truncated, empty, not plain data); names the file."""


class ResumeRefusedError(ZfreeError, ValueError):
    """A run folder holds another config (or an unusable state) and will not be reused."""


class ModelLoadError(ZfreeError, ValueError):
    """A model zfree cannot use (one-line message naming the model and the reason)."""


class NonFiniteMetricError(ZfreeError):
    """An evaluation produced a non-finite metric; the run stops before checkpointing it."""


def one_line(e: BaseException) -> str:
    """The message of ``e`` on one line (newlines folded), as the CLI prints it."""
    msg = str(e) if not isinstance(e, KeyError) or not e.args else str(e.args[0])
    return " ".join(part.strip() for part in msg.splitlines() if part.strip()) or type(e).__name__


class Interrupted(KeyboardInterrupt):
    """SIGINT (Ctrl-C) or SIGTERM reached a zfree command (the CLI exits 128 + signal: 130 or 143).
    A KeyboardInterrupt, so ``except Exception`` never swallows it. ``message``: what to do next
    (e.g. "interrupted at step N; resume with ..."), else the command's own hint."""

    def __init__(self, signum: int = 2, message: str | None = None):
        super().__init__(message or f"signal {signum}")
        self.signum, self.message = signum, message


class CheckpointWriteError(ZfreeError):
    """A checkpoint or a metrics row could not be written (disk full, read-only, quota); the last
    good checkpoint is kept and ``error.json`` in the run folder says so (when it still fits)."""


class FolderWriteError(ZfreeError):
    """A study folder could not be written (disk full, quota): the message names the folder, what was
    kept and how to go on."""
