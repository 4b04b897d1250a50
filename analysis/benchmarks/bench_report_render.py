"""Time of `zfree report` on one study folder, as it was and as it is: each render in a fresh interpreter,
the two ways alternated, median of repeats; not a timed test.

- before: ``import nbformat`` with jsonschema's IRI parsers (rfc3987-syntax, installed beside JupyterLab,
  builds ~35 Lark parsers when jsonschema is imported) and papermill writing the report's notebook after
  every cell's start and end (120 writes of a growing notebook for 60 cells);
- after: ``zfree_lab.experiment.notebook_exec.import_nbformat`` and the report written once
  (``execute(..., save_each_cell=False)``), as ``render_report`` does now.

Also the bare ``import nbformat`` both ways (fresh interpreters, alternated).

Usage: OMP_NUM_THREADS=1 .venv/bin/python analysis/benchmarks/bench_report_render.py STUDY [--repeats 3]
STUDY is copied to a temporary folder first (the report is written there, never into STUDY). Run it on an
otherwise idle machine: another process on the same cores stretches both ways (their ratio less so).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RENDER = """
import sys, time
before = {before}
t0 = time.perf_counter()
if before:
    import nbformat  # jsonschema with its IRI parsers, as before
    import zfree_lab.experiment.notebook_exec as ne
    plain = ne.execute
    ne.execute = lambda *a, save_each_cell=True, **k: plain(*a, save_each_cell=True, **k)
    import zfree_lab.experiment.render as r
    r.execute = ne.execute
from zfree_lab.experiment.render import render_report
render_report({study!r}, aggregated=True)
print(time.perf_counter() - t0)
"""

IMPORT = """
import time
t0 = time.perf_counter()
if {before}:
    import nbformat
else:
    from zfree_lab.experiment.notebook_exec import import_nbformat
    import_nbformat()
print(time.perf_counter() - t0)
"""


def _seconds(code: str) -> float:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1", **_env()})
    return float(out.stdout.strip().splitlines()[-1])


def _env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k not in ("MPLBACKEND", "OMP_NUM_THREADS")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("study", type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-report-")) / "study"
    shutil.copytree(a.study, work, ignore=shutil.ignore_patterns(".zfree.lock", "checkpoint*"))
    times = {"import before": [], "import after": [], "render before": [], "render after": []}
    try:
        for _ in range(a.repeats):
            for before in (True, False):
                name = "before" if before else "after"
                times[f"import {name}"].append(_seconds(IMPORT.format(before=before)))
                times[f"render {name}"].append(_seconds(RENDER.format(before=before, study=str(work))))
    finally:
        shutil.rmtree(work.parent, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        print(f"{k:14s} median {med[k]:7.2f} s  ({', '.join(f'{x:.2f}' for x in v)})")
    print(f"import nbformat: after/before = {med['import after'] / med['import before']:.2f}")
    print(f"render_report:   after/before = {med['render after'] / med['render before']:.2f} "
          f"({med['render before'] - med['render after']:.1f} s less)")
    print(f"{time.strftime('%Y-%m-%d %H:%M')} UTC, {a.repeats} repeats each, alternated, fresh interpreters")


if __name__ == "__main__":
    main()
