"""The notes of a study on data without the synthetic benchmark's labels (own data, E2E): what the
structure and task metrics cannot measure, and summary.csv with the per-label columns. Below both
``zfree_lab.experiment.study`` and ``zfree_lab.experiment.own_study`` (which import it)."""

from __future__ import annotations

import json
from pathlib import Path

from zfree.core.errors import InputError
from zfree.core.io import read_json
from zfree.data.labels import LABEL_VALUE_CAP, OTHER, label_keys_of
from zfree.data.pairs import Pair, load_pairs


#: a z-free model whose c_base is at least this share of ln(vocabulary size) predicts y about as well as
#: a uniform guess over its tokens: a random or untrained model, or weights that did not load
NEAR_UNIFORM = 0.9


def near_uniform(c_base: float, model_dir: Path) -> dict | None:
    """``{"c_base", "vocab", "ln_vocab"}`` when the z-free model in ``model_dir`` (its config.json's
    ``vocab_size``, or its ``text_config``'s) scores ``c_base`` (nats per token) at or above ``NEAR_UNIFORM``
    x ln(vocab): no better than a uniform guess, where zfree's question (a warm start from a *strong* z-free
    model) does not arise; None otherwise, or when the vocabulary size is not recorded."""
    import math

    cfg = read_json(model_dir / "config.json") if (model_dir / "config.json").is_file() else {}
    vocab = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
    if not isinstance(vocab, int) or vocab < 2 or not math.isfinite(c_base):
        return None
    return ({"c_base": float(c_base), "vocab": vocab, "ln_vocab": math.log(vocab)}
            if c_base >= NEAR_UNIFORM * math.log(vocab) else None)


def near_uniform_note(rec: dict) -> str:
    """``near_uniform``'s record in words: the note after the split's notes, printed and in the report."""
    return (f"the z-free model scores c_base {rec['c_base']:.3f} nats/token on the validation rows, near a uniform "
            f"guess over its {rec['vocab']:,}-token vocabulary (ln {rec['vocab']:,} = {rec['ln_vocab']:.3f}): it "
            "predicts y no better than chance. Were its weights loaded (a random-initialised or untrained model, a "
            "wrong folder)? zfree asks what a latent adds to a strong z-free model; on this one the runs' numbers "
            "say little about a recipe")


def label_notes(pairs: list[Pair], data_dir: Path, *, oracles: bool = False) -> list[str]:
    """Visible notes for what the structure and task metrics cannot measure on ``pairs``: the
    strategy label and each ``labels`` key absent (or present on only some rows), and task
    correctness without ``data_dir/metadata.json``; a label of more values over ``data_dir/train.jsonl``
    and ``pairs`` than ``LABEL_VALUE_CAP`` is noted as capped for its oracle. ``oracles`` (the study trains a label oracle
    per key every row carries, ``zfree_lab.experiment.controls.oracle_labels``): also a note for each key
    some row of ``data_dir/train.jsonl`` or ``pairs`` lacks, which gets no oracle."""
    notes = []
    train = load_pairs(data_dir / "train.jsonl") if (data_dir / "train.jsonl").exists() else []
    if oracles and train:
        every = set(label_keys_of([*train, *pairs]))
        for k in sorted({k for p in (*train, *pairs) for k in (p.labels or {})} - every):
            on = [sum(k in (p.labels or {}) for p in rows) for rows in (train, pairs)]
            notes.append(f"label '{k}': on {on[0]} of {len(train)} train rows and {on[1]} of {len(pairs)} val rows; "
                         "no label oracle for it (an oracle needs the label on every row)")
    n = len(pairs)
    n_strat = sum(p.strategy is not None for p in pairs)
    if n_strat < n:
        what = ("absent (a row's optional top-level `strategy`: the generating strategy, which the synthetic benchmark "
                "knows and own data rarely has)" if n_strat == 0 else f"on {n_strat} of {n} rows only")
        notes.append(f"label 'strategy': {what}; structure/alignment_nmi, hungarian_accuracy, probe_accuracy, z_control_accuracy and the "
                     "m = 1 confusion from 'strategy' are skipped (NaN)")
    keys = sorted({k for p in pairs for k in (p.labels or {})})
    for k in keys:
        have = sum(k in (p.labels or {}) for p in pairs)
        if have < n:
            notes.append(f"label '{k}': on {have} of {n} val rows; its metrics use those rows only")
    if not keys:
        notes.append("labels: none in the val rows; structure/<metric>/<label> is skipped")
    else:
        notes.append(f"labels {keys}: structure/<metric>/<label> computed (NMI, Hungarian accuracy, probe, "
                     "confusion); z-control per label is skipped (it needs the label of a decoded y)")
    for k in keys:  # the oracle's values are counted over train + val (zfree.data.labels.capped_values)
        values = {str(p.labels[k]) for p in (*train, *pairs) if k in (p.labels or {})}
        if len(values) > LABEL_VALUE_CAP:
            notes.append(f"label '{k}': {len(values)} values on the {'train and ' if train else ''}val rows; its "
                         f"oracle distinguishes the {LABEL_VALUE_CAP - 1} most frequent over train + val and pools "
                         f"the rest as '{OTHER}'")
    meta = read_json(data_dir / "metadata.json") if (data_dir / "metadata.json").exists() else {}
    if not meta.get("parameters", {}).get("strategies"):
        notes.append("task correctness: skipped (no metadata.json with strategies: no notion of a correct y); instead the "
                     "greedy and one sampled y per latent value for a few val x (samples.parquet of each run)")
    return notes


def context_of_y(ref_meta: dict) -> str:
    """What an empty x leaves y to be scored after, from a reference.json's ``scoring`` record (the
    token ids ``zfree.data.batching.special_convention`` chose), e.g. ``"y scored after token id
    50256: the tokenizer's bos, else its eos, standing as the beginning token"``; ``""`` when the
    record names none."""
    sc = ref_meta.get("scoring") or {}
    if sc.get("empty_x_id") is not None:
        return (f"y scored after token id {sc['empty_x_id']}: the tokenizer's bos, else its eos, standing as the "
                "beginning token")
    used = {k: sc[k] for k in ("bos_id", "sep_id") if sc.get(k) is not None}
    if not used:
        return ""
    return f"y scored after token ids {list(used.values())}: the tokenizer's {' and '.join(k[:3] for k in used)}"


def study_notes(study_dir: Path | str) -> dict:
    """``notes.json`` of a study folder ({} when absent), for the report and summary.csv. InputError in
    one line naming the file when it is not a JSON object (torn, hand-edited, not UTF-8): each run of
    the study's command writes it anew (``zfree_lab.experiment.pipeline``)."""
    p = Path(study_dir) / "notes.json"
    if not p.exists():
        return {}
    try:
        obj = json.loads(p.read_text(encoding="utf-8"))
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
        obj = e
    if not isinstance(obj, dict):
        why = f"{type(obj).__name__}: {str(obj).splitlines()[0][:120]}" if isinstance(obj, Exception) else \
            f"a JSON object expected, got {type(obj).__name__}"
        raise InputError(f"{p}: not a study's notes ({why}); rerun the study's command to write it anew, "
                         f"or move it away")
    return obj
