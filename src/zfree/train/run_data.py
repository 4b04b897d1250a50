"""What a CVAE run reads (``RunData``): the encoded train and evaluation rows (the seeded spread
sample, ``zfree.data.split.spread_sample``), the gate rows of the aids that read them (the gate split,
``zfree.data.split.gate_sample``: never an evaluation row), the reference's b and b_t, and the
evaluation arguments; plus the per-batch references of a training step. Split from ``zfree.train.training``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from zfree.config import TrainConfig
from zfree.config.aid import GATE_AIDS
from zfree.core.io import read_json
from zfree.data.batching import EncodedPair, encode_pairs, pad_id_of
from zfree.data.pairs import Pair, load_pairs
from zfree.data.split import GateRows, gate_sample, ids_sha256, spread_sample
from zfree.models.precision import to_device
from zfree.objective.losses import base_token_matrix
from zfree.reference.reference import Reference
from zfree.reference.scoring import context_length, score_pairs


@dataclass
class RunData:
    """What the loop reads: the encoded rows, the reference's b and b_t, and the evaluation arguments."""

    tokenizer: object
    pad_id: int
    c_base: float
    train: list[EncodedPair]
    val: list[EncodedPair]
    val_pairs: list[Pair]
    val_b: np.ndarray
    train_ref: Reference | None  # b (and b_t) on training rows when the weighting needs them
    eval_kw: dict
    reference_file: Path | None = None  # a stored (entangled-run) reference, checked at step 0
    # the gate split (aids in GATE_AIDS only; else empty): its encoded rows, their pairs, their base
    # surprisal b (nats per token) and where they come from ("val" or "train"; None: no gate)
    gate: list[EncodedPair] = field(default_factory=list)
    gate_pairs: list[Pair] = field(default_factory=list)
    gate_b: np.ndarray | None = None
    gate_split: str | None = None


def _encode(tok, pairs: list[Pair], max_len: int, split: str) -> list[EncodedPair]:
    """x cut from the left to the context length (as the reference scorer does), y never cut:
    ValueError names a row whose y does not fit."""
    enc = encode_pairs(tok, pairs, max_length=max_len)  # two batched tokenizer calls (one a pair: 4x slower)
    cut = sum(e.x_tokens_cut > 0 for e in enc)
    if cut:
        print(f"note: {cut} {split} rows had x cut from the left to fit the context length {max_len} "
              "(as in the z-free reference)", flush=True)
    return enc


def setup_data(cfg: TrainConfig, backbone, tok, ref: Reference, train_ref: Reference | None,
                data_dir: Path) -> RunData:
    """Read, sample and encode a run's rows: ``train.jsonl`` in full, ``val.jsonl`` as the seeded
    spread sample of ``eval_rows`` rows (all of them when 0 or more than there are), both encoded
    with x cut from the left to ``backbone``'s context length; the validation rows' b (nats per
    token; per-token b_t too under the token weighting) from ``ref`` and the evaluation arguments;
    under an aid of ``GATE_AIDS``, the gate rows and their b (``gate_rows``).
    Raises FileNotFoundError or InputError from ``load_pairs``, ValueError for a y that does not fit
    the context or from ``gate_sample``, KeyError when ``ref`` lacks a validation row."""
    train_pairs = load_pairs(data_dir / "train.jsonl")
    all_val = val_pairs = load_pairs(data_dir / "val.jsonl")
    if cfg.optim.eval_rows > len(val_pairs):  # (0 = all: never more than there are)
        print(f"note: eval_rows={cfg.optim.eval_rows} but {data_dir / 'val.jsonl'} has {len(val_pairs)} rows: "
              f"all {len(val_pairs)} evaluated (config.json records _rows_used)", flush=True)
    val_pairs = spread_sample(val_pairs, cfg.optim.eval_rows)  # seeded, spread over all x, the same for every run
    max_len = context_length(backbone)
    train, val = _encode(tok, train_pairs, max_len, "train"), _encode(tok, val_pairs, max_len, "val")
    val_ids = [p.id for p in val_pairs]
    val_b = np.array(ref.b_of(val_ids))
    val_tok = dict(zip(val_ids, ref.surprisal_of(val_ids))) if cfg.objective.weighting == "token" else None
    meta = read_json(data_dir / "metadata.json") if (data_dir / "metadata.json").exists() else {}
    pad = pad_id_of(tok)
    eval_kw = dict(b=val_b, c_base=ref.c_base, objective=cfg.objective, pad_id=pad, tokenizer=tok,
                   strategies=meta.get("parameters", {}).get("strategies"), decode_rows=cfg.optim.decode_rows,
                   seed=cfg.optim.seed, base_token_nll=val_tok)
    data = RunData(tok, pad, ref.c_base, train, val, val_pairs, val_b, train_ref, eval_kw, ref.stored)
    if cfg.aid.aid in GATE_AIDS:
        gate = gate_sample(all_val, val_pairs, train_pairs, cfg.aid.handover_rows)
        if gate.note:
            print(gate.note, flush=True)
        data.gate_pairs, data.gate_split = gate.pairs, gate.split
        data.gate = _encode(tok, gate.pairs, max_len, f"gate ({gate.split})")
        data.gate_b = gate_b(gate, ref, train_ref, backbone, tok)
    return data


def gate_b(gate: GateRows, ref: Reference, train_ref: Reference | None, backbone, tok) -> np.ndarray:
    """b of each gate row (nats per token, in ``gate.pairs`` order): from the validation reference
    ``ref`` for validation rows; for training rows from ``train_ref`` when the run has one, else
    scored now by ``backbone`` (the base model: call before any training step) with
    ``zfree.reference.scoring.score_pairs`` (cached as it caches). KeyError when a reference lacks a row."""
    ids = [p.id for p in gate.pairs]
    if gate.split == "val":
        return np.array(ref.b_of(ids))
    if train_ref is not None:
        return np.array(train_ref.b_of(ids))
    scored = score_pairs(backbone, tok, gate.pairs).per_example
    return np.array(scored.set_index("id").loc[ids, "b"], dtype=float)


def gate_record(data: RunData, with_ids: bool) -> dict:
    """The gate split as a run records it: split ("val"/"train"), rows, sha256 of the ids in order
    (``ids_sha256``) and, ``with_ids``, the ids themselves (config.json's ``_gate_rows``; summary.json
    takes the rest as ``aid/gate_*``), so a reader can check them against per_example.parquet's
    evaluation ids. {} when the run draws no gate rows."""
    if data.gate_split is None:
        return {}
    ids = [p.id for p in data.gate_pairs]
    return {"split": data.gate_split, "rows": len(ids), "ids_sha256": ids_sha256(ids),
            **({"ids": ids} if with_ids else {})}


def rows_used(cfg: TrainConfig, data: RunData) -> dict[str, int]:
    """The validation rows an evaluation uses, as used (``eval_rows``/``decode_rows`` as given may
    exceed the data: ``eval_rows: 1e9`` on 12 rows uses 12); config.json's ``_rows_used``."""
    n = len(data.val_pairs)
    return {"eval_rows": n, "decode_rows": min(cfg.optim.decode_rows, n)}


def batch_references(data: RunData, batch, weighting: str, device: torch.device, dtype: torch.dtype = torch.float32
                      ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """b (batch,) and, under token weighting, the base-token matrix (batch, seq) of a training
    batch, on ``device``. ``batch`` is the host (CPU) batch: both are built on the host and copied
    once, so no device value is read back (``base_token_matrix`` reads prefix_len per row). ``dtype``:
    the model's loss dtype (``zfree.models.precision.acc_dtype``)."""
    if data.train_ref is None:
        return None, None
    b = torch.as_tensor(data.train_ref.b_of(batch.ids), dtype=dtype)
    if weighting != "token":
        return to_device(b, device), None
    tok = base_token_matrix(batch.target_mask, batch.prefix_len, data.train_ref.surprisal_of(batch.ids), dtype=dtype)
    return to_device(b, device), to_device(tok, device)


