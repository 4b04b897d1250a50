"""The smoke preset's study, built once per test session (the ``smoke_study`` fixture of
tests/conftest.py): test_study.py and test_report_agg.py read the same folder.

It runs under ``MPLBACKEND=Agg`` (headless servers, cluster jobs), where a figure reaches
report.html only when a notebook displays it: test_report_agg.py counts them. A test that
re-renders the report into this folder sets the same backend (``agg_backend``).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

from zfree_lab.experiment.study import run_study


@contextmanager
def agg_backend():
    """``MPLBACKEND=Agg`` meanwhile (the report's kernel inherits the environment)."""
    old = os.environ.get("MPLBACKEND")
    os.environ["MPLBACKEND"] = "Agg"
    try:
        yield
    finally:
        os.environ.pop("MPLBACKEND") if old is None else os.environ.__setitem__("MPLBACKEND", old)


def build_smoke_study(out: Path) -> Path:
    """``run_study("smoke", out)`` under the Agg backend; returns ``out``."""
    with agg_backend():
        run_study("smoke", out, progress=False)
    return out
