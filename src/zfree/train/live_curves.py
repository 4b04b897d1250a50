"""Live curves: every evaluation row a run appends to ``metrics.jsonl`` is also written as TensorBoard
scalars, in event files beside it (the run folder), one scalar per numeric key at the row's own
``step``. ``tensorboard --logdir STUDY`` then lists a study's or sweep's runs by their folders
(``runs/<run_id>``) while they train. Off with the config field ``tensorboard = False``; without
the ``tensorboard`` package nothing is written (one note says so).

A resumed run continues its event files: the writer's ``purge_step`` (the checkpoint's step + 1)
hides what the interrupted session logged after its checkpoint, as ``metrics.jsonl`` is cut there
(``zfree.train.run_folder.reset_metrics``); a fresh run removes the event files of an earlier one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: the file names TensorBoard's event writer gives its files
EVENT_GLOB = "events.out.tfevents.*"

_noted = False


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The TensorBoard scalars of a metrics row: every int, float or bool value (bools as 0/1) but
    ``step``; None, strings and lists are not scalars and are left out."""
    return {k: float(v) for k, v in row.items() if k != "step" and isinstance(v, (int, float, bool))}


class LiveCurves:
    """A TensorBoard writer of one run folder (``open_curves``): ``log(step, row)`` per evaluation,
    flushed at once (a crash loses nothing already in metrics.jsonl); ``close()`` at the run's end."""

    def __init__(self, writer):
        self._w = writer

    def log(self, step: int, row: dict[str, Any]) -> None:
        """Write every scalar of ``row`` (``scalars``) at ``step`` (the evaluation's training step)."""
        for tag, value in scalars(row).items():
            self._w.add_scalar(tag, value, global_step=step)
        self._w.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self._w.close()


def open_curves(out: Path, enabled: bool, resumed_step: int | None) -> LiveCurves | None:
    """The run folder ``out``'s TensorBoard writer, or None when ``enabled`` is False or the
    tensorboard package is missing (a one-time note on stdout). ``resumed_step``: the checkpoint's
    step of a resumed run (later events of the earlier session are purged), None for a fresh run
    (earlier event files removed)."""
    global _noted
    if not enabled:
        return None
    if resumed_step is None:
        for f in Path(out).glob(EVENT_GLOB):
            f.unlink(missing_ok=True)
    try:
        from torch.utils.tensorboard import SummaryWriter  # imports tensorboard (an optional dependency)
    except ImportError:
        if not _noted:
            print("note: the tensorboard package is not installed: no live curves (pip install tensorboard, "
                  "or set tensorboard=False)", flush=True)
            _noted = True
        return None
    purge = None if resumed_step is None else resumed_step + 1
    return LiveCurves(SummaryWriter(log_dir=str(out), purge_step=purge))
