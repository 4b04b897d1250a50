"""One description of an experiment: ``ExperimentSpec``, what every preset, YAML sweep spec and
own-model grid is, and the grid expansion they share (``expand_grid`` into ``Point``s).

An experiment is a grid over flat ``TrainConfig`` fields (``grid``: axis -> values, a value that is
a dict sets several fields together; ``train``: the fields every point shares) run on a data
source and a base source (``DataSource``, ``BaseSource``). Where the betas are chosen relative to
the predicted boundary beta* of each weighting (own data), ``boundary`` (``BoundaryGrid``) says
how; the pipeline (``zfree_lab.experiment.study.run_experiment``) turns it into grid points once the
z-free reference is known (``own_grid``). ``to_dict`` writes a spec as JSON-able data;
``zfree_lab.experiment.spec_file.spec_from_dict``, the one loader of specs, reads it back (and every
spec file: the presets, the YAML sweeps, the own-data grids).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal

import numpy as np

from zfree.config import BaseTrainConfig, LatentSource, TrainConfig, run_hash
from zfree.core.errors import ConfigError
from zfree.core.weightings import WEIGHTINGS as WEIGHTING_REGISTRY
from zfree.data.synth import DataConfig
from zfree.objective.remedies import check_remedy_fields


#: the longest label a run id names as it is (ASCII only); a longer or non-ASCII one is named by its hash.
#: Every ASCII label of an existing study keeps its folder: up to 226 characters fit a 255-byte name
#: with "oracle-" and "_distribution_<8 hex>", and none longer ever trained
LABEL_NAME_MAX = 200


def label_name(label: str) -> str:
    """The label's part of an oracle's run id: an ASCII label of at most ``LABEL_NAME_MAX`` characters as
    it always was (``*`` written ``x``, any other character but ``A-Za-z0-9_.-`` as ``-``), so existing
    studies resume; a longer or non-ASCII one as its first ASCII characters (at most 24) and 10 hex of
    the sha256 of its UTF-8, a name every file system takes (a 300-character key was "File name too
    long", issue 61). The label itself is kept in the config (``latent_source``)."""
    text = label.replace("*", "x")
    if text.isascii() and len(text) <= LABEL_NAME_MAX:
        return re.sub(r"[^A-Za-z0-9_.-]", "-", text)
    digest = hashlib.sha256(label.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    head = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:24].strip("-")
    return f"{head}-{digest}" if head else digest


def run_id(flat: dict[str, Any]) -> str:
    """Stable id: ``<weighting>_beta<beta>[_<aid>]_<hash>`` (``zfree.config.run_hash``: of the run's
    identity, its data and base folders by what they hold); a given-z run (``latent_source``):
    ``control_<weighting>_<hash>`` or ``oracle-<label_name(key)>_<weighting>_<hash>`` (``null-`` and
    ``text-`` for a null or text oracle)."""
    h = run_hash(flat)
    src = LatentSource.parse(flat.get("latent_source"))
    if src.given:
        name = "control" if src.kind == "control" else \
            {"label": "oracle-", "null": "null-", "text": "text-"}[src.kind] + label_name(src.label)
        return f"{name}_{flat['weighting']}_{h}"
    aid = flat.get("aid", "none")
    prefix = f"{flat['weighting']}_beta{flat['beta']:g}" + ("" if aid in (None, "none") else f"_{aid}")
    return f"{prefix}_{h}"


@dataclass(frozen=True)
class Point:
    """One grid point: its stable run id and flat config."""
    run_id: str
    params: dict[str, Any]  # the flat TrainConfig


def expand_grid(base: dict[str, Any], grid: dict[str, Iterable[Any]], overrides: dict[str, Any] | None = None
                ) -> list[Point]:
    """Cartesian product of ``grid`` over the flat ``base`` config; every point is validated
    (``TrainConfig.from_flat``) before anything runs, so a bad value fails the whole sweep early.
    A grid value that is a dict sets several fields at once (e.g. weighting with its epsilon);
    ``overrides`` (``zfree study --set``) are set last, on every point."""
    keys = list(grid)
    points, seen = [], set()
    for values in itertools.product(*(list(grid[k]) for k in keys)):
        flat = dict(base)
        for k, v in zip(keys, values):
            flat.update(v if isinstance(v, dict) else {k: v})
        flat.update(overrides or {})
        cfg = TrainConfig.from_flat(flat)
        check_remedy_fields(cfg)
        flat = cfg.to_flat()
        p = Point(run_id(flat), flat)
        if p.run_id not in seen:  # two axes values that land on one config run once
            seen.add(p.run_id)
            points.append(p)
    return points


DataKind = Literal["shipped", "synthetic", "folder", "jsonl", "fields"]
BaseKind = Literal["shipped", "trained", "folder", "pretrained", "fields"]


@dataclass(frozen=True)
class DataSource:
    """Where the pairs come from.

    shipped: the shipped benchmark (data/synth/default, hash-checked); synthetic: the benchmark of
    ``config`` written into OUT/data; folder: a data folder with train/val.jsonl used in place
    (``path``); jsonl: a user's JSONL file (``path``; None: given at run time) split by x into OUT
    (``val_size`` rows), or used with its ``val`` file as it is (``val_rows``: only that many of its
    rows, spread over its x by ``zfree_lab.run.split.spread_sample``); fields: the points' own
    ``data_dir`` (a YAML sweep's ``base``/``grid``)."""
    kind: DataKind = "shipped"
    config: DataConfig | None = None
    path: Path | None = None
    val: Path | None = None
    val_size: int = 500
    val_rows: int | None = None


@dataclass(frozen=True)
class BaseSource:
    """The z-free base model the CVAEs start from.

    shipped: the shipped base run copied into OUT/base (trained there with ``retrain_base``);
    trained: a base trained from ``config`` into OUT/base; folder: a base run folder used in place
    (``path``); pretrained: a user's model (``path``: a folder, .gguf or hub id; None: given at run
    time) linked as OUT/base/model, its reference the pretrained-source setting, fine-tuned on the
    train split first when ``finetune_steps`` > 0 (the entangled-run setting); fields: the points'
    own ``base_dir``."""
    kind: BaseKind = "shipped"
    config: BaseTrainConfig | None = None
    path: Path | str | None = None
    finetune_steps: int = 0


#: the weightings of an own-data grid and the fields each sets
WEIGHTINGS = {name: w.grid_fields for name, w in WEIGHTING_REGISTRY.items()}

#: the aids of an own-data grid: "none" runs unaided, "hard_em" with the grid's ``aided`` fields
#: (the study's recipe: config aid "hard_em_then_soft"); any other name is refused, never run unaided
GRID_AIDS = ("none", "hard_em")


@dataclass(frozen=True)
class BoundaryGrid:
    """Betas relative to the predicted boundary: per weighting (keys of ``WEIGHTINGS``), beta =
    factor x beta* for each of ``beta_factors``, each run unaided (aid "none") and/or with the
    fields ``aided`` (aid "hard_em"); ``extra``: single points outside that cross product, each a
    (weighting, beta factor, aid) triple (e.g. one weighting with the aid at 3 beta*, where theory
    predicts no use)."""
    weightings: tuple[str, ...] = tuple(WEIGHTINGS)
    beta_factors: tuple[float, ...] = (1 / 3, 3.0)
    aids: tuple[str, ...] = ("none", "hard_em")
    aided: dict[str, Any] = field(default_factory=dict)
    extra: tuple[tuple[str, float, str], ...] = ()

    def __post_init__(self):
        for key, valid in (("weightings", WEIGHTINGS), ("aids", GRID_AIDS)):
            values = getattr(self, key)
            if isinstance(values, str) or not all(isinstance(v, str) for v in values):
                shown = values if isinstance(values, str) else list(values)
                raise ConfigError(f"{key}={shown!r}: give a list of names among {list(valid)}")
            bad = [v for v in values if v not in valid]
            if bad:
                hint = (" (the hard-EM aid of a grid is 'hard_em': the config aid 'hard_em_then_soft' with the grid's "
                        "aided fields)" if key == "aids" else "")
                raise ConfigError(f"{key}: {bad} not among {list(valid)}{hint}")
        for t in self.extra:
            if not (isinstance(t, tuple) and len(t) == 3 and t[0] in WEIGHTINGS and t[2] in GRID_AIDS
                    and isinstance(t[1], (int, float)) and not isinstance(t[1], bool) and t[1] > 0):
                raise ConfigError(f"extra={t!r}: each extra point is (weighting among {list(WEIGHTINGS)}, a beta "
                                  f"factor > 0, aid among {list(GRID_AIDS)})")


@dataclass(frozen=True)
class ExperimentSpec:
    """A grid of CVAE runs on a data and a base source, and the executor to run it on."""
    name: str
    grid: dict[str, list[Any]] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)  # flat TrainConfig overrides of every point
    data: DataSource = DataSource()
    base: BaseSource = BaseSource()
    boundary: BoundaryGrid | None = None  # betas relative to beta*, expanded once the reference is known
    description: str = ""
    executor: str = "local"
    workers: int = 2
    executor_options: dict[str, Any] = field(default_factory=dict)
    # the z-free control of every CVAE recipe and the label oracles (``zfree_lab.experiment.controls``):
    # ``controls`` False trains neither; ``oracles`` None = every label all rows carry, () = none,
    # else the label keys (a joint ``a*b`` allowed)
    controls: bool = True
    oracles: tuple[str, ...] | None = None
    # beside each label oracle, its text oracle (the label written into x, K = 1: ``zfree_lab.run.text_oracle``);
    # off by default: it trains one more z-free arm per label and seed
    text_oracles: bool = False
    # flat TrainConfig fields set on every point after the grid (``zfree study --set FIELD=VALUE``)
    overrides: dict[str, Any] = field(default_factory=dict)
    # training seeds: every point runs once per seed (``optim.seed``: batches and the new
    # heads' initialization; each seed gets its own control); None = the points' own seed
    seeds: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.seeds is not None:
            seeds = tuple(self.seeds)
            if not seeds or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in seeds) \
                    or len(set(seeds)) != len(seeds):
                raise ConfigError(f"seeds={list(seeds)!r} must be a non-empty list of distinct integers >= 0")
            if "seed" in self.grid:
                raise ConfigError("seeds and a grid axis 'seed' both set the seed: give one")
            object.__setattr__(self, "seeds", seeds)

    @property
    def val_size(self) -> int:
        """The validation rows split off a JSONL data source."""
        return self.data.val_size

    def points(self, **fields) -> list[Point]:
        """The validated grid points: ``expand_grid`` over the default config, ``train`` and ``fields``,
        each point once per seed of ``seeds`` (the seeds of one point adjacent)."""
        return expand_grid({**TrainConfig().to_flat(), **self.train, **fields}, self.seeded(self.grid))

    def seeded(self, grid: dict[str, list[Any]]) -> dict[str, list[Any]]:
        """``grid`` with the ``seeds`` axis last (the seeds of one point adjacent), or as it is."""
        return grid if self.seeds is None else {**grid, "seed": list(self.seeds)}

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (paths as strings); ``zfree_lab.experiment.spec_file.spec_from_dict`` reads it back."""
        return json.loads(json.dumps(dataclasses.asdict(self), default=str))


def predicted_boundary(weighting: str, ref, epsilon: float = 0.05) -> float:
    """beta* of ``weighting`` (token: its outer weighting, distribution) at the validation rows'
    |S| and b: the median over rows of ``zfree.objective.theory.critical_beta`` (threshold 1; no Bayes loss)."""
    from zfree.objective.theory import critical_beta  # torch: here, so `zfree status` (spec's importers) stays light

    pe = ref.per_example
    if "valid" in pe.columns:
        pe = pe[pe["valid"].to_numpy(dtype=bool)]
    w = "distribution" if weighting == "token" else weighting
    beta = critical_beta(w, pe["n_tokens"].to_numpy(float), b=pe["b"].to_numpy(float), c_base=ref.c_base,
                         epsilon=epsilon)
    return float(np.median(beta))


def own_grid(spec: ExperimentSpec | BoundaryGrid, ref) -> tuple[list[dict], list[dict]]:
    """The variants (flat field dicts) of a boundary grid and a table of the predictions used:
    one row per weighting with beta* and the betas run."""
    g = spec if isinstance(spec, BoundaryGrid) else spec.boundary
    variants, table = [], []
    for name in g.weightings:
        wcfg = WEIGHTINGS[name]
        b_star = predicted_boundary(name, ref, wcfg.get("epsilon", 0.05))
        betas = [float(f"{f * b_star:.4g}") for f in g.beta_factors]
        table.append({"weighting": name, "beta_star": b_star, "betas": betas})
        for beta in betas:
            for aid in g.aids:  # each among GRID_AIDS (BoundaryGrid refuses another)
                variants.append({**wcfg, "beta": beta, **(g.aided if aid == "hard_em" else {})})
    for name, factor, aid in g.extra:  # the single points beside the cross product
        wcfg = WEIGHTINGS[name]
        beta = float(f"{factor * predicted_boundary(name, ref, wcfg.get('epsilon', 0.05)):.4g}")
        variants.append({**wcfg, "beta": beta, **(g.aided if aid == "hard_em" else {})})
        row = next((t for t in table if t["weighting"] == name), None)
        if row is None:
            table.append({"weighting": name, "beta_star": beta / factor, "betas": [beta]})
        elif beta not in row["betas"]:
            row["betas"].append(beta)
    return variants, table
