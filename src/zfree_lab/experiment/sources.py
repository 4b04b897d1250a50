"""The data and base sources of an experiment made ready in its folder (``prepare_data``,
``prepare_base``), each step skipped when its output is already there and matches.

Data: the shipped benchmark (hash-checked), a synthetic benchmark written into OUT/data, a data
folder used in place, or a user's JSONL file split *by x* (``zfree_lab.run.split.split_pairs``: by row
for unconditional text, whose one x is dropped, and for too few x, with a note) into
OUT/train.jsonl and OUT/val.jsonl (``split_data``; a given val file is used as it is, the x it
shares with train warned with their count).

Base: the shipped base run copied into OUT/base, one trained there (``train_base``), a base run
folder used in place, or a user's model linked as OUT/base/model (``link_model``: a *symlink*,
multi-GB weights are never copied) with the pretrained-source reference of the validation rows
(``write_reference``), optionally fine-tuned on the train split (``finetune_base``: the
entangled-run setting).
"""

from __future__ import annotations

import os
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import snapshot_download

from zfree.config import BaseTrainConfig
from zfree.core.errors import InputError, ModelLoadError
from zfree.core.io import atomic_write_json, read_json, sha256_file, sha256_state_dict
from zfree.core.paths import SHIPPED_BASE, SHIPPED_DATA
from zfree.data.pairs import Pair, load_pairs
from zfree_lab.run.split import (Split, is_unconditional, shared_x_count, split_pairs, spread_sample,
                              unconditional_note, without_x, write_pairs)
from zfree.data.synth import write_benchmark
from zfree.models.loading import check_eos, load_causal_lm, resolve_source
from zfree.reference.reference import Reference, build_reference, load_reference
from zfree.reference.score_cache import tokenizer_sha256
from zfree_lab.run.base_training import train_base, train_text_base
from zfree_lab.experiment.spec import BaseSource, DataSource
from zfree_lab.experiment.study_folders import FINETUNE_CHECKPOINT, FINETUNE_DIR


@dataclass
class Prepared:
    """What the sources gave: the runs' data_dir and base_dir, the reference's setting, and for
    own data the validation rows, the shared-x count, the reference, whether the data is
    unconditional (one x, dropped) and the split's notes (``zfree_lab.run.split.Split``)."""
    data_dir: Path
    base_dir: Path | None = None
    c_base_source: str = "entangled_run"
    val_pairs: list[Pair] | None = None
    shared_x: int = 0
    reference: Reference | None = None
    unconditional: bool = False
    split_notes: tuple[str, ...] = ()


def prepare_data(src: DataSource, out: Path, name: str = "") -> Prepared:
    """The data folder of ``src`` (module docstring); ``fields``: not called (the points name it)."""
    if src.kind == "folder":
        if not (src.path / "val.jsonl").exists():
            raise FileNotFoundError(f"preset {name!r}: {src.path / 'val.jsonl'} does not exist")
        return Prepared(src.path, val_pairs=load_pairs(src.path / "val.jsonl"))
    if src.kind == "jsonl":
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            split = split_data(src.path, out, val=src.val, val_size=src.val_size, val_rows=src.val_rows)
        for w in caught:
            print(f"warning: {w.message}", flush=True)
        return Prepared(out, val_pairs=split.val, shared_x=split.shared_x, unconditional=split.unconditional,
                        split_notes=split.notes)
    if src.kind == "synthetic":
        return Prepared(write_benchmark(src.config, out / "data"))
    meta = read_json(SHIPPED_DATA / "metadata.json")
    for split, sha in meta["sha256"].items():
        if sha256_file(SHIPPED_DATA / f"{split}.jsonl") != sha:
            raise ValueError(f"{SHIPPED_DATA / (split + '.jsonl')}: sha256 does not match metadata.json")
    return Prepared(SHIPPED_DATA)


def prepare_base(src: BaseSource, out: Path, prep: Prepared, retrain: bool = False, progress: bool = True) -> Prepared:
    """``prep`` with the base folder of ``src`` set (module docstring)."""
    if src.kind == "folder":  # a shipped base used in place (small; its reference is hash-checked)
        prep.base_dir = src.path
        return prep
    if src.kind == "pretrained":
        base = link_model(src.path, out)
        prep.reference, prep.c_base_source = write_reference(base, prep.data_dir), "pretrained_source"
        if src.finetune_steps > 0:  # the fine-tuned model is the base and its reference the record
            base, prep.c_base_source = finetune_base(base, prep.data_dir, src.finetune_steps), "entangled_run"
            prep.reference = load_reference(base)
        prep.base_dir = base
        return prep
    prep.base_dir = _own_base(src, out, prep.data_dir, retrain, progress)
    return prep


def _own_base(src: BaseSource, out: Path, data_dir: Path, retrain: bool, progress: bool) -> Path:
    """OUT/base: kept when finished, else trained (``trained`` or ``retrain``) or the shipped copy."""
    base = out / "base"
    if (base / "reference" / "reference.json").exists() and (base / "model").exists():
        return base
    if src.kind == "trained" or retrain:
        if base.exists():
            shutil.rmtree(base)  # an unfinished base run (no reference yet) is rebuilt
        train_base(data_dir, base, src.config or BaseTrainConfig(), threads=1, progress=progress)
        return base
    if not (SHIPPED_BASE / "reference" / "reference.json").exists():
        raise FileNotFoundError(f"the shipped base run {SHIPPED_BASE} has no reference/reference.json; "
                                "run with --retrain-base")
    tmp = out / ".base.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(SHIPPED_BASE, tmp)
    tmp.rename(base)
    return base


def split_data(data: Path | str, out: Path, *, val: Path | str | None = None, val_size: int = 500,
               seed: int = 0, val_rows: int | None = None) -> Split:
    """Write ``out/train.jsonl`` and ``out/val.jsonl``; returns the ``zfree_lab.run.split.Split`` (rows,
    how they were split, whether unconditional, its notes, the shared-x count).

    Without ``val``: ``split_pairs(val_size=min(val_size, rows // 5))`` of ``data`` -- by x (no x on
    both sides); unconditional text (one x: empty, absent or constant) with x dropped, by row (no y
    on both sides); by row with a note when the x are too few. With ``val``: both files as they are
    (``val_rows``: that many rows of ``val``, spread over its x by ``zfree_lab.run.split.spread_sample``,
    seeded: the same rows every time), x dropped from both when all their rows share one x; shared x
    warned (``shared_x_count``). A split already in ``out`` that differs from the one computed now
    raises InputError (nothing is overwritten: use another ``--out``). InputError / ValueError
    naming the file and row for bad rows or data too small for the validation size, InputError for a split of
    fewer than ``MIN_VAL_ROWS`` validation rows."""
    pairs = load_pairs(data)
    if val is None:
        split = split_pairs(pairs, val_size=min(val_size, max(1, len(pairs) // 5)), seed=seed, source=data)
    else:
        val_pairs = load_pairs(val)
        if val_rows:
            val_pairs = spread_sample(val_pairs, val_rows)
        if is_unconditional([*pairs, *val_pairs]):
            note = unconditional_note(pairs, f"all {len(pairs)} rows of {data} and {len(val_pairs)} of {val}")
            split = Split(without_x(pairs), without_x(val_pairs), "given", True,
                          (f"{note}; the val file used as it is",))
        else:
            split = Split(pairs, val_pairs, "given", shared_x=shared_x_count(pairs, val_pairs, val_source=val))
    _check_val_rows(split, data, val, len(pairs))
    for name, rows in (("train", split.train), ("val", split.val)):
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
    return split


#: the fewest validation rows a split may leave: every number of a run and of the report is a mean over them
MIN_VAL_ROWS = 5


def _check_val_rows(split: Split, data, val, n_rows: int) -> None:
    """InputError in one line where ``split`` holds fewer than ``MIN_VAL_ROWS`` validation rows (a 6-row file
    split into 5 + 1 ran a whole study on one validation row), naming the file and what to give instead."""
    if len(split.val) >= MIN_VAL_ROWS:
        return
    if val is not None:
        raise InputError(f"--val {val}: {len(split.val)} rows; a study or run needs at least {MIN_VAL_ROWS} validation rows "
                         "(each number it reports is a mean over them)")
    raise InputError(f"--data {data}: {n_rows} rows leave {len(split.val)} for validation (a fifth); a study or run needs "
                     f"at least {MIN_VAL_ROWS} (each number it reports is a mean over them): give at least "
                     f"{5 * MIN_VAL_ROWS} rows, or a --val file of {MIN_VAL_ROWS} or more")


def prepare_split(data: Path | str, out: Path, *, val: Path | str | None = None, val_size: int = 500,
                  seed: int = 0, val_rows: int | None = None) -> tuple[list[Pair], list[Pair], int]:
    """``split_data`` as ``(train, val, shared_x)``: the rows as written (x dropped on unconditional
    text) and the x shared with a given val file. Errors as ``split_data``."""
    split = split_data(data, out, val=val, val_size=val_size, seed=seed, val_rows=val_rows)
    return split.train, split.val, split.shared_x


def _model_target(model: str) -> Path:
    """The local path ``DIR/base/model`` links to: a transformers folder, a folder with the one
    .gguf file, or the local snapshot of a hub id. Errors as ``resolve_source``."""
    path, gguf, kind = resolve_source(model)
    if kind == "hub":
        offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
        try:
            return Path(snapshot_download(path, local_files_only=offline))
        except Exception as e:  # noqa: BLE001 - any hub failure is the user's model id or network
            raise ModelLoadError(f"model {model}: not a local path and not available from the hub "
                                 f"({type(e).__name__})") from None
    return Path(path).resolve() if gguf is None else (Path(path) / gguf).resolve()


def link_model(model: str, out: Path) -> Path:
    """``out/base`` with ``model`` a symlink to the source model (a .gguf file gets a folder holding a
    link to it) and ``source.json``; returns ``out/base``. The model is loaded once here so that a
    folder without a tokenizer, a bad GGUF path, ... fail before anything is trained. InputError if
    ``out/base/model`` already points elsewhere."""
    target = _model_target(str(model))
    base = out / "base"
    link = base / "model"
    if link.exists() or link.is_symlink():
        rec = read_json(base / "source.json") if (base / "source.json").exists() else {}
        if rec.get("target") != str(target):
            raise InputError(f"{link} exists and points to {rec.get('target', link.resolve())}, not {target}; "
                             "use a new --out")
        return base
    check_eos(load_causal_lm(target, device="cpu", dtype="float32")[1], model)  # refuse a bad model before writing
    base.mkdir(parents=True, exist_ok=True)
    if target.suffix == ".gguf":
        link.mkdir()
        (link / target.name).symlink_to(target)
    else:
        link.symlink_to(target, target_is_directory=True)
    from zfree_lab.run.fetch import source_record  # a folder made by `zfree model fetch` says where it came from

    fetched = source_record(target if target.is_dir() else target.parent)
    atomic_write_json(base / "source.json", {"model": str(model), "target": str(target),
                                             "setting": "pretrained_source", **({"fetched": fetched} if fetched else {})})
    return base


def write_reference(base: Path, data_dir: Path) -> Reference:
    """The pretrained-source reference on ``data_dir/val.jsonl`` in ``base/reference`` (rebuilt when
    the val file changed); returns the ``zfree.reference.reference.Reference``. A stored reference is
    reused only while the linked model is the one it scored (``check_same_model``)."""
    rj = base / "reference" / "reference.json"
    if rj.exists() and read_json(rj).get("data_sha256") == sha256_file(data_dir / "val.jsonl"):
        ref = load_reference(base)
        check_same_model(base, ref.meta, rj)
        return ref
    t0 = time.time()
    # cached as well: every run of the study scores these rows again in the pretrained-source setting
    # (a SmolLM2-135M probe spent 3.5 min re-scoring 502 rows the preparation had just scored)
    # on the runs' device ("auto"): the score cache is keyed by device, so scoring on the CPU of a GPU
    # machine cost 58 s there and every run scored the rows again on CUDA (SmolLM2 on an H200)
    ref = build_reference(base, data_dir, "val", device="auto", cache=None)
    # the source model, not trained on these pairs; scoring_s: its wall seconds (the estimate's scoring rate)
    ref.meta = {**ref.meta, "estimator": "pretrained_source", "scoring_s": time.time() - t0}
    atomic_write_json(rj, ref.meta)
    return ref


def check_same_model(base: Path, meta: dict, stored: Path) -> None:
    """Refuse a study or run folder whose linked model (``base/model``) was replaced since its
    reference scored it: a rerun would skip every finished run and report the old weights' c_base
    (issue 61: the link matched by path only). The model is loaded as the reference loaded it (CPU,
    float32) and its weights' and tokenizer's sha256 compared with ``model_sha256`` and
    ``tokenizer_sha256`` in ``stored`` (reference.json). Refused rather than rerun: the finished
    runs and their report are the record of the old model, and retraining would silently replace
    them; a new ``--out`` studies the new one. InputError in one line naming the model folder and
    both hashes."""
    model, tok = load_causal_lm(base / "model", device="cpu", dtype="float32")
    now = {"weights": ("model_sha256", sha256_state_dict(model.state_dict())),
           "tokenizer": ("tokenizer_sha256", tokenizer_sha256(tok))}
    del model
    for what, (key, sha) in now.items():
        if meta.get(key) and meta[key] != sha:
            raise InputError(f"model {(base / 'model').resolve()} changed since this folder's reference scored it: "
                             f"its {what} sha256 is {sha} now, {meta[key]} in {stored}; the finished runs here were "
                             f"trained on the old one: use a new --out for this model (or put the old one back)")


#: the fine-tuning of ``--finetune-base`` and of a preset's ``base.finetune_steps``
#: (``zfree_lab.run.base_training.train_text_base`` with ``init_from``). Its length is its steps and its early
#: stop on validation rows, never the machine's speed: no wall-clock cap (a 30-minute cap stopped a loaded
#: CPU's SmolLM2 fine-tune after about 60 of its 300 steps, so the entangled regime depended on the load)
FINETUNE = {"lr": 3e-4, "batch_size": 16, "warmup_steps": 20, "eval_every": 50, "max_minutes": None}


def finetune_base(base: Path, data_dir: Path, steps: int = 300) -> Path:
    """The entangled-run setting: fine-tune the linked model on ``data_dir/train.jsonl`` for at most
    ``steps`` steps (``FINETUNE``; the best val c_base kept) into ``data_dir/base_ft/`` (model,
    reference, train_log.json); returns that folder (skipped when its reference exists). A stopped
    fine-tune resumes from its last evaluation (``data_dir/base_ft.checkpoint``, removed once the
    reference is written: ``zfree_lab.run.base_checkpoint``) and ends with the weights an uninterrupted
    one ends with. The model must be a local transformers folder (ModelLoadError for a GGUF file)."""
    ft = data_dir / FINETUNE_DIR
    if (ft / "reference" / "reference.json").exists():
        return ft
    src = (base / "model").resolve()
    if not (src / "config.json").exists():
        raise ModelLoadError(f"--finetune-base needs a transformers folder; {src} is a GGUF source "
                             "(save it with save_pretrained first)")
    shutil.rmtree(ft, ignore_errors=True)  # an unfinished fine-tune's output (no reference yet); its checkpoint stays
    ckpt = data_dir / FINETUNE_CHECKPOINT
    train_text_base(data_dir, ft, BaseTrainConfig(max_steps=steps, **FINETUNE), init_from=src, progress=True,
                    checkpoint_dir=ckpt)
    shutil.rmtree(ckpt, ignore_errors=True)
    return ft
