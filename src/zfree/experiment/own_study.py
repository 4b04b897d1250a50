"""Your own model and data in one command: ``zfree study --model MODEL --data FILE.jsonl --out DIR``.

Steps (``run_own_study``), each skipped when its output is already there and matches:

1. the split (``prepare_split``): one JSONL file is split *by x* (``zfree.data.split.split_by_x``)
   into ``DIR/train.jsonl`` and ``DIR/val.jsonl``; a given ``--val`` file is used as it is (the x it
   shares with train are warned with their count). ``DIR`` is then the runs' ``data_dir``.
2. the base folder (``link_model``): ``DIR/base/model`` is a *symlink* to the model (a folder, a
   folder holding the one ``.gguf`` file, or the hub snapshot of a hub id) -- multi-GB weights are
   never copied; ``DIR/base/source.json`` records what was given.
3. the z-free reference, pretrained-source setting (``write_reference``): the validation rows scored
   by the source model, ``DIR/base/reference/`` (reference.json says ``estimator:
   pretrained_source``); the runs recompute it from the same model (cached scores).
4. the grid (``own_grid``): per weighting, the predicted boundary beta* (``zfree.objective.theory.critical_beta``
   at the median |S| and b of the validation rows; without a Bayes loss the threshold is 1, the
   z-free model's own loss being the excess), then ``beta_factors`` x beta*, each unaided and with
   the hard-EM aid.
5. the runs (papermill, ``zfree.experiment.sweeps.run_points``) and the report
   (``zfree.experiment.study.render_report``).

Notes about what cannot be measured (labels absent, no metadata.json) go to ``DIR/notes.json`` and the
report (``label_notes``).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from zfree.data.pairs import Pair, load_pairs
from zfree.core.errors import InputError
from zfree.core.io import atomic_write_json, read_json, sha256_file

#: the hard-EM aid of an own-model study: zfree.experiment.study.HARD_EM_RECIPE at K = 4 with a short hard phase
OWN_AID = {"aid": "hard_em_then_soft", "n_latent": 4, "posterior_features": "mean_first", "hard_em_decoder": "best",
           "handover_margin": 0.15, "restart_dead_every": 100, "hard_em_max_steps": 200, "handover_check_every": 50,
           "handover_rows": 200, "lr_backbone": 1e-4, "lr_new": 1e-3}
WEIGHTINGS = {"plain": {"weighting": "plain"}, "distribution": {"weighting": "distribution"},
              "example": {"weighting": "example", "epsilon": 0.05},
              "token": {"weighting": "token", "token_outer": "distribution", "token_alpha": 0.5}}


@dataclass(frozen=True)
class OwnPreset:
    """An own-model grid: weightings (keys of ``WEIGHTINGS``), beta = factor x beta*, aided and/or unaided."""
    name: str
    weightings: tuple[str, ...] = tuple(WEIGHTINGS)
    beta_factors: tuple[float, ...] = (1 / 3, 3.0)
    aids: tuple[str, ...] = ("none", "hard_em")
    train: dict[str, Any] = field(default_factory=dict)  # flat TrainConfig overrides of every run
    aided_train: dict[str, Any] = field(default_factory=dict)  # and of the aided runs
    val_size: int = 500
    workers: int = 2


OWN_PRESETS: dict[str, OwnPreset] = {
    # every weighting on both sides of its boundary, unaided and aided (16 runs)
    "own": OwnPreset("own", train={"steps": 200, "eval_every": 100, "eval_rows": 300, "decode_rows": 3,
                                   "batch_size": 32}, aided_train={"steps": 400, "eval_every": 200}),
    # the acceptance test's: two runs of a few steps
    "own_smoke": OwnPreset("own_smoke", weightings=("distribution",), beta_factors=(1 / 3,),
                           train={"steps": 4, "eval_every": 2, "eval_rows": 40, "decode_rows": 2, "batch_size": 8,
                                  "warmup_backbone": 2},
                           aided_train={"hard_em_max_steps": 2, "handover_check_every": 2, "handover_rows": 20},
                           val_size=12, workers=1),
}


def load_own_spec(path: Path | str) -> OwnPreset:
    """An ``OwnPreset`` from a YAML file with keys of ``OwnPreset`` (name, weightings, beta_factors,
    aids, train, aided_train, val_size, workers). ConfigError naming the file and key otherwise."""
    import yaml

    from zfree.core.errors import ConfigError

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"study spec {p} does not exist")
    raw = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    valid = set(OwnPreset.__dataclass_fields__)
    if not isinstance(raw, dict) or set(raw) - valid:
        raise ConfigError(f"{p}: a study spec is a mapping with keys among {sorted(valid)}; got "
                          f"{sorted(set(raw) - valid) if isinstance(raw, dict) else type(raw).__name__}")
    bad = sorted(set(raw.get("weightings", [])) - set(WEIGHTINGS))
    if bad:
        raise ConfigError(f"{p}: weightings {bad} are not among {sorted(WEIGHTINGS)}")
    kw = {k: tuple(v) if k in ("weightings", "beta_factors", "aids") else v for k, v in raw.items()}
    return OwnPreset(**{"name": p.stem, **kw})


# ---------------------------------------------------------------------------- 1. the split


def prepare_split(data: Path | str, out: Path, *, val: Path | str | None = None, val_size: int = 500,
                  seed: int = 0) -> tuple[list[Pair], list[Pair], int]:
    """Write ``out/train.jsonl`` and ``out/val.jsonl``; returns ``(train, val, shared_x)``.

    Without ``val``: ``split_by_x(val_size=min(val_size, rows // 5))`` of ``data`` (no x on both
    sides). With ``val``: both files as they are; shared x warned (``shared_x_count``). A split
    already in ``out`` that differs from the one computed now raises InputError (nothing is
    overwritten: use another ``--out``). InputError / ValueError naming the file and row for bad
    rows or data too small for the validation size."""
    from zfree.data.split import shared_x_count, split_by_x, write_pairs

    pairs = load_pairs(data)
    if val is None:
        size = min(val_size, max(1, len(pairs) // 5))
        train, val_pairs = split_by_x(pairs, val_size=size, seed=seed, source=data)
        shared = 0
    else:
        train, val_pairs = pairs, load_pairs(val)
        shared = shared_x_count(train, val_pairs, val_source=val)
    for name, rows in (("train", train), ("val", val_pairs)):
        target = out / f"{name}.jsonl"
        if target.exists():
            tmp = out / f".{name}.check.jsonl"
            write_pairs(rows, tmp)
            same = sha256_file(tmp) == sha256_file(target)
            tmp.unlink()
            if not same:
                raise InputError(f"{target} exists and holds another split than {data}"
                                 f"{'' if val is None else ' + ' + str(val)} gives now; use a new --out")
        else:
            write_pairs(rows, target)
    return train, val_pairs, shared


# ---------------------------------------------------------------------------- 2. the model


def _model_target(model: str) -> Path:
    """The local path ``DIR/base/model`` links to: a transformers folder, a folder with the one
    .gguf file, or the local snapshot of a hub id. Errors as ``resolve_source``."""
    from zfree.models.loading import resolve_source

    path, gguf, kind = resolve_source(model)
    if kind == "hub":
        import os

        from huggingface_hub import snapshot_download

        offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
        try:
            return Path(snapshot_download(path, local_files_only=offline))
        except Exception as e:  # noqa: BLE001 - any hub failure is the user's model id or network
            from zfree.core.errors import ModelLoadError

            raise ModelLoadError(f"model {model}: not a local path and not available from the hub "
                                 f"({type(e).__name__})") from None
    return Path(path).resolve() if gguf is None else (Path(path) / gguf).resolve()


def link_model(model: str, out: Path) -> Path:
    """``out/base`` with ``model`` a symlink to the source model (a .gguf file gets a folder holding a
    link to it) and ``source.json``; returns ``out/base``. The model is loaded once here so that a
    folder without a tokenizer, a bad GGUF path, ... fail before anything is trained. InputError if
    ``out/base/model`` already points elsewhere."""
    from zfree.models.loading import load_causal_lm

    target = _model_target(str(model))
    base = out / "base"
    link = base / "model"
    if link.exists() or link.is_symlink():
        rec = read_json(base / "source.json") if (base / "source.json").exists() else {}
        if rec.get("target") != str(target):
            raise InputError(f"{link} exists and points to {rec.get('target', link.resolve())}, not {target}; "
                             "use a new --out")
        return base
    load_causal_lm(target, device="cpu", dtype="float32")  # refuse a bad model before writing
    base.mkdir(parents=True, exist_ok=True)
    if target.suffix == ".gguf":
        link.mkdir()
        (link / target.name).symlink_to(target)
    else:
        link.symlink_to(target, target_is_directory=True)
    atomic_write_json(base / "source.json", {"model": str(model), "target": str(target),
                                             "setting": "pretrained_source"})
    return base


# ---------------------------------------------------------------------------- 3. the reference


def write_reference(base: Path, data_dir: Path):
    """The pretrained-source reference on ``data_dir/val.jsonl`` in ``base/reference`` (rebuilt when
    the val file changed); returns the ``zfree.reference.reference.Reference``."""
    from zfree.core.io import atomic_write_json as _w
    from zfree.reference.reference import build_reference, load_reference

    rj = base / "reference" / "reference.json"
    if rj.exists() and read_json(rj).get("data_sha256") == sha256_file(data_dir / "val.jsonl"):
        return load_reference(base)
    ref = build_reference(base, data_dir, "val", device="cpu")
    ref.meta = {**ref.meta, "estimator": "pretrained_source"}  # the source model, not trained on these pairs
    _w(rj, ref.meta)
    return ref


#: the fine-tuning of ``--finetune-base`` (``zfree.train.base_training.train_text_base`` with ``init_from``)
FINETUNE = {"lr": 3e-4, "batch_size": 16, "warmup_steps": 20, "eval_every": 50, "max_minutes": 30.0}


def finetune_base(base: Path, data_dir: Path, steps: int = 300) -> Path:
    """The entangled-run setting: fine-tune the linked model on ``data_dir/train.jsonl`` for at most
    ``steps`` steps (``FINETUNE``; the best val c_base kept) into ``data_dir/base_ft/`` (model,
    reference, train_log.json); returns that folder (skipped when its reference exists). The
    model must be a local transformers folder (ModelLoadError for a GGUF file)."""
    from zfree.train.base_training import train_text_base
    from zfree.config import BaseTrainConfig
    from zfree.core.errors import ModelLoadError

    ft = data_dir / "base_ft"
    if (ft / "reference" / "reference.json").exists():
        return ft
    src = (base / "model").resolve()
    if not (src / "config.json").exists():
        raise ModelLoadError(f"--finetune-base needs a transformers folder; {src} is a GGUF source "
                             "(save it with save_pretrained first)")
    import shutil

    shutil.rmtree(ft, ignore_errors=True)  # an unfinished fine-tune (no reference yet) is redone
    train_text_base(data_dir, ft, BaseTrainConfig(max_steps=steps, **FINETUNE), init_from=src, progress=True)
    return ft


# ---------------------------------------------------------------------------- 4. the grid


def predicted_boundary(weighting: str, ref, epsilon: float = 0.05) -> float:
    """beta* of ``weighting`` (token: its outer weighting, distribution) at the validation rows'
    |S| and b: the median over rows of ``zfree.objective.theory.critical_beta`` (threshold 1; no Bayes loss)."""
    from zfree.objective.theory import critical_beta

    pe = ref.per_example
    if "valid" in pe.columns:
        pe = pe[pe["valid"].to_numpy(dtype=bool)]
    w = "distribution" if weighting == "token" else weighting
    beta = critical_beta(w, pe["n_tokens"].to_numpy(float), b=pe["b"].to_numpy(float), c_base=ref.c_base,
                         epsilon=epsilon)
    return float(np.median(beta))


def own_grid(preset: OwnPreset, ref) -> tuple[list[dict], list[dict]]:
    """The variants (flat field dicts) of ``preset`` and a table of the predictions used:
    one row per weighting with beta* and the betas run."""
    variants, table = [], []
    for name in preset.weightings:
        wcfg = WEIGHTINGS[name]
        b_star = predicted_boundary(name, ref, wcfg.get("epsilon", 0.05))
        betas = [float(f"{f * b_star:.4g}") for f in preset.beta_factors]
        table.append({"weighting": name, "beta_star": b_star, "betas": betas})
        for beta in betas:
            for aid in preset.aids:
                extra = {**OWN_AID, **preset.aided_train} if aid == "hard_em" else {}
                variants.append({**wcfg, "beta": beta, **extra})
    return variants, table


# ---------------------------------------------------------------------------- 5. notes, runs, report

from zfree.experiment.study_notes import label_notes, study_notes, write_summary_csv  # noqa: E402,F401 - re-exported


def run_own_study(model: str, data: Path | str, out_dir: Path | str, *, val: Path | str | None = None,
                  preset: str | OwnPreset = "own", spec: Path | str | None = None, workers: int | None = None,
                  progress: bool = True, render: bool = True, finetune: bool = False,
                  finetune_steps: int = 300) -> Path:
    """Run the own-model study into ``out_dir`` (module docstring); returns report.html (or the study
    folder when ``render`` is False). ValueError listing the presets for an unknown one; errors of
    each step as documented there, raised before any run starts."""
    from zfree.config import TrainConfig
    from zfree.experiment.results import collect_runs, summary_table
    from zfree.experiment.study import render_report
    from zfree.experiment.sweeps import expand_grid, run_points
    from zfree.core.io import atomic_write_text

    if spec is not None:
        p = load_own_spec(spec)
    elif isinstance(preset, OwnPreset):
        p = preset
    elif preset in OWN_PRESETS:
        p = OWN_PRESETS[preset]
    else:
        raise ValueError(f"preset={preset!r} is not one of {sorted(OWN_PRESETS)} (own model and data)")
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, val_pairs, shared = prepare_split(data, out, val=val, val_size=p.val_size)
    for w in caught:
        print(f"warning: {w.message}", flush=True)
    base = link_model(model, out)
    ref = write_reference(base, out)
    source = "pretrained_source"
    if finetune:  # the entangled-run setting: the fine-tuned model is the base and its reference the record
        from zfree.reference.reference import load_reference

        base, source = finetune_base(base, out, finetune_steps), "entangled_run"
        ref = load_reference(base)
    variants, table = own_grid(p, ref)
    notes = label_notes(val_pairs, out)
    if shared:
        notes.insert(0, f"val file {val}: {shared} distinct x also in the train data")
    atomic_write_json(out / "notes.json", {"notes": notes, "predicted_boundaries": table, "c_base": ref.c_base,
                                           "model": str(model), "data": str(data), "val": None if val is None
                                           else str(val), "preset": p.name, "setting": source,
                                           "base_dir": str(base)})
    for n in notes:
        print(f"note: {n}", flush=True)
    flat = {**TrainConfig().to_flat(), **p.train, "data_dir": str(out), "base_dir": str(base),
            "c_base_source": source}
    points = expand_grid(flat, {"variant": variants})
    statuses = run_points(points, out / "runs", workers=workers or p.workers, progress=progress)
    tab = write_summary_csv(out, notes)
    for s in statuses:
        if s["status"] == "failed":
            print(f"  FAILED {s['run_id']}: {s['error']}  (see {out / 'runs' / s['run_id'] / 'error.json'})")
    if not render:
        return out
    html = render_report(out, progress=progress)
    if progress:
        print(f"study on {model}: {len(tab)} runs in {out} ({time.time() - t0:.0f} s); report: {html}")
    return html


def own_train_config(model: str, data: Path | str, out_dir: Path | str, *, val: Path | str | None = None,
                     overrides: dict | None = None):
    """``zfree train --model M --data F --out RUN``: steps 1-3 of the study into ``RUN/`` (split,
    base link, reference), then the ``TrainConfig`` of one CVAE there (``RUN`` is also the run folder)."""
    from zfree.config import TrainConfig

    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    prepare_split(data, out, val=val)
    base = link_model(model, out)
    write_reference(base, out)
    flat = {**TrainConfig().to_flat(), "data_dir": str(out), "base_dir": str(base),
            "c_base_source": "pretrained_source", **(overrides or {})}
    return TrainConfig.from_flat(flat)
