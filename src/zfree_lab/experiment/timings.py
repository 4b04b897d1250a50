"""A study's measured wall time per phase: ``run_experiment`` records, per
invocation (a *session*), the seconds of its start-up (from the process's start: the interpreter and
the imports, recorded when the command passes that start, as ``zfree study`` does), preparation (split,
reference), probes (the estimate, ``zfree_lab.experiment.estimate.plan``), grid (the runs, controls and oracles, skipped ones included)
and report (summary tables and report.html) in ``timings.json``. A phase is written as soon as it
ends, and the grid's seconds so far each time one of its points ends (``PhaseClock.progress``), so a
study killed outright (a machine handed back, SIGKILL) keeps its time up to its last finished run; a
rerun appends a session and never rewrites an earlier one. The report's opening section reads it beside ``estimate.json``
(``zfree_lab.report.plan_report``).

``timings.json``: ``{"sessions": [{"id", "started" (ISO 8601, UTC), "<phase>_s" for each phase
done or under way, "running" (the phase under way when the session last wrote, absent once it ended),
"total_s" (since the session started), "points" ({status: count} of the grid), "finished"
(true once its last phase is written), "refused" (the budget's one-line refusal, when the probes found
that the grid cannot fit: the session ends there)}, ...]}``, oldest first.
"""

from __future__ import annotations

import os
import time
from datetime import datetime, timezone
from pathlib import Path

from zfree.core.io import atomic_write_json, read_record

TIMINGS_FILE = "timings.json"
#: the phases of a study, in order (``PhaseClock.done`` names one of them)
PHASES = ("startup", "preparation", "probes", "grid", "report")


def read_timings(study_dir: Path | str) -> list[dict]:
    """The sessions of ``study_dir/timings.json``, oldest first; [] when the file is absent or holds
    no session list (a study run before it was written; an unreadable file is warned about and
    written anew, ``zfree.core.io.read_record``)."""
    sessions = read_record(Path(study_dir) / TIMINGS_FILE).get("sessions")
    return [s for s in sessions if isinstance(s, dict)] if isinstance(sessions, list) else []


class PhaseClock:
    """One session of ``study_dir/timings.json``: ``done(phase)`` records the seconds since the
    previous phase ended (or since ``started``, ``time.time()`` when the session began), ``progress(phase)``
    the seconds so far of the phase under way, and each writes the file (atomically: ``atomic_write_json``), keeping every other session as it was."""

    def __init__(self, study_dir: Path | str, started: float | None = None):
        self.file = Path(study_dir) / TIMINGS_FILE
        self.t0 = self.last = time.time() if started is None else started
        stamp = datetime.fromtimestamp(self.t0, timezone.utc).isoformat(timespec="seconds")
        self.session: dict = {"id": f"{stamp}-{os.getpid()}", "started": stamp}

    def done(self, phase: str, **extra) -> None:
        """Record ``phase`` (one of ``PHASES``; ValueError naming them otherwise) as ended now, with
        ``extra`` keys (e.g. ``points``, ``finished``)."""
        self.last = self._write(phase, **extra)
        self.session.pop("running", None)
        self._save()

    def progress(self, phase: str, **extra) -> None:
        """Record ``phase`` as under way: its seconds so far, ``running`` = ``phase`` (``done`` ends it)."""
        self._write(phase, **extra)
        self.session["running"] = phase
        self._save()

    def _write(self, phase: str, **extra) -> float:
        """Put ``phase``'s seconds since the previous phase ended into the session; returns now."""
        if phase not in PHASES:
            raise ValueError(f"phase {phase!r} is not one of {list(PHASES)}")
        now = time.time()
        self.session.update({f"{phase}_s": now - self.last, "total_s": now - self.t0, **extra})
        return now

    def _save(self) -> None:
        others = [s for s in read_timings(self.file.parent) if s.get("id") != self.session["id"]]
        atomic_write_json(self.file, {"sessions": [*others, self.session]})
