"""The ``zfree`` command: ``main`` parses the arguments (``zfree_lab.cli.parser``), runs the command
(``zfree_lab.cli.commands``) and turns an expected error or an interrupt into one line and an exit status.
"""

from __future__ import annotations

import errno
import os
import signal
import sys

from zfree.core.errors import ZfreeError, one_line
from zfree_lab.cli.interrupts import interruptible
from zfree_lab.cli.parser import build_parser
from zfree_lab.cli.path_args import check_path_args


EXPECTED = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, KeyError)
#: errnos of the machine, not of zfree: a full disk or quota, a read-only file system, no permission
EXPECTED_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES)


def is_expected(e: BaseException) -> bool:
    """An error of the user's input or of a refusal (one line, exit 2), not a bug (traceback):
    any ``zfree.core.errors.ZfreeError`` (the trainer's ``NonFiniteLossError`` is one) and the
    builtin errors of bad values and paths, and an OSError of the disk or its permissions
    (``EXPECTED_ERRNOS``: its line names the file)."""
    return isinstance(e, (ZfreeError, *EXPECTED)) or (isinstance(e, OSError) and e.errno in EXPECTED_ERRNOS)


def _end_open_bar() -> None:
    bars = getattr(sys.modules.get("tqdm.std"), "tqdm", None)
    if bars is not None and getattr(bars, "_instances", None):  # a progress bar left its line open
        print(file=sys.stderr)


#: what to do after an interrupt, per command (the trainer names its step and run folder itself)
_RERUN = "rerun the same command: finished runs are kept (interrupted ones resume from their last checkpoint)"
INTERRUPT_HINTS = {"study": _RERUN, "sweep": _RERUN,
                   "train": "rerun the same command (interrupted before the first training step)"}


def _interrupt_line(e: KeyboardInterrupt, cmd: str) -> tuple[str, int]:
    """The one line and the exit status (128 + signal: 130 SIGINT, 143 SIGTERM) of an interrupt;
    what the stop cancelled (``e.stopped``, e.g. SLURM jobs: ``zfree_lab.experiment.executor.run_points``)
    follows "interrupted"."""
    signum = getattr(e, "signum", signal.SIGINT)
    name = signal.Signals(signum).name
    msg = getattr(e, "message", None) or INTERRUPT_HINTS.get(cmd)
    text = "interrupted" if not msg else msg if msg.startswith("interrupted") else f"interrupted; {msg}"
    if getattr(e, "stopped", None):
        text = text.replace("interrupted", f"interrupted; {e.stopped}", 1)
    return f"zfree: {text} ({name})", 128 + int(signum)


def invocation_start(argv) -> float:
    """When this invocation began (epoch seconds), the clock a study's budget and its failed-runs scan read:
    the process's start (psutil) where the process is the command (``argv`` None: the ``zfree`` script, whose
    interpreter start and imports count), else this call's time (``main([...])`` called inside a longer-lived
    process, a notebook's kernel or a test worker, whose age is not this invocation's)."""
    import time

    if argv is not None:
        return time.time()
    import psutil

    return psutil.Process().create_time()


def main(argv=None) -> int:
    """Run the ``zfree`` command; returns the exit status: 0 ok, 1 some sweep/study point failed
    (the others finished), 2 an expected error (printed as one line ``zfree: error: ...``),
    130 / 143 interrupted by SIGINT (Ctrl-C) / SIGTERM (one line saying how to resume; the
    workers stopped, the locks released, the last checkpoint kept). ``argv`` None: ``sys.argv[1:]``,
    this process being the command (``invocation_start``)."""
    started = invocation_start(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    args.started = started
    if args.cmd is None:  # bare `zfree`: the help, as `zfree --help` prints it
        parser.print_help()
        return 0
    try:
        check_path_args(args)
        with interruptible():
            code = args.func(args)
    except KeyboardInterrupt as e:  # Ctrl-C, SIGINT or SIGTERM (Interrupted)
        _end_open_bar()
        line, code = _interrupt_line(e, args.cmd)
        print(line, file=sys.stderr, flush=True)
        return code
    except BrokenPipeError:  # stdout's reader left (`zfree train --fields | head`): no traceback, the shell's code
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush does not raise again
        return 128 + 13  # SIGPIPE
    except Exception as e:  # noqa: BLE001 - expected errors become one line, the rest re-raise
        if not is_expected(e):
            raise
        _end_open_bar()
        print(f"zfree: error: {one_line(e)}", file=sys.stderr)
        return 2
    return int(code or 0)
