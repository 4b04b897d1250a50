"""Grid of run configs -> papermill runs of ``notebooks/train_cvae.ipynb`` on an executor, and
aggregation of the finished runs into a pandas table.

Each point runs into its own folder named by a stable id (a readable prefix plus a hash of its
flat config). A folder with ``summary.json`` is finished and skipped, so a killed sweep resumes;
a point that fails leaves ``error.json`` and its executed notebook and does not stop the others.
"""

from __future__ import annotations

import hashlib
import json
import os
import traceback
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, runtime_checkable

import pandas as pd
from tqdm.auto import tqdm

from zfree.config import TrainConfig
from zfree.io import atomic_write_json, read_json

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def run_id(flat: dict[str, Any]) -> str:
    """Stable id: ``<weighting>_beta<beta>_<8 hex of the sha256 of the sorted flat config>``."""
    h = hashlib.sha256(json.dumps(flat, sort_keys=True).encode()).hexdigest()[:8]
    aid = flat.get("aid", "none")
    prefix = f"{flat['weighting']}_beta{flat['beta']:g}" + ("" if aid in (None, "none") else f"_{aid}")
    return f"{prefix}_{h}"


@dataclass(frozen=True)
class Point:
    run_id: str
    params: dict[str, Any]  # the flat TrainConfig


def expand_grid(base: dict[str, Any], grid: dict[str, Iterable[Any]]) -> list[Point]:
    """Cartesian product of ``grid`` over the flat ``base`` config; every point is validated
    (``TrainConfig.from_flat``) before anything runs, so a bad value fails the whole sweep early."""
    import itertools

    keys = list(grid)
    points = []
    for values in itertools.product(*(list(grid[k]) for k in keys)):
        flat = {**base, **dict(zip(keys, values))}
        cfg = TrainConfig.from_flat(flat)
        flat = cfg.to_flat()
        points.append(Point(run_id(flat), flat))
    return points


def run_point(point: Point, runs_dir: str, notebook: str) -> dict[str, Any]:
    """Execute one point through papermill (kernel ``python3``); never raises.

    Returns ``{"run_id", "status": finished|skipped|failed, "error"?}``.
    """
    import papermill as pm

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
    """Anything that can ``submit(fn, *args) -> Future`` and ``shutdown()`` (concurrent.futures)."""

    def submit(self, fn: Callable, *args) -> Future: ...

    def shutdown(self, wait: bool = True) -> None: ...


def _one_thread():
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"


def local_executor(workers: int = 2) -> ProcessPoolExecutor:
    """A process pool with one torch thread per worker (two workers with two threads each made a
    training step 20x slower on a 2-core machine)."""
    return ProcessPoolExecutor(max_workers=workers, initializer=_one_thread)


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
    from concurrent.futures import as_completed

    index = {id(f): i for i, f in enumerate(futs)}
    with tqdm(total=len(points), desc="runs", disable=not progress) as bar:
        for f in as_completed(futs):
            r = f.result()
            results[index[id(f)]] = r
            bar.update(1)
            bar.set_postfix_str(f"{r['run_id']}: {r['status']}")
            if on_done:
                on_done(r)
    if executor is None:
        ex.shutdown()
    return [r for r in results if r is not None]


def collect_runs(runs_dir: Path | str) -> pd.DataFrame:
    """One row per finished run folder (its ``summary.json``), plus ``run_id`` and ``run_dir``."""
    rows = []
    for s in sorted(Path(runs_dir).glob("*/summary.json")):
        d = read_json(s)
        d["run_id"], d["run_dir"] = s.parent.name, str(s.parent)
        rows.append(d)
    return pd.DataFrame(rows)
