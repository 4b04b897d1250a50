"""Live curves: every evaluation row a run appends to ``metrics.jsonl`` is also written as TensorBoard
scalars, in event files beside it (the run folder), one scalar per numeric key at the row's own
``step``. ``tensorboard --logdir STUDY`` then lists a study's or sweep's runs by their folders
(``runs/<run_id>``) while they train. Off with the config field ``tensorboard = False``; without
the ``tensorboard`` package nothing is written (one note says so).

With ``wandb = "offline"`` the same rows go to Weights & Biases in offline mode as well: a
``wandb/offline-run-*`` folder in the run folder (run name and id from the run folder's name, its
group the study folder, its config the run's flat TrainConfig), uploaded whenever the user wants
with ``wandb sync RUN/wandb/offline-run-*``. Nothing reaches the network; the package is an optional
extra (``pip install zfree[wandb]``), and asking for it without the package is a ConfigError, not a
silent skip.

A resumed run continues its event files: the writer's ``purge_step`` (the checkpoint's step + 1)
hides what the interrupted session logged after its checkpoint, as ``metrics.jsonl`` is cut there
(``zfree_lab.run.run_folder.reset_metrics``); a fresh run removes the event files of an earlier one.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from zfree.core.errors import ConfigError

#: the file names TensorBoard's event writer gives its files
EVENT_GLOB = "events.out.tfevents.*"

_noted = False


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The TensorBoard scalars of a metrics row: every int, float or bool value (bools as 0/1) but
    ``step``; None, strings and lists are not scalars and are left out."""
    return {k: float(v) for k, v in row.items() if k != "step" and isinstance(v, (int, float, bool))}


class LiveCurves:
    """The live-curve writers of one run folder (``open_curves``): TensorBoard's event writer and/or a
    W&B offline run. ``log(step, row)`` per evaluation, flushed at once (a crash loses nothing already
    in metrics.jsonl); ``close()`` at the run's end."""

    def __init__(self, writer=None, wandb_run=None):
        self._w, self._wandb = writer, wandb_run

    def log(self, step: int, row: dict[str, Any]) -> None:
        """Write every scalar of ``row`` (``scalars``) at ``step`` (the evaluation's training step)."""
        values = scalars(row)
        if self._w is not None:
            for tag, value in values.items():
                self._w.add_scalar(tag, value, global_step=step)
            self._w.flush()
        if self._wandb is not None:
            self._wandb.log(values, step=step)

    def close(self) -> None:
        """Flush and close the event file; finish the W&B run and wait until its offline files are complete
        (``_join_wandb_service``)."""
        if self._w is not None:
            self._w.close()
        if self._wandb is not None:
            self._wandb.finish()
            _join_wandb_service()


def _join_wandb_service() -> None:
    """Wait until W&B's service process has written and closed every file of the finished run:
    ``finish()`` only sends the service a close message that has no reply, so the offline ``.wandb``
    file could still lack its records when it returns (issue 61). ``wandb.teardown()`` joins the
    service (a later run starts a new one). Skipped while another W&B run of this process is still
    open (teardown would finish it too): that file then completes when the service gets to it."""
    import wandb

    if getattr(wandb.setup(), "most_recent_active_run", "unknown") is None:
        wandb.teardown()


def wandb_id(out: Path) -> str:
    """The W&B run id of run folder ``out``: its name with every character W&B refuses in an id
    (anything but letters, digits, ``_`` and ``-``) as ``-``, cut to W&B's 64 characters."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", Path(out).resolve().name)[:64]


def open_wandb(out: Path, config: dict[str, Any]):
    """A W&B run in offline mode writing under ``out/wandb/`` (name and id ``wandb_id(out)``, group the
    study folder when ``out`` is ``STUDY/runs/<id>``, ``config`` its flat TrainConfig; no console
    capture, no system-metrics sampling). Raises ConfigError when the wandb package is missing."""
    try:
        import wandb
    except ImportError:
        raise ConfigError("wandb='offline' needs the wandb package: pip install 'zfree[wandb]' "
                          "(or set wandb=off)") from None
    out = Path(out).resolve()
    group = out.parent.parent.name if out.parent.name == "runs" else None
    return wandb.init(mode="offline", dir=str(out), project="zfree", name=out.name, id=wandb_id(out), group=group,
                      config=config, resume="allow", reinit="create_new",
                      settings=wandb.Settings(silent=True, console="off", x_disable_stats=True))


def open_curves(out: Path, enabled: bool, resumed_step: int | None, wandb: str = "off",
                config: dict[str, Any] | None = None) -> LiveCurves | None:
    """The run folder ``out``'s live-curve writers, or None when there are none: TensorBoard's unless
    ``enabled`` is False or the tensorboard package is missing (a one-time note on stdout); a W&B
    offline run with ``wandb = "offline"`` (``open_wandb``, logged ``config``; ConfigError without
    the package). ``resumed_step``: the checkpoint's step of a resumed run (later TensorBoard events of
    the earlier session are purged), None for a fresh run (earlier event files removed)."""
    wandb_run = open_wandb(out, config or {}) if wandb == "offline" else None
    writer = _tensorboard_writer(out, resumed_step) if enabled else None
    return None if writer is None and wandb_run is None else LiveCurves(writer, wandb_run)


def _tensorboard_writer(out: Path, resumed_step: int | None):
    """TensorBoard's SummaryWriter of ``out`` (``open_curves``), or None without the package."""
    global _noted
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
    return SummaryWriter(log_dir=str(out), purge_step=purge)
