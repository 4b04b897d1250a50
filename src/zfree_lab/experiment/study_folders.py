"""Which study or sweep folder a notebook opens: the one it names, ``$ZFREE_STUDY``, else the most
recently finished one under the runs folder (``choose_study``); ``NoStudyError`` in one line, offering
the one-minute smoke study, when there is none; and what a folder holds, its runs counted by kind
(``count_runs``, ``given_kind``) and where a base's fine-tune is (``finetune_roots``).
``zfree_lab.experiment.results.load_sweep`` reads the folder chosen.
"""

from __future__ import annotations

import os
from pathlib import Path

from zfree.config import LatentSource
from zfree.core.io import read_json_object
from zfree.core.paths import IN_CLONE, NOTEBOOKS, runs_home


#: what a notebook without a study offers (one line, the one-minute study one command away)
SMOKE_OFFER = ("`make smoke` (about a minute) writes runs/study-smoke" if IN_CLONE else
               "`zfree study --preset smoke --out runs/study-smoke` (about a minute) writes it")


class NoStudyError(FileNotFoundError):
    """No study or sweep folder to open: shown in a notebook as its one line (IPython's
    ``_render_traceback_``), not a traceback whose last line is the helpful one."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


def check_folder(folder: Path | str) -> Path:
    """``folder`` when it exists; else NoStudyError (a FileNotFoundError) "no such folder: ..." (a
    notebook's ``sweep_dir`` that names no study or sweep, e.g. a fresh clone's)."""
    d = Path(folder)
    if not d.is_dir():
        raise NoStudyError(f"no such folder: {d.resolve()} (set sweep_dir to a folder written by `zfree study` or "
                           f"`zfree sweep`; {SMOKE_OFFER})" if not d.exists() else f"{d} is not a folder")
    return d


def find_studies(root: Path | str) -> list[Path]:
    """The finished study and sweep folders directly under ``root``: those holding ``summary.csv``
    (a finished study) or a finished run (``runs/*/summary.json``), the most recently finished first
    (by the newest of those files' modification times). A missing ``root`` has none."""
    found = []
    for d in (p for p in Path(root).glob("*") if p.is_dir()):
        done = [f.stat().st_mtime for f in [d / "summary.csv", *d.glob("runs/*/summary.json")] if f.is_file()]
        if done:
            found.append((max(done), d))
    return [p for _, p in sorted(found, reverse=True)]


def choose_study(sweep_dir: Path | str | None = None) -> Path:
    """The folder a notebook opens, chosen without editing the notebook: ``sweep_dir`` when
    given; else ``$ZFREE_STUDY`` (``make lab STUDY=runs/study-smoke``); else the most recently finished
    study under ``zfree.core.paths.runs_home()``. NoStudyError in one line naming where it looked and
    offering the smoke study when there is none."""
    if sweep_dir not in (None, ""):
        return check_folder(sweep_dir)
    if os.environ.get("ZFREE_STUDY"):
        return check_folder(os.environ["ZFREE_STUDY"])
    found = find_studies(runs_home())
    if not found:
        raise NoStudyError(f"no study found under {runs_home()}: {SMOKE_OFFER}; or give sweep_dir, or "
                           "ZFREE_STUDY (make lab STUDY=DIR)")
    return found[0]


def given_kind(summary: dict) -> str | None:
    """What a run's summary (its ``summary.json``) trains, when z is given rather than inferred:
    "control" (a z-free control), "oracle" (a label oracle: ``latent_source`` "label:<key>", its null
    "null:<key>" or its text oracle "text:<key>"),
    "given" (another given z); None for a CVAE run (``latent_source`` "posterior" or absent)."""
    try:
        kind = LatentSource.parse(summary.get("latent_source")).kind
    except ValueError:  # a summary written by another version: z given, of an unknown kind
        return "given"
    return {"posterior": None, "control": "control", "label": "oracle", "null": "oracle", "text": "oracle"}[kind]


def count_runs(runs_dir: Path | str) -> dict[str, int]:
    """How many finished runs (``*/summary.json``) ``runs_dir`` holds: {"cvae": the CVAE runs, those
    every table and figure shows (``collect_runs``' default), "control", "oracle", "given": the
    given-z runs of each ``given_kind``}. A summary.json that is not a JSON object counts as a CVAE
    run (opening the study names it: ``collect_runs``). A missing folder has none."""
    counts = {"cvae": 0, "control": 0, "oracle": 0, "given": 0}
    for s in Path(runs_dir).glob("*/summary.json"):
        d = read_json_object(s)
        counts[(given_kind(d) if d is not None else None) or "cvae"] += 1
    return counts


def given_line(counts: dict[str, int]) -> str:
    """The study's closing line's count of its given-z runs (``count_runs``), e.g. " (+ 2 z-free controls,
    2 oracles)"; "" when it has none. An oracle is a label oracle, its null or its text oracle (the smoke
    preset's one label is the benchmark's strategy)."""
    names = {"control": "z-free control", "oracle": "oracle", "given": "other given-z run"}
    parts = [f"{counts[k]} {name}{'s' if counts[k] != 1 else ''}" for k, name in names.items() if counts.get(k)]
    return f" (+ {', '.join(parts)})" if parts else ""


#: the fine-tune's folders beside a study's train.jsonl: its output, then its checkpoint while it runs
FINETUNE_DIR, FINETUNE_CHECKPOINT = "base_ft", "base_ft.checkpoint"


def finetune_roots(study: Path) -> tuple[Path, Path]:
    """Where a study's fine-tune folders can be: beside train.jsonl in the study folder, or in its data/
    (``prepare_data`` of a jsonl or E2E source); ``FINETUNE_DIR`` and ``FINETUNE_CHECKPOINT`` in each."""
    return study, study / "data"


def report_is_current(study_dir: Path) -> bool:
    """True when ``study_dir/report.html`` (a file, not a link, beside report.ipynb) was written after every file of every run folder
    (``runs/<id>/*``, hidden files aside, and the base's records, ``base/**/*.json``) and after the report's code (the shipped notebooks,
    ``zfree_lab.report``): the same ``zfree study`` again over a finished study then names it instead of
    rendering it again (``zfree_lab.experiment.pipeline._finish``). A copy made without its times
    (``cp -r``) or an upgraded zfree reads as not current."""
    html = study_dir / "report.html"
    if any(f.is_symlink() or not f.is_file() for f in (html, study_dir / "report.ipynb")):
        return False  # a render writes both as files; a link (planted or copied) is replaced by rendering again
    inputs = [p for p in [*(study_dir / "runs").glob("*/*"), *(study_dir / "base").rglob("*.json")]
              if p.is_file() and not p.name.startswith(".")]
    here = Path(__file__).resolve().parent
    code = [*NOTEBOOKS.glob("*.ipynb"), *(here.parent / "report").glob("*.py"), here / "render.py"]
    return html.stat().st_mtime_ns >= max((p.stat().st_mtime_ns for p in inputs + code), default=0)
