"""Your own model and data in one command: ``zfree study --model MODEL --data FILE.jsonl --out DIR``.

Steps (``run_own_study``: the study pipeline ``zfree.experiment.pipeline.run_experiment`` on a JSONL data
source and a pretrained base source, ``zfree.experiment.sources``), each skipped when its output is
already there and matches:

1. the split (``split_data``): one JSONL file is split *by x* (``zfree.data.split.split_pairs``)
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
4. the grid (``zfree.experiment.spec.own_grid``): per weighting, the predicted boundary beta* (``zfree.objective.theory.critical_beta``
   at the median |S| and b of the validation rows; without a Bayes loss the threshold is 1, the
   z-free model's own loss being the excess), then ``beta_factors`` x beta*, each unaided and with
   the hard-EM aid.
5. the runs (papermill, ``zfree.experiment.executor.run_points``) and the report
   (``zfree.experiment.render.render_report``).

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
from zfree.core.paths import SHIPPED_E2E, check_name_length
from zfree.experiment.pipeline import run_experiment
from zfree.experiment.sources import link_model, split_data, write_reference
from zfree.experiment.spec import WEIGHTINGS, BaseSource, BoundaryGrid, DataSource, ExperimentSpec
from zfree.experiment.study import HARD_EM_RECIPE
from zfree.objective.remedies import SWITCH_ON_E2E, SWITCH_ON_RECIPE

#: the hard-EM aid of an own-model study: HARD_EM_RECIPE at K = 4 with a short hard phase (200 steps,
#: a 200-row gate) and the latent embeddings' rate of the prototype (1e-3)
OWN_AID = {**HARD_EM_RECIPE, "n_latent": 4, "hard_em_max_steps": 200, "handover_rows": 200, "lr_new": 1e-3}


def own_preset(name: str, *, weightings: tuple[str, ...] = tuple(WEIGHTINGS),
               beta_factors: tuple[float, ...] = (1 / 3, 3.0), aids: tuple[str, ...] = ("none", "hard_em"),
               train: dict[str, Any] | None = None, aided_train: dict[str, Any] | None = None, val_size: int = 500,
               workers: int = 2, oracles: tuple[str, ...] | None = None, val_rows: int | None = None,
               description: str = "") -> ExperimentSpec:
    """An own-model grid as an ``ExperimentSpec``: a JSONL data source and a pretrained base source
    (both given at run time), beta = factor x beta* per weighting, unaided and/or with ``OWN_AID``
    (and ``aided_train``); ``train``: flat TrainConfig overrides of every run; ``oracles``: the label
    oracles (None: every label the rows carry); ``val_rows``: with a given validation file, that many
    of its rows spread over its x (``zfree.data.split.spread_sample``)."""
    return ExperimentSpec(name, train=dict(train or {}), data=DataSource("jsonl", val_size=val_size, val_rows=val_rows),
                          base=BaseSource("pretrained"), workers=workers, oracles=oracles, description=description,
                          boundary=BoundaryGrid(tuple(weightings), tuple(beta_factors), tuple(aids),
                                                {**OWN_AID, **(aided_train or {})}))


#: the real-model finding: SmolLM2-135M-Instruct (``zfree model fetch smollm2-135m-instruct``,
#: pretrained-source setting) on the shipped E2E data (``BOUND_PRESETS``): the E2E switch-on recipe
#: (``zfree.experiment.study._E2E_AID``: the optimal posterior, K = 4, the hard-EM E-step on the first 3
#: tokens of y) with LoRA rank 8 decoders at distribution weighting, beta*/3 of this model's c_base; its
#: z-free control (the same LoRA, rows, steps) and the `complete` oracle; 300 evaluation rows spread over
#: the val MRs. Sized by measurement (analysis/benchmarks/profile_real_step.py, one thread, batch 8):
#: the control's step 8.1 s, the K = 4 soft step 14.0 s, the hard step 8.2 s (only the chosen value's
#: pass is differentiated); 300 steps of batch 8 put control + oracle on one worker at ~90 min
#: and the aided run on the other at ~62 min (batch 32 would take 4x as long). The hand-over gate is
#: checked every 60 steps on 100 rows (each check scores its rows K times: every 25 steps on 200 rows
#: would cost ~7 min), forced at step 180 (the E2E recipe's 60 %).
E2E_SMOLLM2 = own_preset(
    "e2e-smollm2", weightings=("distribution",), beta_factors=(1 / 3,), aids=("hard_em",),
    train={"steps": 300, "eval_every": 300, "eval_rows": 300, "decode_rows": 3, "batch_size": 8, "lora_rank": 8,
           "warmup_backbone": 20},
    aided_train={**SWITCH_ON_RECIPE, **SWITCH_ON_E2E, "batch_size": 8, "hard_em_max_steps": 180,
                 "handover_check_every": 60, "handover_rows": 100, "restart_dead_every": 60},
    oracles=("complete",), val_rows=300, workers=2,
    description="SmolLM2-135M-Instruct on E2E: the aided recipe with LoRA, its control and the complete oracle")

OWN_PRESETS: dict[str, ExperimentSpec] = {
    # every weighting on both sides of its boundary, unaided and aided (16 runs)
    "own": own_preset("own", train={"steps": 200, "eval_every": 100, "eval_rows": 300, "decode_rows": 3,
                                    "batch_size": 32}, aided_train={"steps": 400, "eval_every": 200}),
    # the acceptance test's: two runs of a few steps
    "own_smoke": own_preset("own_smoke", weightings=("distribution",), beta_factors=(1 / 3,),
                            train={"steps": 4, "eval_every": 2, "eval_rows": 40, "decode_rows": 2, "batch_size": 8,
                                   "warmup_backbone": 2},
                            aided_train={"hard_em_max_steps": 2, "handover_check_every": 2, "handover_rows": 20},
                            val_size=12, workers=1),
    "e2e-smollm2": E2E_SMOLLM2,
}

#: presets bound to a model zfree fetches (``zfree.models.fetch``) and the shipped data: ``zfree study
#: --preset NAME --out DIR`` needs no --model or --data. name -> (model, train file, val file)
BOUND_PRESETS: dict[str, tuple[str, Path, Path]] = {
    "e2e-smollm2": ("smollm2-135m-instruct", SHIPPED_E2E / "train.jsonl", SHIPPED_E2E / "val.jsonl"),
}

#: the keys of an own-model grid YAML (``load_own_spec``): ``own_preset``'s arguments
OWN_SPEC_KEYS = ("name", "weightings", "beta_factors", "aids", "train", "aided_train", "val_size", "workers", "oracles",
                 "val_rows")


def load_own_spec(path: Path | str) -> ExperimentSpec:
    """An own-model grid (``own_preset``) from a YAML file with keys ``OWN_SPEC_KEYS`` (name,
    weightings, beta_factors, aids, train, aided_train, val_size, workers). ConfigError naming the
    file and key otherwise."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"study spec {p} does not exist")
    raw = read_yaml(p)
    raw = {} if raw is None else raw
    valid = set(OWN_SPEC_KEYS)
    if not isinstance(raw, dict) or set(raw) - valid:
        raise ConfigError(f"{p}: a study spec is a mapping with keys among {sorted(valid)}; got "
                          f"{sorted(set(raw) - valid) if isinstance(raw, dict) else type(raw).__name__}")
    kw = {k: _as_tuple(p, k, v) if k in ("weightings", "beta_factors", "aids", "oracles") and v is not None else v
          for k, v in raw.items()}
    name = str(kw.get("name") or p.stem)
    check_name_length(name, f"{p}: name")
    try:
        return own_preset(**{**kw, "name": name})
    except ConfigError as e:  # BoundaryGrid's unknown weighting or aid: name the file
        raise ConfigError(f"{p}: {e}") from None
    except TypeError as e:  # a value of the wrong kind (train: 3)
        raise ConfigError(f"{p}: {e}") from None


def _as_tuple(p: Path, key: str, v: Any) -> tuple:
    """A spec list value as a tuple (a lone scalar as a one-element one); ConfigError for a mapping."""
    if isinstance(v, (str, int, float)) and not isinstance(v, bool):
        return (v,)
    if not isinstance(v, list):
        raise ConfigError(f"{p}: {key} must be a list, got {v!r}")
    return tuple(v)


def _own_spec(preset: str | ExperimentSpec, spec: Path | str | None) -> ExperimentSpec:
    if spec is not None:
        return load_own_spec(spec)
    if isinstance(preset, ExperimentSpec):
        return preset
    if preset in OWN_PRESETS:
        return OWN_PRESETS[preset]
    raise ValueError(f"preset={preset!r} is not one of {sorted(OWN_PRESETS)} (own model and data)")


def run_own_study(model: str, data: Path | str, out_dir: Path | str, *, val: Path | str | None = None,
                  preset: str | ExperimentSpec = "own", spec: Path | str | None = None, workers: int | None = None,
                  progress: bool = True, render: bool = True, finetune: bool = False,
                  finetune_steps: int = 300, estimate: bool = False, budget_s: float | None = None,
                  overrides: dict | None = None) -> Path:
    """Run the own-model study into ``out_dir`` (module docstring): the pipeline on ``preset`` (or
    the YAML ``spec``) with ``data`` (+ ``val``) and ``model`` as its sources; returns report.html
    (or the study folder when ``render`` is False); ``estimate``/``budget_s``: as
    ``run_experiment``. ValueError listing the presets for an unknown one; errors of each step as
    documented there, raised before any run starts. ``overrides``: flat TrainConfig fields set on
    every run (``zfree study --set``)."""
    p = _own_spec(preset, spec)
    if overrides:
        p = dataclasses.replace(p, overrides={**p.overrides, **overrides})
    p = dataclasses.replace(p, data=dataclasses.replace(p.data, kind="jsonl", path=Path(data),
                                                        val=None if val is None else Path(val)),
                            base=BaseSource("pretrained", path=str(model), finetune_steps=finetune_steps if finetune else 0))
    res = run_experiment(p, out_dir, workers=workers, progress=progress, render=render, estimate=estimate,
                         budget_s=budget_s)
    return res.html if render else res.out


def own_train_config(model: str, data: Path | str, out_dir: Path | str, *, val: Path | str | None = None,
                     overrides: dict | None = None) -> TrainConfig:
    """``zfree train --model M --data F --out RUN``: steps 1-3 of the study into ``RUN/`` (split,
    base link, reference), then the ``TrainConfig`` of one CVAE there (``RUN`` is also the run folder);
    the split's notes (unconditional text, a split by row) are printed."""
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for note in split_data(data, out, val=val).notes:
        print(f"note: {note}", flush=True)
    base = link_model(model, out)
    write_reference(base, out)
    flat = {**TrainConfig().to_flat(), "data_dir": str(out), "base_dir": str(base),
            "c_base_source": "pretrained_source", **(overrides or {})}
    return TrainConfig.from_flat(flat)
