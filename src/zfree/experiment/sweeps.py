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
else against the repository root. ``load_spec`` validates every point before anything runs; each
value is typed by its field's declaration (``lr_new: 1e-3``, a string in YAML 1.1, is the float
0.001; ``steps: true`` is refused), and every error names the file and the field.

A sweep holds the lock of its folder and of its ``runs/`` (``zfree.core.locks``) while it runs, so
a second sweep or study on them is refused naming the holder's pid; local workers die with the
sweep process (``die_with_parent``), and their notebook kernels with them.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import traceback
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, runtime_checkable

import numpy as np
from tqdm.auto import tqdm

from zfree.config import TrainConfig, coerce_value, parse_field_value
from zfree.core.errors import ConfigError, InputError
from zfree.core.io import atomic_write_json, read_json
from zfree.core.locks import run_folder_lock

from zfree.core.paths import NOTEBOOKS, ROOT, SPECS  # noqa: F401 - re-exported
from zfree.experiment.results import aggregate, collect_runs  # noqa: F401 - collect_runs re-exported


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
    """A grid axis: a list, or ``{geomspace|linspace: [lo, hi, n]}`` (geomspace: 0 < lo, hi;
    n >= 1). Raises ConfigError naming ``grid.<name>``."""
    if isinstance(v, dict):
        (kind, args), = v.items() if len(v) == 1 else (("?", None),)
        if kind not in ("geomspace", "linspace") or not (isinstance(args, list) and len(args) == 3):
            raise ConfigError(f"grid.{name}: a dict axis must be {{geomspace|linspace: [lo, hi, n]}}, got {v!r}")
        lo = coerce_value(f"grid.{name}.{kind}[0] (lo)", args[0], float)
        hi = coerce_value(f"grid.{name}.{kind}[1] (hi)", args[1], float)
        n = coerce_value(f"grid.{name}.{kind}[2] (n)", args[2], int)
        if not (math.isfinite(lo) and math.isfinite(hi)) or n < 1 or n > 10_000:
            raise ConfigError(f"grid.{name}: {kind}: [lo, hi, n] needs finite lo and hi and 1 <= n <= 10000, got {args!r}")
        if kind == "geomspace" and not (lo > 0 and hi > 0):
            raise ConfigError(f"grid.{name}: geomspace needs lo > 0 and hi > 0 (a geometric grid cannot start "
                              f"at 0), got {args!r}; list 0 separately or use linspace")
        return [float(f"{x:.6g}") for x in getattr(np, kind)(float(lo), float(hi), int(n))]
    if not isinstance(v, list) or not v:
        raise ConfigError(f"grid.{name}: must be a non-empty list or {{geomspace|linspace: [lo, hi, n]}}, got {v!r}")
    return v


def _typed(name: str, value: Any, fields: set[str]) -> Any:
    """A spec value for config field ``name`` typed by its declaration (YAML 1.1 reads ``1e-3``
    as a string: it becomes the float 0.001); non-fields pass through (from_flat names them)."""
    return parse_field_value(name, value) if name in fields else value


def _read_yaml(path: Path) -> Any:
    """``yaml.safe_load`` of ``path``; InputError naming the file and line for bad YAML."""
    import yaml

    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text at byte {e.start}") from None
    try:
        return yaml.safe_load(text)
    except RecursionError:
        raise InputError(f"{path}: not valid YAML: nested too deeply") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        hint = " (indent with spaces: YAML does not allow tabs)" if "\t" in problem or "\\t" in problem else ""
        raise InputError(f"{where}: not valid YAML: {problem.replace(chr(9), '<tab>')}{hint}") from None


def _resolve(p: str) -> str:
    path = Path(p)
    if path.is_absolute() or path.exists():
        return str(path.resolve())
    return str((ROOT / path).resolve())


def load_spec(path: Path | str, check_paths: bool = True) -> SweepSpec:
    """Read and validate a sweep spec: unknown keys, an empty grid, an unknown config field or
    a bad value raise ValueError naming the file and the field; with ``check_paths`` a missing
    data_dir/base_dir raises FileNotFoundError. Every point is expanded (and validated) here."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"sweep spec {path} does not exist")
    raw = _read_yaml(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a sweep spec is a mapping with keys {sorted(_SPEC_KEYS)}")
    unknown = sorted(set(raw) - _SPEC_KEYS)
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {unknown}; valid: {sorted(_SPEC_KEYS)}")
    if not isinstance(raw.get("grid"), dict) or not raw["grid"]:
        raise ConfigError(f"{path}: grid must be a non-empty mapping of axis -> values")
    fields = set(TrainConfig.flat_fields())
    grid = {}
    try:
        for name, v in raw["grid"].items():
            name = str(name)
            values = _axis_values(name, v)
            if name not in fields and not all(isinstance(x, dict) for x in values):
                raise ConfigError(f"grid.{name} is not a config field (valid: {sorted(fields)}); "
                                  "an axis of another name must list dicts of fields")
            grid[name] = [{str(k): _typed(str(k), x, fields) for k, x in val.items()} if isinstance(val, dict)
                          else _typed(name, val, fields) for val in values]
        if not isinstance(raw.get("base") or {}, dict):
            raise ConfigError(f"base must be a mapping of config fields, got {raw['base']!r}")
        base = {str(k): _typed(str(k), v, fields) for k, v in (raw.get("base") or {}).items()}
    except ValueError as e:
        raise ConfigError(f"{path}: {e}") from None
    for k in ("data_dir", "base_dir"):
        if k in base:
            base[k] = _resolve(base[k])
    ex = raw.get("executor", "local")
    if ex not in EXECUTORS:
        raise ConfigError(f"{path}: executor={ex!r} is not one of {sorted(EXECUTORS)}")
    try:
        workers = coerce_value("workers", raw.get("workers", 2), int)
    except ValueError as e:
        raise ConfigError(f"{path}: {e}") from None
    if workers < 1:
        raise ConfigError(f"{path}: workers={workers} must be an integer >= 1")
    name = str(raw.get("name") or path.stem)
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise ConfigError(f"{path}: name={name!r} must be a folder name (no '/')")
    opts = raw.get("executor_options") or {}
    if not isinstance(opts, dict):
        raise ConfigError(f"{path}: executor_options must be a mapping, got {opts!r}")
    spec = SweepSpec(name=name, base=base, grid=grid, description=str(raw.get("description", "")), executor=ex,
                     workers=workers, executor_options=dict(opts))
    try:
        points = spec.points()
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{path}: {e}") from None
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
        err = {"run_id": point.run_id, "error": f"{type(e).__name__}: {e}"[:20000],
               "traceback": traceback.format_exc()[-8000:], "params": point.params}
        atomic_write_json(run_dir / "error.json", err)
        return {"run_id": point.run_id, "status": "failed", "error": err["error"]}


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


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent_pid: int) -> None:
    """Make this process receive SIGKILL when its parent dies (Linux ``PR_SET_PDEATHSIG``), and
    exit at once if the parent is already gone. Elsewhere a no-op. The notebook kernels that
    papermill starts poll their parent (ipykernel's ParentPollerUnix, via JPY_PARENT_PID) and
    exit within a second of the worker's death, so a killed sweep leaves no process behind."""
    import signal
    import sys

    if sys.platform.startswith("linux"):
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _worker_init(parent_pid: int):
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"
    die_with_parent(parent_pid)


def local_executor(workers: int = 2) -> ProcessPoolExecutor:
    """A process pool with one torch thread per worker (two workers with two threads each made a
    training step 20x slower on a 2-core machine); the workers die with this process
    (``die_with_parent``). Workers are forked from the submitting thread, whose exit (not the
    process's) is what Linux's parent-death signal watches: submit from the main thread."""
    return ProcessPoolExecutor(max_workers=workers, initializer=_worker_init, initargs=(os.getpid(),))


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
    """Run every point (finished ones are skipped) and return their statuses in input order.
    Holds the lock of ``runs_dir`` meanwhile: a second sweep or study on it raises
    ``LockHeldError`` naming this process."""
    runs_dir = Path(runs_dir).resolve()
    with run_folder_lock(runs_dir, "runs folder"):  # one sweep/study writes these run folders
        return _run_points(points, runs_dir, workers=workers, executor=executor, notebook=notebook,
                           progress=progress, on_done=on_done)


def _run_points(points, runs_dir: Path, *, workers, executor, notebook, progress, on_done) -> list[dict]:
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
    tables (``aggregate``). ``out_dir/spec.json`` records the expanded spec. Raises
    ``LockHeldError`` when another process runs a sweep in ``out_dir``."""
    spec = spec if isinstance(spec, SweepSpec) else load_spec(spec)
    out = Path(out_dir).resolve()
    with run_folder_lock(out, "sweep folder"):  # a second sweep on `out` is refused, naming this pid
        return _run_sweep(spec, out, executor=executor, workers=workers, progress=progress)


def _run_sweep(spec: SweepSpec, out: Path, *, executor, workers, progress) -> list[dict]:
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
