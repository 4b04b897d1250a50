"""Sweep spec (YAML) -> a validated ``zfree.experiment.spec.ExperimentSpec`` -> the study pipeline
(``zfree.experiment.pipeline.run_experiment``: papermill runs on an executor, ``zfree.experiment.executor``)
-> one tidy pandas table per sweep.

A sweep spec (``analysis/sweeps/*.yaml``)::

    name: beta_vs_recon_weight          # a folder name
    description: free text
    base: {steps: 250, batch_size: 64}  # flat TrainConfig fields shared by every point
    grid:                               # the Cartesian product of the axes
      beta: {geomspace: [0.01, 1.0, 5]} # or a list; also {linspace: [lo, hi, n]}
      objective:                        # an axis of dicts sets several fields together
        - {weighting: plain}
        - {weighting: example, epsilon: 0.05}
    executor: local                     # local | submitit (``zfree.experiment.executor.make_executor``)
    workers: 2
    executor_options: {}                # submitit: cluster, timeout_min, slurm_partition, ...

Relative ``data_dir``/``base_dir`` resolve against the working directory when they exist there,
else against the repository root. ``load_spec`` validates every point before anything runs; each
value is typed by its field's declaration (``lr_new: 1e-3``, a string in YAML 1.1, is the float
0.001; ``steps: true`` is refused), and every error names the file and the field.

A sweep holds the lock of its folder and of its ``runs/`` (``zfree.core.locks``) while it runs, so
a second sweep or study on them is refused naming the holder's pid. A YAML spec's points name their
own ``data_dir``/``base_dir`` (its data and base sources are ``fields``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from zfree.config import TrainConfig, parse_field_value
from zfree.core.values import coerce_value
from zfree.core.errors import ConfigError
from zfree.core.io import atomic_write_json, read_yaml
from zfree.core.locks import run_folder_lock
from zfree.core.paths import check_name_length, resolve_given
from zfree.experiment.executor import EXECUTORS, Executor
from zfree.experiment.pipeline import run_experiment
from zfree.experiment.spec import BaseSource, DataSource, ExperimentSpec, expand_grid

_SPEC_KEYS = {"name", "description", "base", "grid", "executor", "workers", "executor_options", "controls", "oracles",
              "seeds"}


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


def _grid(raw: dict, fields: set[str]) -> dict[str, list[Any]]:
    """The typed grid of a raw spec; ConfigError naming ``grid.<axis>``."""
    grid = {}
    for name, v in raw["grid"].items():
        name = str(name)
        values = _axis_values(name, v)
        if name not in fields and not all(isinstance(x, dict) for x in values):
            raise ConfigError(f"grid.{name} is not a config field (valid: {sorted(fields)}); "
                              "an axis of another name must list dicts of fields")
        grid[name] = [{str(k): _typed(str(k), x, fields) for k, x in val.items()} if isinstance(val, dict)
                      else _typed(name, val, fields) for val in values]
    return grid


def _shared(raw: dict, fields: set[str]) -> dict[str, Any]:
    """The typed ``base`` fields of a raw spec (data_dir/base_dir resolved)."""
    if not isinstance(raw.get("base") or {}, dict):
        raise ConfigError(f"base must be a mapping of config fields, got {raw['base']!r}")
    base = {str(k): _typed(str(k), v, fields) for k, v in (raw.get("base") or {}).items()}
    for k in ("data_dir", "base_dir"):
        if k in base:
            base[k] = resolve_given(base[k])
    return base


def _executor_keys(path: Path, raw: dict) -> dict[str, Any]:
    """executor, workers, name and executor_options of a raw spec, validated."""
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
    check_name_length(name, f"{path}: name", extra=len("sweep-"))  # the default folder runs/sweep-<name>
    opts = raw.get("executor_options") or {}
    if not isinstance(opts, dict):
        raise ConfigError(f"{path}: executor_options must be a mapping, got {opts!r}")
    return {"name": name, "executor": ex, "workers": workers, "executor_options": dict(opts)}


def _control_keys(path: Path, raw: dict) -> dict[str, Any]:
    """``controls`` (true: the z-free control of every recipe, the default), ``oracles`` (null:
    every label all rows carry; a list of label keys; [] none) and ``seeds`` (null: the points' own;
    a list: every point once per seed) of a raw spec, validated."""
    controls, oracles = raw.get("controls", True), raw.get("oracles")
    if not isinstance(controls, bool):
        raise ConfigError(f"{path}: controls={controls!r} must be true or false")
    if oracles is not None and (not isinstance(oracles, list) or not all(isinstance(k, str) and k for k in oracles)):
        raise ConfigError(f"{path}: oracles={oracles!r} must be a list of label keys (or null: every label)")
    seeds = raw.get("seeds")
    if seeds is not None and (not isinstance(seeds, list) or not seeds
                              or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in seeds)):
        raise ConfigError(f"{path}: seeds={seeds!r} must be a list of integers >= 0 (each point runs once per seed)")
    return {"controls": controls, "oracles": None if oracles is None else tuple(oracles),
            "seeds": None if seeds is None else tuple(seeds)}


def load_spec(path: Path | str, check_paths: bool = True) -> ExperimentSpec:
    """Read and validate a sweep spec into an ``ExperimentSpec`` (data and base sources ``fields``;
    the YAML ``base`` is its ``train``): unknown keys, an empty grid, an unknown config field or a
    bad value raise ValueError naming the file and the field; with ``check_paths`` a missing
    data_dir/base_dir raises FileNotFoundError. Every point is expanded (and validated) here."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"sweep spec {path} does not exist")
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a sweep spec is a mapping with keys {sorted(_SPEC_KEYS)}")
    unknown = sorted(set(raw) - _SPEC_KEYS)
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {unknown}; valid: {sorted(_SPEC_KEYS)}")
    if not isinstance(raw.get("grid"), dict) or not raw["grid"]:
        raise ConfigError(f"{path}: grid must be a non-empty mapping of axis -> values")
    fields = set(TrainConfig.flat_fields())
    try:
        grid, train = _grid(raw, fields), _shared(raw, fields)
    except ValueError as e:
        raise ConfigError(f"{path}: {e}") from None
    try:
        spec = ExperimentSpec(grid=grid, train=train, data=DataSource("fields"), base=BaseSource("fields"),
                              description=str(raw.get("description", "")), **_executor_keys(path, raw),
                              **_control_keys(path, raw))
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
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


def run_sweep(spec: ExperimentSpec | Path | str, out_dir: Path | str, *, executor: Executor | None = None,
              workers: int | None = None, progress: bool = True) -> list[dict]:
    """Run a spec into ``out_dir/runs/<run_id>/`` (finished points skipped), then write the tidy
    tables (``aggregate``): ``run_experiment`` without a report. ``out_dir/spec.json`` records the
    expanded spec. Raises ``LockHeldError`` when another process runs a sweep in ``out_dir``."""
    spec = spec if isinstance(spec, ExperimentSpec) else load_spec(spec)
    out = Path(out_dir).resolve()
    with run_folder_lock(out, "sweep folder"):  # a second sweep on `out` is refused, naming this pid
        atomic_write_json(out / "spec.json", {"name": spec.name, "description": spec.description,
                                              "base": spec.train, "grid": spec.grid,
                                              "run_ids": [p.run_id for p in spec.points()]})
        return run_experiment(spec, out, executor=executor, workers=workers, progress=progress, render=False).statuses
