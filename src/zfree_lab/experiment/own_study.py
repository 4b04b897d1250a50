"""Your own model and data in one command: ``zfree study --model MODEL --data FILE.jsonl --out DIR``.

Steps (``run_own_study``: the study pipeline ``zfree_lab.experiment.pipeline.run_experiment`` on a JSONL data
source and a pretrained base source, ``zfree_lab.experiment.sources``), each skipped when its output is
already there and matches:

1. the split (``split_data``): one JSONL file is split *by x* (``zfree_lab.run.split.split_pairs``)
   into ``DIR/train.jsonl`` and ``DIR/val.jsonl``; a given ``--val`` file is used as it is (the x it
   shares with train are warned with their count). ``DIR`` is then the runs' ``data_dir``.
   Unconditional text (x empty, absent or one constant prompt in every row) has its x dropped and is
   split by row, no y on both sides: the study then models p(y | z) against the LM's own p(y), and
   notes.json and the report say "unconditional"; conditional rows with too few x for a split by x
   are split by row, with a note.
2. the base folder (``link_model``): ``DIR/base/model`` is a *symlink* to the model (a folder, a
   folder holding the one ``.gguf`` file, or the hub snapshot of a hub id) -- multi-GB weights are
   never copied; ``DIR/base/source.json`` records what was given.
3. the z-free reference, pretrained-source setting (``write_reference``): the validation rows scored
   by the source model, ``DIR/base/reference/`` (reference.json says ``estimator:
   pretrained_source``); the runs recompute it from the same model (cached scores).
4. the grid (``zfree_lab.experiment.spec.own_grid``): per weighting, the predicted boundary beta* (``zfree.objective.theory.critical_beta``
   at the median |S| and b of the validation rows; without a Bayes loss the threshold is 1, the
   z-free model's own loss being the excess), then ``beta_factors`` x beta*, each unaided and with
   the hard-EM aid.
5. the runs (papermill, ``zfree_lab.experiment.executor.run_points``) and the report
   (``zfree_lab.experiment.render.render_report``).

Notes about what cannot be measured (labels absent, no metadata.json) go to ``DIR/notes.json`` and the
report (``label_notes``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from zfree.config import TrainConfig
from zfree.core.errors import ConfigError
from zfree.core.io import read_yaml
from zfree_lab.run.locks import claim_folder
from zfree.data.pairs import check_data_file, data_limits
from zfree_lab.experiment.catalog import preset_catalog
from zfree_lab.experiment.pipeline import run_experiment
from zfree_lab.experiment.sources import link_model, split_data, write_reference
from zfree_lab.experiment.spec import BaseSource, ExperimentSpec
from zfree_lab.experiment.spec_file import shipped_presets, spec_from_dict

#: the presets of your own model and data (``base: {kind: pretrained}``): name -> its spec
#: (``analysis/studies/presets/<name>.yaml``: own, own_smoke, e2e-smollm2)
OWN_PRESETS: dict[str, ExperimentSpec] = {n: s for n, s in shipped_presets().items() if s.base.kind == "pretrained"}

#: presets bound to a model zfree fetches (``zfree_lab.run.fetch``) and the shipped data (their file's
#: ``bound``): ``zfree study --preset NAME --out DIR`` needs no --model or --data. name -> (model, train
#: file, val file)
BOUND_PRESETS: dict[str, tuple[str, Path, Path]] = {n: e.bound for n, e in preset_catalog().items() if e.bound}

#: the keys of an own-model grid YAML (``load_own_spec``), the short form of an own-data spec
OWN_SPEC_KEYS = ("name", "weightings", "beta_factors", "aids", "train", "aided_train", "val_size", "workers", "oracles",
                 "val_rows")


def load_own_spec(path: Path | str) -> ExperimentSpec:
    """An own-model grid from a YAML file with keys ``OWN_SPEC_KEYS`` (every one optional; the
    defaults are the ``own`` preset's: every weighting at beta*/3 and 3 beta*, unaided and with the
    hard-EM aid ``OWN_AID`` under ``aided_train``), read as the spec of a JSONL data source and a
    pretrained base (given at run time) by ``zfree_lab.experiment.spec_file.spec_from_dict``. Raises
    FileNotFoundError for a missing file, InputError for text that is not YAML, ConfigError naming
    the file and the key otherwise."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"study spec {p} does not exist")
    raw = read_yaml(p)
    raw = {} if raw is None else raw
    valid = set(OWN_SPEC_KEYS)
    if not isinstance(raw, dict) or set(raw) - valid:
        raise ConfigError(f"{p}: a study spec is a mapping with keys among {sorted(valid)}; got "
                          f"{sorted(set(raw) - valid) if isinstance(raw, dict) else type(raw).__name__}")
    aided = raw.get("aided_train") or {}
    if not isinstance(aided, dict):
        raise ConfigError(f"{p}: aided_train must be a mapping of config fields, got {aided!r}")
    boundary = {k: _as_list(p, k, raw[k]) for k in ("weightings", "beta_factors", "aids") if k in raw}
    d = {"name": str(raw.get("name") or p.stem), "train": raw.get("train") or {},
         "data": {"kind": "jsonl", **{k: raw[k] for k in ("val_size", "val_rows") if k in raw}},
         "base": {"kind": "pretrained"}, "boundary": {**boundary, "aided": {"recipe": "OWN_AID", **aided}},
         **{k: raw[k] for k in ("workers",) if k in raw},
         "oracles": None if raw.get("oracles") is None else _as_list(p, "oracles", raw["oracles"])}
    return spec_from_dict(d, where=p)


def _as_list(p: Path, key: str, v: Any) -> list:
    """A spec list value as a list (a lone scalar as a one-element one); ConfigError for a mapping."""
    if isinstance(v, (str, int, float)) and not isinstance(v, bool):
        return [v]
    if not isinstance(v, list):
        raise ConfigError(f"{p}: {key} must be a list, got {v!r}")
    return v


def _check_data_files(*files: Path | str | None) -> None:
    """``zfree.data.pairs.check_data_file`` of each file given (the data and the val file): a folder,
    a device (/dev/zero), a file over the data limit, refused in one line before anything is written."""
    for f in files:
        if f is not None:
            check_data_file(Path(f), data_limits()[0])


def _own_spec(preset: str | ExperimentSpec, spec: Path | str | None) -> ExperimentSpec:
    if spec is not None:
        return load_own_spec(spec)
    if isinstance(preset, ExperimentSpec):
        return preset
    if preset in OWN_PRESETS:
        return OWN_PRESETS[preset]
    raise ValueError(f"preset={preset!r} is not one of {sorted(OWN_PRESETS)} (own model and data)")


#: fine-tuning steps of ``--finetune-base`` where neither ``--finetune-steps`` nor the preset gives them
DEFAULT_FINETUNE_STEPS = 300


def own_base(base: BaseSource, model: str, *, finetune: bool = False, finetune_steps: int | None = None) -> BaseSource:
    """The base of an own-model study: ``model`` (pretrained), fine-tuned on the train split first for
    ``finetune_steps`` when given (``zfree study --finetune-steps``; 0: not fine-tuned), else for the preset's
    own ``base.finetune_steps`` (a preset in the entangled setting, such as factorial-smollm2, keeps it),
    else ``DEFAULT_FINETUNE_STEPS`` when ``finetune`` (``--finetune-base``), else 0. ValueError for a
    negative ``finetune_steps``."""
    if finetune_steps is not None and finetune_steps < 0:
        raise ValueError(f"finetune_steps={finetune_steps}: must be 0 or more")
    own = base.finetune_steps if base.kind == "pretrained" else 0
    steps = finetune_steps if finetune_steps is not None else own or (DEFAULT_FINETUNE_STEPS if finetune else 0)
    return BaseSource("pretrained", path=str(model), finetune_steps=steps)


def run_own_study(model: str, data: Path | str, out_dir: Path | str, *, val: Path | str | None = None,
                  preset: str | ExperimentSpec = "own", spec: Path | str | None = None, workers: int | None = None,
                  progress: bool = True, render: bool = True, finetune: bool = False,
                  finetune_steps: int | None = None, estimate: bool = False, budget_s: float | None = None,
                  overrides: dict | None = None, seeds: tuple[int, ...] | None = None,
                  started: float | None = None) -> Path:
    """Run the own-model study into ``out_dir`` (module docstring): the pipeline on ``preset`` (or
    the YAML ``spec``) with ``data`` (+ ``val``) and ``model`` as its sources; returns report.html
    (or the study folder when ``render`` is False); ``estimate``/``budget_s``: as
    ``run_experiment``; ``finetune``/``finetune_steps``: the base's fine-tuning (``own_base``: the preset's
    own ``base.finetune_steps`` unless given). ValueError listing the presets for an unknown one; errors of
    each step as documented there, raised before any run starts. ``overrides``: flat TrainConfig fields set on
    every run (``zfree study --set``); ``started``: as ``run_experiment``."""
    p = _own_spec(preset, spec)
    if overrides:
        p = dataclasses.replace(p, overrides={**p.overrides, **overrides})
    if seeds is not None:  # zfree study --seeds: every run once per seed
        p = dataclasses.replace(p, seeds=tuple(seeds))
    p = dataclasses.replace(p, data=dataclasses.replace(p.data, kind="jsonl", path=Path(data),
                                                        val=None if val is None else Path(val)),
                            base=own_base(p.base, model, finetune=finetune, finetune_steps=finetune_steps))
    _check_data_files(data, val)  # a device, or a file over the data limits: refused before the folder is made
    res = run_experiment(p, out_dir, workers=workers, progress=progress, render=render, estimate=estimate,
                         budget_s=budget_s, started=started)
    return res.html if render else res.out


def own_train_config(model: str, data: Path | str, out_dir: Path | str, *, val: Path | str | None = None,
                     overrides: dict | None = None) -> TrainConfig:
    """``zfree train --model M --data F --out RUN``: steps 1-3 of the study into ``RUN/`` (split,
    base link, reference), then the ``TrainConfig`` of one CVAE there (``RUN`` is also the run folder);
    the split's notes (unconditional text, a split by row) are printed."""
    _check_data_files(data, val)  # a device, or a file over the data limits: refused before the folder is made
    out = claim_folder(Path(out_dir).resolve())  # made zfree's own before the split is written into it
    for note in split_data(data, out, val=val).notes:
        print(f"note: {note}", flush=True)
    base = link_model(model, out)
    write_reference(base, out)
    flat = {**TrainConfig().to_flat(), "data_dir": str(out), "base_dir": str(base),
            "c_base_source": "pretrained_source", **(overrides or {})}
    return TrainConfig.from_flat(flat)
