"""ExperimentSpec as data: ``spec_from_dict``, the one loader of every spec zfree reads (a study
preset, a YAML sweep spec, an own-data grid, a spec saved as JSON), and ``load_spec``, a spec file.

A spec file holds the keys of ``ExperimentSpec.to_dict`` (all optional; ``name`` defaults to the
file's stem)::

    name: e2e                                   # the study's name
    description: free text
    train: {batch_size: 32}                     # flat TrainConfig fields of every point
    grid:                                       # axis -> values, the Cartesian product (as a sweep's)
      variant:                                  # an axis of mappings sets several fields together
        - {recipe: SWITCH_ON_RECIPE, weighting: distribution, beta: 0.3, steps: 600}
        - {remedy: free_bits, weighting: plain, beta: 0.03}
      beta: [0.03, 0.3]                         # or {geomspace: [lo, hi, n]}, {linspace: [lo, hi, n]}
    data: {kind: folder, path: zfree:data/e2e}  # zfree_lab.experiment.spec.DataSource (config: DataConfig)
    base: {kind: folder, path: zfree:data/e2e/base}  # BaseSource (config: BaseTrainConfig)
    boundary:                                   # BoundaryGrid: betas relative to each weighting's beta*
      {weightings: [distribution], beta_factors: [0.333], aids: [none, hard_em], aided: {recipe: OWN_AID}}
    executor: local                             # zfree_lab.experiment.executor.EXECUTORS
    workers: 2
    executor_options: {}
    controls: true                              # the z-free control of every recipe
    oracles: null                               # null: every label; [] none; or label keys
    text_oracles: false                         # true: beside each label oracle, the label written into x
    seeds: null                                 # a list: every point once per seed
    overrides: {}                               # flat fields set on every point last

and beside the spec, what a shipped preset adds (``FILE_KEYS``; read by ``zfree_lab.experiment.catalog``,
skipped here): ``catalog`` (its line of ``zfree study --help``), ``bound`` (the model it fetches and
its data files) and ``anchors`` (mappings the file reuses with YAML aliases: ``<<: *name``).

A mapping of fields (``train``, a grid value, ``boundary.aided``) may name recipes: ``recipe: NAME``
(or a list) merges ``zfree.objective.remedies.RECIPES[NAME]`` first and ``remedy: NAME`` the
remedy's fields at the point's steps (``remedy_fields``); the mapping's own fields win. Each value is
typed by its field's declaration (YAML 1.1 reads ``1e-3`` as text: it becomes 0.001); ``zfree:<path>``
is a path under the repository root (a wheel's shipped files); a ``data_dir``/``base_dir`` of ``train``
resolves as a user names it (``zfree.core.paths.resolve_given``). Every point is expanded, so
validated, here (a boundary grid at a placeholder beta). Errors: one-line ConfigError naming the file
(``where``) and the key.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path
from typing import Any, get_args

import numpy as np

from zfree.config import BaseTrainConfig, TrainConfig, parse_field_value, unknown_fields_message
from zfree.core.errors import ConfigError
from zfree.core.io import read_yaml
from zfree.core.paths import ROOT, ROOT_PREFIX, check_name_length, resolve_given
from zfree.core.values import coerce_value
from zfree.data.synth import DataConfig
from zfree.objective.remedies import recipe_fields, remedy_fields
from zfree_lab.experiment.catalog import preset_files
from zfree_lab.experiment.executor import EXECUTORS
from zfree_lab.experiment.spec import (WEIGHTINGS, BaseKind, BaseSource, BoundaryGrid, DataKind, DataSource,
                                   ExperimentSpec, expand_grid)

#: the keys of a spec: ExperimentSpec's fields, as ``to_dict`` writes them
SPEC_KEYS = tuple(f.name for f in dataclasses.fields(ExperimentSpec))
#: what a spec file may hold beside the spec (a preset's): skipped here, read by ``zfree_lab.experiment.catalog``
FILE_KEYS = ("catalog", "bound", "anchors")


def axis_values(name: str, v: Any) -> list[Any]:
    """A grid axis: a non-empty list, or ``{geomspace|linspace: [lo, hi, n]}`` (geomspace: 0 < lo,
    hi; 1 <= n <= 10000) as its values rounded to 6 significant digits. Raises ConfigError naming
    ``grid.<name>``."""
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


@functools.cache
def _defaults() -> dict[str, Any]:
    """The default flat config (a remedy's steps and latent when no mapping sets them)."""
    return TrainConfig().to_flat()


def _typed(name: str, value: Any) -> Any:
    """``value`` for config field ``name`` typed by its declaration; a non-field passes (the
    points' ``TrainConfig.from_flat`` names it)."""
    return parse_field_value(name, value) if name in _defaults() else value


def expand_fields(key: str, m: Any, shared: dict[str, Any] | None = None) -> dict[str, Any]:
    """The mapping of config fields ``m`` (``key`` names it in errors) typed, with its recipes
    expanded (module docstring): ``recipe`` first, then ``remedy`` at the steps, latent kind and
    d_latent of ``m``, else of ``shared`` (the spec's ``train``), else the defaults; ``m``'s own
    fields win and come first. Raises ConfigError naming the field of a bad value, or ``key`` (not a
    mapping; an unknown recipe or remedy)."""
    if not isinstance(m, dict):
        raise ConfigError(f"{key} must be a mapping of config fields, got {m!r}")
    own = {str(k): _typed(str(k), v) for k, v in m.items() if k != "recipe"}  # a bad value names its field
    try:
        added = recipe_fields(m["recipe"]) if "recipe" in m else {}
        if "remedy" in own:
            at = {**_defaults(), **(shared or {}), **added, **own}
            added.update(remedy_fields(own["remedy"], steps=at["steps"], latent_kind=str(at["latent_kind"]),
                                       d_latent=at["d_latent"]))
    except ConfigError as e:
        raise ConfigError(f"{key}: {e}") from None
    return {**own, **{k: v for k, v in added.items() if k not in own}}


def _grid(grid: Any, train: dict[str, Any]) -> dict[str, list[Any]]:
    """The typed grid: each axis a config field's values or a list of mappings of fields."""
    if not isinstance(grid, dict):
        raise ConfigError(f"grid must be a mapping of axis -> values, got {grid!r}")
    out = {}
    for name, v in grid.items():
        name = str(name)
        values = axis_values(name, v)
        if name not in _defaults() and not all(isinstance(x, dict) for x in values):
            raise ConfigError(f"grid.{name}: {unknown_fields_message([name], _defaults())}; an axis of another "
                              "name must list dicts of fields")
        out[name] = [expand_fields(f"grid.{name}", x, train) if isinstance(x, dict) else _typed(name, x)
                     for x in values]
    return out


def _train(train: Any) -> dict[str, Any]:
    """The typed ``train`` fields (recipes expanded, data_dir/base_dir resolved)."""
    out = expand_fields("train", train)
    for k in ("data_dir", "base_dir"):
        if isinstance(out.get(k), str) and out[k]:
            out[k] = resolve_given(out[k])
    return out


def _mapping(key: str, v: Any, valid: tuple[str, ...]) -> dict[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, dict) or set(map(str, v)) - set(valid):
        got = sorted(set(map(str, v)) - set(valid)) if isinstance(v, dict) else v
        raise ConfigError(f"{key}: a mapping with keys among {list(valid)}; got {got!r}")
    return {str(k): x for k, x in v.items()}


def _path(key: str, v: Any) -> Path | None:
    """A path as a spec writes it: ``zfree:<path>`` under ROOT, else as given (None stays None)."""
    if v is None:
        return None
    if not isinstance(v, str) or not v.strip():
        raise ConfigError(f"{key}={v!r} must be a path")
    return ROOT / v[len(ROOT_PREFIX):] if v.startswith(ROOT_PREFIX) else Path(v)


def _config(key: str, cls: type, v: Any):
    """``cls`` (DataConfig, BaseTrainConfig) of a mapping, or None; its own checks type and validate."""
    if v is None:
        return None
    fields = _mapping(key, v, tuple(f.name for f in dataclasses.fields(cls)))
    try:
        return cls(**fields)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{key}: {e}") from None


def _kind(key: str, v: Any, kinds: Any) -> str:
    valid = get_args(kinds)
    if v not in valid:
        raise ConfigError(f"{key}={v!r} is not one of {list(valid)}")
    return v


def _count(key: str, v: Any, lo: int, optional: bool = False) -> int | None:
    if v is None and optional:
        return None
    n = coerce_value(key, v, int)
    if n < lo:
        raise ConfigError(f"{key}={n} must be an integer >= {lo}")
    return n


def _data(v: Any) -> DataSource:
    d = _mapping("data", v, tuple(f.name for f in dataclasses.fields(DataSource)))
    kw = {"kind": _kind("data.kind", d.get("kind", "shipped"), DataKind),
          "config": _config("data.config", DataConfig, d.get("config")),
          "path": _path("data.path", d.get("path")), "val": _path("data.val", d.get("val"))}
    if "val_size" in d:
        kw["val_size"] = _count("data.val_size", d["val_size"], 1)
    if "val_rows" in d:
        kw["val_rows"] = _count("data.val_rows", d["val_rows"], 1, optional=True)
    return DataSource(**kw)


def _base(v: Any) -> BaseSource:
    d = _mapping("base", v, tuple(f.name for f in dataclasses.fields(BaseSource)))
    kind = _kind("base.kind", d.get("kind", "shipped"), BaseKind)
    path = d.get("path")
    if kind != "pretrained":  # a pretrained model may be a hub id: kept as written
        path = _path("base.path", path)
    elif path is not None and not isinstance(path, str):
        raise ConfigError(f"base.path={path!r} must be a folder, a .gguf file or a hub id")
    return BaseSource(kind, _config("base.config", BaseTrainConfig, d.get("config")), path,
                      _count("base.finetune_steps", d.get("finetune_steps", 0), 0))


def _boundary(v: Any, train: dict[str, Any]) -> BoundaryGrid | None:
    if v is None:
        return None
    d = _mapping("boundary", v, tuple(f.name for f in dataclasses.fields(BoundaryGrid)))
    kw: dict[str, Any] = {}
    for key in ("weightings", "beta_factors", "aids"):
        if key in d:  # BoundaryGrid names a bad weighting or aid; a lone string is refused there
            kw[key] = tuple(d[key]) if isinstance(d[key], list) else d[key]
    for f in kw.get("beta_factors", ()):
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not (math.isfinite(f) and f > 0):
            raise ConfigError(f"boundary.beta_factors={d['beta_factors']!r} must be a list of numbers > 0")
    if "aided" in d:
        kw["aided"] = expand_fields("boundary.aided", d["aided"], train)
    if "extra" in d:  # [{weighting, beta_factor, aid}, ...] (or [w, f, aid] as to_dict writes them): single points
        keys = ("weighting", "beta_factor", "aid")
        ok = isinstance(d["extra"], list) and all(
            (isinstance(e, dict) and set(e) == set(keys)) or (isinstance(e, list) and len(e) == 3) for e in d["extra"])
        if not ok:
            raise ConfigError(f"boundary.extra={d['extra']!r} must be a list of {{weighting, beta_factor, aid}} mappings")
        kw["extra"] = tuple(tuple(e[k] for k in keys) if isinstance(e, dict) else tuple(e) for e in d["extra"])
    g = BoundaryGrid(**kw)
    if "hard_em" in g.aids and not g.aided:
        raise ConfigError("boundary.aided: the hard_em aid needs its fields (e.g. {recipe: OWN_AID})")
    return g


def _run_keys(d: dict[str, Any]) -> dict[str, Any]:
    """name, description, executor, workers and executor_options, validated."""
    name = d.get("name")
    if not isinstance(name, str) or not name or "/" in name or name in (".", "..") or "\0" in name:
        raise ConfigError(f"name={name!r} must be a folder name (no '/')")
    check_name_length(name, "name")
    ex = d.get("executor", "local")
    if not isinstance(ex, str) or ex not in EXECUTORS:
        raise ConfigError(f"executor={ex!r} is not one of {sorted(EXECUTORS)}")
    workers = _count("workers", d.get("workers", 2), 1)
    opts = d.get("executor_options") or {}
    if not isinstance(opts, dict):
        raise ConfigError(f"executor_options must be a mapping, got {opts!r}")
    description = d.get("description")
    return {"name": name, "description": "" if description is None else str(description), "executor": ex,
            "workers": workers, "executor_options": dict(opts)}


def _control_keys(d: dict[str, Any]) -> dict[str, Any]:
    """``controls`` (true: the z-free control of every recipe), ``oracles`` (null: every label all
    rows carry; a list of label keys; [] none), ``text_oracles`` (true: each oracle's text oracle too) and
    ``seeds`` (null: the points' own; a list: every point once per seed), validated."""
    controls, oracles, seeds = d.get("controls", True), d.get("oracles"), d.get("seeds")
    text = d.get("text_oracles", False)
    if not isinstance(controls, bool):
        raise ConfigError(f"controls={controls!r} must be true or false")
    if not isinstance(text, bool):
        raise ConfigError(f"text_oracles={text!r} must be true or false")
    if oracles is not None and (not isinstance(oracles, (list, tuple))
                                or not all(isinstance(k, str) and k for k in oracles)):
        raise ConfigError(f"oracles={oracles!r} must be a list of label keys (or null: every label)")
    if seeds is not None and (not isinstance(seeds, (list, tuple)) or not seeds
                              or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in seeds)):
        raise ConfigError(f"seeds={seeds!r} must be a list of integers >= 0 (each point runs once per seed)")
    return {"controls": controls, "oracles": None if oracles is None else tuple(oracles), "text_oracles": text,
            "seeds": None if seeds is None else tuple(seeds)}


def check_points(spec: ExperimentSpec) -> None:
    """Expand (so validate) every point of ``spec`` with its overrides; a boundary grid's at beta 1
    (its betas are known once the reference is). Raises ValueError naming the field."""
    grid = spec.grid
    if spec.boundary is not None:
        b = spec.boundary
        grid = {**grid, "variant": [{**WEIGHTINGS[w], "beta": 1.0, **(b.aided if aid == "hard_em" else {})}
                                    for w in b.weightings for aid in b.aids]}
    expand_grid({**_defaults(), **spec.train}, spec.seeded(grid), spec.overrides)


def _spec(d: Any, check: bool) -> ExperimentSpec:
    if not isinstance(d, dict):
        raise ConfigError(f"a spec is a mapping with keys among {list(SPEC_KEYS)}, got {type(d).__name__}")
    unknown = sorted(set(map(str, d)) - set(SPEC_KEYS))
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown}; valid: {list(SPEC_KEYS)}")
    train = _train(d.get("train") or {})
    overrides = d.get("overrides") or {}
    if not isinstance(overrides, dict):
        raise ConfigError(f"overrides must be a mapping of config fields, got {overrides!r}")
    spec = ExperimentSpec(grid=_grid(d.get("grid") or {}, train), train=train, data=_data(d.get("data")),
                          base=_base(d.get("base")), boundary=_boundary(d.get("boundary"), train),
                          overrides={str(k): parse_field_value(str(k), v) for k, v in overrides.items()},
                          **_run_keys(d), **_control_keys(d))
    if check:
        check_points(spec)
    return spec


def spec_from_dict(d: dict[str, Any], where: Path | str | None = None, *, check: bool = True) -> ExperimentSpec:
    """The validated ``ExperimentSpec`` of a mapping with the keys of ``ExperimentSpec.to_dict``
    (module docstring; ``to_dict``'s own output reads back equal). Raises ConfigError in one line
    naming ``where`` (the file it came from) and the key: an unknown key or field, a value of the
    wrong type, an unknown recipe, remedy, weighting, aid, executor or source kind, a point that
    does not validate. ``check=False``: the points are not expanded (``check_points``; the pipeline
    expands them before anything runs)."""
    try:
        return _spec(d, check)
    except (ValueError, TypeError) as e:  # ConfigError is a ValueError; TypeError: a value of the wrong kind
        raise ConfigError(f"{where}: {e}" if where is not None else str(e)) from None


def read_spec_mapping(path: Path, kind: str, keys: list[str]) -> dict:
    """The YAML mapping of the ``kind`` spec file ``path`` (a study "spec" or a "sweep spec"). Raises
    FileNotFoundError when the file does not exist, InputError for text that is not YAML
    (``zfree.core.io.read_yaml``), ConfigError naming the file and the valid ``keys`` when the text is
    not a mapping."""
    if not path.is_file():
        raise FileNotFoundError(f"{kind} {path} does not exist")
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a {kind} is a mapping with keys among {keys}")
    return raw


def load_spec(path: Path | str, *, check: bool = True) -> ExperimentSpec:
    """The ``ExperimentSpec`` of a spec file (module docstring): its ``FILE_KEYS`` skipped, its
    name the file's stem unless it names one; ``check``: as ``spec_from_dict``'s. Raises
    FileNotFoundError when the file does not exist, InputError for text that is not YAML
    (``zfree.core.io.read_yaml``), ConfigError naming the file and the key for anything
    ``spec_from_dict`` refuses."""
    p = Path(path)
    raw = read_spec_mapping(p, "spec", list(SPEC_KEYS + FILE_KEYS))
    d = {k: v for k, v in raw.items() if k not in FILE_KEYS}
    return spec_from_dict({**d, "name": d.get("name") or p.stem}, where=p, check=check)


@functools.cache
def shipped_presets() -> dict[str, ExperimentSpec]:
    """Every shipped preset (``zfree_lab.experiment.catalog.preset_files``): name -> its spec, loaded once,
    its points not expanded here (0.4 s on every import; tests/test_presets.py expands every preset's).
    Raises ConfigError naming the file of a preset that does not load, or whose name is not its file's."""
    out = {}
    for name, path in preset_files().items():
        spec = load_spec(path, check=False)
        if spec.name != name:
            raise ConfigError(f"{path}: name={spec.name!r}: a preset is named after its file ({name!r})")
        out[name] = spec
    return out
