"""Progress where the user sees it: a bar on a terminal, tqdm's widget in a notebook, and in a log (nohup,
SLURM, CI, a redirected ``2>`` file) plain lines, at most one a minute.

A tqdm bar redraws itself with carriage returns; in a log file those joined every update of a 300-step
fine-tune into one line of tens of kB that neither ``tail`` nor an editor shows usefully. Every progress bar
of zfree and zfree_lab is made here, so the choice "terminal, notebook or log" is made in one place.
"""

from __future__ import annotations

import contextlib
import sys
import time

from tqdm.auto import tqdm
from tqdm.std import tqdm as std_tqdm

#: seconds between two lines of a bar in a log (a bar on a terminal redraws at its own ``mininterval``)
LOG_EVERY_S = 60.0


def on_terminal() -> bool:
    """True when stderr (where bars and progress lines go) is a terminal."""
    return sys.stderr.isatty()


def in_a_notebook() -> bool:
    """True when ``tqdm.auto`` picked the notebook widget (a Jupyter kernel with ipywidgets)."""
    return tqdm.__module__ == "tqdm.notebook"


def in_a_log(progress: bool = True) -> bool:
    """True when progress is wanted and goes to a log: neither a terminal nor a notebook's widget."""
    return progress and not on_terminal() and not in_a_notebook()


def log_line(text: str, detail: str = "") -> None:
    """One progress line on stderr, stamped with the wall-clock time, flushed: ``text (detail, 12:34:56)``,
    or ``text (12:34:56)`` without ``detail``."""
    stamp = time.strftime("%H:%M:%S")
    print(f"{text} ({detail + ', ' if detail else ''}{stamp})", file=sys.stderr, flush=True)


class _Lines:
    """A stream for a tqdm bar in a log: each redraw (``\\r`` + the bar) becomes one line; blank redraws
    (tqdm's clearing of a bar) are dropped."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, s: str) -> int:
        text = s.replace("\r", "").replace("\x1b[A", "").strip()
        if text:
            self._stream.write(text + "\n")
        return len(s)

    def flush(self) -> None:
        self._stream.flush()


class _LogBar(std_tqdm):
    """tqdm in a log: a state (count and postfix) already written is not written again (the last evaluation's
    line and the bar's closing line were the same state)."""

    _shown = None

    def display(self, msg=None, pos=None):
        state = (self.n, self.postfix)
        if msg is None and state == self._shown:
            return True
        self._shown = state
        return super().display(msg, pos)


def bar(*, total: int, desc: str, progress: bool = True, initial: int = 0, mininterval: float = 0.1,
        terminal_only: bool = False, **kw) -> tqdm:
    """A tqdm bar for ``total`` steps named ``desc``.

    On a terminal and in a notebook: tqdm.auto's bar with ``mininterval`` (seconds between redraws). In a log:
    one plain line at most every ``LOG_EVERY_S`` seconds (or ``mininterval`` if longer), the last state when
    it closes, none at all when ``terminal_only`` (a short bar that would only add noise: the scoring of the
    reference). ``progress=False``: no bar (a disabled tqdm; ``update`` and ``set_postfix`` still work).
    Other keywords go to tqdm."""
    log = in_a_log(progress)
    if not progress or (log and terminal_only):
        return tqdm(total=total, initial=initial, desc=desc, disable=True, **kw)
    if log:
        return _LogBar(total=total, initial=initial, desc=desc, file=_Lines(sys.stderr), ncols=100,
                       mininterval=max(mininterval, LOG_EVERY_S), maxinterval=float("inf"), ascii=True, **kw)
    return tqdm(total=total, initial=initial, desc=desc, mininterval=mininterval, **kw)


@contextlib.contextmanager
def hf_bars_only_on_a_terminal():
    """Inside: transformers' own bars ("Loading weights", "Writing model shards") where stderr is a terminal
    or a notebook, none in a log; restored after. transformers is imported only when this is entered."""
    from transformers.utils import logging as hf_logging

    off = in_a_log() and hf_logging.is_progress_bar_enabled()
    if off:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if off:
            hf_logging.enable_progress_bar()
