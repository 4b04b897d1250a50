"""Sweep spec (YAML) -> a validated ``zfree_lab.experiment.spec.ExperimentSpec`` -> the study pipeline
(``zfree_lab.experiment.pipeline.run_experiment``: papermill runs on an executor, ``zfree_lab.experiment.executor``)
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
    executor: local                     # local | submitit (``zfree_lab.experiment.executor.make_executor``)
    workers: 2
    executor_options: {}                # submitit: cluster, timeout_min, slurm_partition, ...

Relative ``data_dir``/``base_dir`` resolve against the working directory when they exist there,
else against the repository root; a spec that names neither gets the config's defaults (the shipped
benchmark and its base run), resolved the same way. ``load_spec`` validates every point before anything runs; each
value is typed by its field's declaration (``lr_new: 1e-3``, a string in YAML 1.1, is the float
0.001; ``steps: true`` is refused), and every error names the file and the field. A sweep spec is
the short form of a spec file (``zfree_lab.experiment.spec_file``, the one loader of every spec): an
axis of mappings may name recipes there too (``recipe: SWITCH_ON_RECIPE``, ``remedy: free_bits``).

A sweep holds the lock of its folder and of its ``runs/`` (``zfree_lab.run.locks``) while it runs, so
a second sweep or study on them is refused naming the holder's pid. A YAML spec's points name their
own ``data_dir``/``base_dir`` (its data and base sources are ``fields``).
"""

from __future__ import annotations

from pathlib import Path

from zfree.config import TrainConfig
from zfree.core.errors import ConfigError
from zfree.core.io import atomic_write_json
from zfree_lab.run.locks import STUDY_MARKS, check_own_folder, run_folder_lock
from zfree.core.paths import check_name_length
from zfree_lab.experiment.executor import Executor
from zfree_lab.experiment.pipeline import run_experiment
from zfree_lab.experiment.spec import ExperimentSpec
from zfree_lab.experiment.spec_file import read_spec_mapping, spec_from_dict

_SPEC_KEYS = {"name", "description", "base", "grid", "executor", "workers", "executor_options", "controls", "oracles",
              "seeds"}


def load_spec(path: Path | str, check_paths: bool = True) -> ExperimentSpec:
    """Read and validate a sweep spec into an ``ExperimentSpec`` (data and base sources ``fields``;
    the YAML ``base`` is its ``train``) through the one spec loader,
    ``zfree_lab.experiment.spec_file.spec_from_dict``: unknown keys, an empty grid, an unknown config
    field or a bad value raise ConfigError (a ValueError) naming the file and the field; with
    ``check_paths`` a missing data_dir/base_dir raises FileNotFoundError. Every point is expanded
    (and validated) here."""
    path = Path(path)
    raw = read_spec_mapping(path, "sweep spec", sorted(_SPEC_KEYS))
    unknown = sorted(set(raw) - _SPEC_KEYS)
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {unknown}; valid: {sorted(_SPEC_KEYS)}")
    if not isinstance(raw.get("grid"), dict) or not raw["grid"]:
        raise ConfigError(f"{path}: grid must be a non-empty mapping of axis -> values")
    if not isinstance(raw.get("base") or {}, dict):
        raise ConfigError(f"{path}: base must be a mapping of config fields, got {raw['base']!r}")
    name = str(raw.get("name") or path.stem)
    check_name_length(name, f"{path}: name", extra=len("sweep-"))  # the default folder runs/sweep-<name>
    # the config's own data_dir/base_dir when the spec names none, resolved here as a user's would be (a run's
    # kernel works in its run folder, where a relative default would name nothing)
    train = {**{k: getattr(TrainConfig, k) for k in ("data_dir", "base_dir")}, **(raw.get("base") or {})}
    d = {**{k: v for k, v in raw.items() if k != "base"}, "name": name, "train": train,
         "data": {"kind": "fields"}, "base": {"kind": "fields"}}
    spec = spec_from_dict(d, where=path)
    if check_paths:
        for k in ("data_dir", "base_dir"):
            for p in {pt.params[k] for pt in spec.points()}:
                if not Path(p).exists():
                    raise FileNotFoundError(f"{path}: {k}={p} does not exist")
    return spec


def run_sweep(spec: ExperimentSpec | Path | str, out_dir: Path | str, *, executor: Executor | None = None,
              workers: int | None = None, progress: bool = True, render: bool = False) -> list[dict]:
    """Run a spec into ``out_dir/runs/<run_id>/`` (finished points skipped), then write the tidy
    tables (``aggregate``) and, with ``render``, report.html (``run_experiment``; not when no point finished). ``out_dir/spec.json`` records the
    expanded spec. Raises ``LockHeldError`` when another process runs a sweep in ``out_dir``."""
    spec = spec if isinstance(spec, ExperimentSpec) else load_spec(spec)
    out = Path(out_dir).resolve()
    check_own_folder(out, "sweep folder", STUDY_MARKS)  # before its lock marks it zfree's own
    with run_folder_lock(out, "sweep folder"):  # a second sweep on `out` is refused, naming this pid
        atomic_write_json(out / "spec.json", {"name": spec.name, "description": spec.description,
                                              "base": spec.train, "grid": spec.grid,
                                              "run_ids": [p.run_id for p in spec.points()]})
        return run_experiment(spec, out, executor=executor, workers=workers, progress=progress, render=render,
                              kind="sweep").statuses
