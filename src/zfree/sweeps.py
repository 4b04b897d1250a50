"""Sweep spec (YAML) -> validated grid of run configs -> papermill runs of
``notebooks/train_cvae.ipynb`` on an executor -> one tidy pandas table per sweep.

Each point runs into its own folder named by a stable id (a readable prefix plus a hash of its
flat config). A folder with ``summary.json`` is finished and skipped, so a killed sweep resumes;
a point that fails leaves ``error.json`` and its executed notebook and does not stop the others.

A sweep spec (``analysis/sweeps/*.yaml``)::

    name: beta_vs_recon_weight          # a folder name
    description: free text
    base: {steps: 250, batch_size: 64}  # flat TrainConfig fields shared by every point
    grid:                               # the Cartesian product of the axes
      beta: {geomspace: [0.01, 1.0, 5]} # or a list; also {linspace: [lo, hi, n]}
      objective:                        # an axis of dicts sets several fields together
        - {weighting: plain}
        - {weighting: example, epsilon: 0.05}
    executor: local                     # local | submitit (see ``make_executor``)
    workers: 2
    executor_options: {}                # submitit: cluster, timeout_min, slurm_partition, ...

Relative ``data_dir``/``base_dir`` resolve against the working directory when they exist there,
else against the repository root. ``load_spec`` validates every point before anything runs.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import traceback
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, runtime_checkable

import numpy as np
from tqdm.auto import tqdm

from zfree.config import TrainConfig
from zfree.io import atomic_write_json
from zfree.paths import NOTEBOOKS, ROOT, SPECS  # noqa: F401 - re-exported
from zfree.results import aggregate, collect_runs  # noqa: F401 - collect_runs re-exported


def run_id(flat: dict[str, Any]) -> str:
    """Stable id: ``<weighting>_beta<beta>_<8 hex of the sha256 of the sorted flat config>``."""
    h = hashlib.sha256(json.dumps(flat, sort_keys=True).encode()).hexdigest()[:8]
    aid = flat.get("aid", "none")
    prefix = f"{flat['weighting']}_beta{flat['beta']:g}" + ("" if aid in (None, "none") else f"_{aid}")
    return f"{prefix}_{h}"


@dataclass(frozen=True)
class Point:
    """One grid point: its stable run id and flat config."""
    run_id: str
    params: dict[str, Any]  # the flat TrainConfig


def expand_grid(base: dict[str, Any], grid: dict[str, Iterable[Any]]) -> list[Point]:
    """Cartesian product of ``grid`` over the flat ``base`` config; every point is validated
    (``TrainConfig.from_flat``) before anything runs, so a bad value fails the whole sweep early.
    A grid value that is a dict sets several fields at once (e.g. weighting with its epsilon)."""
    keys = list(grid)
    points, seen = [], set()
    for values in itertools.product(*(list(grid[k]) for k in keys)):
        flat = dict(base)
        for k, v in zip(keys, values):
            flat.update(v if isinstance(v, dict) else {k: v})
        flat = TrainConfig.from_flat(flat).to_flat()
        p = Point(run_id(flat), flat)
        if p.run_id not in seen:  # two axes values that land on one config run once
            seen.add(p.run_id)
            points.append(p)
    return points


# --- the YAML spec -------------------------------------------------------------------------

_SPEC_KEYS = {"name", "description", "base", "grid", "executor", "workers", "executor_options"}


@dataclass(frozen=True)
class SweepSpec:
    """A validated sweep spec (``load_spec``): the grid, shared fields and the executor to run it on."""
    name: str
    base: dict[str, Any]
    grid: dict[str, list[Any]]
    description: str = ""
    executor: str = "local"
    workers: int = 2
    executor_options: dict[str, Any] = field(default_factory=dict)

    def points(self) -> list[Point]:
        """The spec's validated grid points (``expand_grid`` over the default config plus ``base``)."""
        return expand_grid({**TrainConfig().to_flat(), **self.base}, self.grid)


def _axis_values(name: str, v: Any) -> list[Any]:
    """A grid axis: a list, or ``{geomspace|linspace: [lo, hi, n]}``."""
    if isinstance(v, dict):
        (kind, args), = v.items() if len(v) == 1 else (("?", None),)
        if kind not in ("geomspace", "linspace") or not (isinstance(args, list) and len(args) == 3):
            raise ValueError(f"grid.{name}: a dict axis must be {{geomspace|linspace: [lo, hi, n]}}, got {v!r}")
        return [float(f"{x:.6g}") for x in getattr(np, kind)(float(args[0]), float(args[1]), int(args[2]))]
    if not isinstance(v, list) or not v:
        raise ValueError(f"grid.{name}: must be a non-empty list or {{geomspace|linspace: [lo, hi, n]}}, got {v!r}")
    return v


def _resolve(p: str) -> str:
    path = Path(p)
    if path.is_absolute() or path.exists():
        return str(path.resolve())
    return str((ROOT / path).resolve())


def load_spec(path: Path | str, check_paths: bool = True) -> SweepSpec:
    """Read and validate a sweep spec: unknown keys, an empty grid, an unknown config field or
    a bad value raise ValueError naming the file and the field; with ``check_paths`` a missing
    data_dir/base_dir raises FileNotFoundError. Every point is expanded (and validated) here."""
    import yaml

    path = Path(path)
    raw = yaml.safe_load(path.read_text())
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a sweep spec is a mapping with keys {sorted(_SPEC_KEYS)}")
    unknown = sorted(set(raw) - _SPEC_KEYS)
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {unknown}; valid: {sorted(_SPEC_KEYS)}")
    if not isinstance(raw.get("grid"), dict) or not raw["grid"]:
        raise ValueError(f"{path}: grid must be a non-empty mapping of axis -> values")
    fields = set(TrainConfig.flat_fields())
    grid = {}
    for name, v in raw["grid"].items():
        values = _axis_values(name, v)
        if name not in fields and not all(isinstance(x, dict) for x in values):
            raise ValueError(f"{path}: grid.{name} is not a config field (valid: {sorted(fields)}); "
                             "an axis of another name must list dicts of fields")
        grid[name] = values
    base = dict(raw.get("base") or {})
    for k in ("data_dir", "base_dir"):
        if k in base:
            base[k] = _resolve(base[k])
    ex = raw.get("executor", "local")
    if ex not in EXECUTORS:
        raise ValueError(f"{path}: executor={ex!r} is not one of {sorted(EXECUTORS)}")
    spec = SweepSpec(name=str(raw.get("name") or path.stem), base=base, grid=grid,
                     description=str(raw.get("description", "")), executor=ex, workers=int(raw.get("workers", 2)),
                     executor_options=dict(raw.get("executor_options") or {}))
    try:
        points = spec.points()
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e
    if check_paths:
        for k in ("data_dir", "base_dir"):
            for p in {pt.params[k] for pt in points}:
                if not Path(p).exists():
                    raise FileNotFoundError(f"{path}: {k}={p} does not exist")
    return spec


# --- running points ------------------------------------------------------------------------

def run_point(point: Point, runs_dir: str, notebook: str) -> dict[str, Any]:
    """Execute one point through papermill (kernel ``python3``); never raises.

    Returns ``{"run_id", "status": finished|skipped|failed, "error"?}``.
    """
    import papermill as pm

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # a fresh worker (submitit) inherits nothing
    run_dir = Path(runs_dir) / point.run_id
    if (run_dir / "summary.json").exists():
        return {"run_id": point.run_id, "status": "skipped"}
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "error.json").unlink(missing_ok=True)
    try:
        pm.execute_notebook(notebook, str(run_dir / "train_cvae.ipynb"),
                            parameters={**point.params, "out_dir": str(run_dir), "progress": False},
                            kernel_name="python3", progress_bar=False, log_output=False, cwd=str(run_dir))
        return {"run_id": point.run_id, "status": "finished"}
    except Exception as e:  # noqa: BLE001 - a failed point is recorded, the sweep goes on
        err = {"run_id": point.run_id, "error": f"{type(e).__name__}: {e}"[:4000],
               "traceback": traceback.format_exc()[-8000:], "params": point.params}
        atomic_write_json(run_dir / "error.json", err)
        return {"run_id": point.run_id, "status": "failed", "error": err["error"][:500]}


@runtime_checkable
class Executor(Protocol):
    """Anything that can ``submit(fn, *args) -> Future`` and ``shutdown()`` (concurrent.futures).
    Dask's ``distributed.Client.get_executor()`` fits as is."""

    def submit(self, fn: Callable, *args) -> Future:
        """Submit ``fn(*args)``; returns a Future of its result."""
        ...

    def shutdown(self, wait: bool = True) -> None:
        """Release the executor's resources (waiting for running jobs with ``wait``)."""
        ...


def _one_thread():
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"


def local_executor(workers: int = 2) -> ProcessPoolExecutor:
    """A process pool with one torch thread per worker (two workers with two threads each made a
    training step 20x slower on a 2-core machine)."""
    return ProcessPoolExecutor(max_workers=workers, initializer=_one_thread)


class SubmititExecutor:
    """submitit (SLURM, or its local/debug executors for tests) behind the Executor protocol:
    each submitted job gets a Future that a waiter thread completes with ``job.result()``.

    ``cluster``: None (auto: SLURM if available, else local), "slurm", "local" (one subprocess
    per job) or "debug" (in-process). Other options go to ``update_parameters`` (timeout_min,
    slurm_partition, cpus_per_task, ...). Job logs live in ``folder``.
    """

    def __init__(self, folder: Path | str, cluster: str | None = None, max_waiting: int = 64, **options):
        import submitit

        self._ex = submitit.AutoExecutor(folder=str(folder), cluster=cluster)
        opts = {"timeout_min": 60, "cpus_per_task": 1, **options}
        if self._ex.cluster == "debug":
            opts = {k: v for k, v in opts.items() if k == "timeout_min"}
        self._ex.update_parameters(**opts)
        self._waiters = ThreadPoolExecutor(max_workers=max_waiting)

    def submit(self, fn: Callable, *args) -> Future:
        """Submit ``fn(*args)``; returns a Future of its result."""
        job = self._ex.submit(fn, *args)
        if self._ex.cluster == "debug":  # debug jobs run in-process on result(): one at a time
            fut: Future = Future()
            try:
                fut.set_result(job.result())
            except Exception as e:  # noqa: BLE001
                fut.set_exception(e)
            return fut
        return self._waiters.submit(job.result)

    def shutdown(self, wait: bool = True) -> None:
        """Release the executor's resources (waiting for running jobs with ``wait``)."""
        self._waiters.shutdown(wait=wait)


EXECUTORS = {"local": "a process pool on this machine", "submitit": "submitit (SLURM, local or debug)"}


def _submitit_executor(workers: int, folder: Path | str | None, **options) -> SubmititExecutor:
    if folder is None:
        raise ValueError("executor 'submitit' needs a folder for its job logs")
    return SubmititExecutor(folder, **options)


#: executor name (``EXECUTORS``) -> its factory (workers, folder, **options)
_EXECUTOR_FACTORIES = {"local": lambda workers, folder, **options: local_executor(workers),
                       "submitit": _submitit_executor}


def make_executor(kind: str = "local", workers: int = 2, folder: Path | str | None = None, **options) -> Executor:
    """``local``: ``local_executor(workers)``; ``submitit``: ``SubmititExecutor(folder, **options)``.
    Raises ValueError for an unknown kind (listing the valid ones) or submitit without a folder."""
    if kind not in _EXECUTOR_FACTORIES:
        raise ValueError(f"executor={kind!r} is not one of {sorted(EXECUTORS)}")
    return _EXECUTOR_FACTORIES[kind](workers, folder, **options)


def run_points(points: list[Point], runs_dir: Path | str, *, workers: int = 2, executor: Executor | None = None,
               notebook: Path | str | None = None, progress: bool = True,
               on_done: Callable[[dict], None] | None = None) -> list[dict]:
    """Run every point (finished ones are skipped) and return their statuses in input order."""
    runs_dir = Path(runs_dir).resolve()
    runs_dir.mkdir(parents=True, exist_ok=True)
    nb = str(Path(notebook or NOTEBOOKS / "train_cvae.ipynb").resolve())
    ex = executor or local_executor(workers)
    futs = [ex.submit(run_point, p, str(runs_dir), nb) for p in points]
    results: list[dict | None] = [None] * len(points)
    index = {id(f): i for i, f in enumerate(futs)}
    with tqdm(total=len(points), desc="runs", disable=not progress) as bar:
        for f in as_completed(futs):
            i = index[id(f)]
            try:
                r = f.result()
            except Exception as e:  # noqa: BLE001 - e.g. a cluster job killed before run_point could record it
                r = {"run_id": points[i].run_id, "status": "failed", "error": f"{type(e).__name__}: {e}"[:500]}
            results[i] = r
            bar.update(1)
            bar.set_postfix_str(f"{r['run_id']}: {r['status']}")
            if on_done:
                on_done(r)
    if executor is None:
        ex.shutdown()
    return [r for r in results if r is not None]


def run_sweep(spec: SweepSpec | Path | str, out_dir: Path | str, *, executor: Executor | None = None,
              workers: int | None = None, progress: bool = True) -> list[dict]:
    """Run a spec into ``out_dir/runs/<run_id>/`` (finished points skipped), then write the tidy
    tables (``aggregate``). ``out_dir/spec.json`` records the expanded spec."""
    spec = spec if isinstance(spec, SweepSpec) else load_spec(spec)
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    points = spec.points()
    atomic_write_json(out / "spec.json", {"name": spec.name, "description": spec.description, "base": spec.base,
                                          "grid": spec.grid, "run_ids": [p.run_id for p in points]})
    ex = executor or make_executor(spec.executor, workers or spec.workers, folder=out / "submitit",
                                   **spec.executor_options)
    try:
        statuses = run_points(points, out / "runs", executor=ex, progress=progress)
    finally:
        if executor is None:
            ex.shutdown()
    aggregate(out)
    return statuses
