"""What a CVAE run reads (``RunData``): the encoded train and evaluation rows (the seeded spread
sample, ``zfree_lab.run.split.spread_sample``), the gate rows of the aids that read them (the gate split,
``zfree_lab.run.split.gate_sample``: never an evaluation row), the reference's b and b_t, and the
evaluation arguments; plus the per-batch references of a training step. Split from ``zfree_lab.run.training``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from zfree.config import LatentSource, TrainConfig
from zfree.config.aid import GATE_AIDS
from zfree.core.io import read_json
from zfree.data.batching import EncodedPair, encode_pairs, pad_id_of
from zfree.data.pairs import Pair, load_pairs
from zfree_lab.run.split import gate_sample, ids_sha256, spread_sample
from zfree.models.precision import to_device
from zfree.objective.losses import base_token_matrix
from zfree.models.routes import initial_soft_token
from zfree.reference.prefix import PREFIX_REFERENCE_DIR, prefix_reference
from zfree.reference.reference import Reference, resolve_reference
from zfree.train.given import given_index
from zfree.reference.scoring import context_length, score_pairs


@dataclass
class RunData:
    """What the loop reads: the encoded rows, the reference's b and b_t, and the evaluation arguments. Every
    c_base and b here (the weightings' 1/c_base, 1/(b + eps), token shares, and rho's) is of the run's
    reference: under ``injection: prefix`` the base model reading the route's initial soft token
    (``zfree.reference.prefix``), else the z-free base model on (x, y)."""

    tokenizer: object
    pad_id: int
    c_base: float
    train: list[EncodedPair]
    val: list[EncodedPair]
    val_pairs: list[Pair]
    val_b: np.ndarray
    train_ref: Reference | None  # b (and b_t) on training rows when the weighting needs them
    eval_kw: dict
    reference_file: Path | None = None  # a stored (entangled-run or prefix) reference, checked at step 0
    reference: Reference | None = None  # the validation rows' reference (its metadata: config.json's _reference)
    # the gate split (aids in GATE_AIDS only; else empty): its encoded rows, their pairs, their base
    # surprisal b (nats per token) and where they come from ("val" or "train"; None: no gate)
    gate: list[EncodedPair] = field(default_factory=list)
    gate_pairs: list[Pair] = field(default_factory=list)
    gate_b: np.ndarray | None = None
    gate_split: str | None = None
    # how the run records its rows (config.json): ``_rows_used`` (the validation rows evaluated and
    # decoded, as used: ``eval_rows: 1e9`` on 12 rows uses 12) and ``_gate_rows`` (split, rows, the
    # ids' sha256 in order, ``zfree_lab.run.split.ids_sha256``, and the ids; {} without gate rows)
    rows_used: dict = field(default_factory=dict)
    gate_record: dict = field(default_factory=dict)
    given: dict | None = None  # a given z's value per row id (``zfree.train.given``); None: the posterior's z


def setup_data(cfg: TrainConfig, backbone, tok, data_dir: Path, base_dir: Path, ref_source: str,
               out: Path | None = None) -> RunData:
    """Read, sample and encode a run's rows: ``train.jsonl`` in full, ``val.jsonl`` as the seeded
    spread sample of ``eval_rows`` rows (all of them when 0 or more than there are), under an aid of
    ``GATE_AIDS`` the gate rows (``zfree_lab.run.split.gate_sample``: never an evaluation row); all
    encoded with x cut from the left to ``backbone``'s context length (as the reference scorer does)
    and y never cut; the z-free reference of the validation rows by ``ref_source``
    (``zfree.reference.reference.resolve_reference``: the base run's in ``base_dir``, or scored now by
    ``backbone``, the base model as loaded: call before any training step) and, when the weighting
    needs b on training rows, of the training rows (scored once and cached); the validation rows' b
    (nats per token; per-token b_t too under the token weighting), the gate rows' from the reference
    of their split, else scored now; the evaluation arguments. Under ``injection: prefix`` every one of these
    references (validation, training, gate rows) is instead the base model reading the route's initial soft
    token, whatever ``ref_source`` says (``zfree.reference.prefix``): scored once, stored in ``out``'s
    ``PREFIX_REFERENCE_DIR/<split>/`` and read back on resume, its validation reference checked at step 0.
    Raises FileNotFoundError or InputError
    from ``load_pairs``, ValueError for a y that does not fit the context, from ``gate_sample`` or from
    the reference, KeyError when a reference lacks a row."""
    train_pairs = load_pairs(data_dir / "train.jsonl")
    all_val = load_pairs(data_dir / "val.jsonl")
    given = (given_index(cfg, {"train": train_pairs, "val": all_val}, data_dir)  # the control's 0, or a label's
             if LatentSource.parse(cfg.model.latent_source).given else None)
    if cfg.optim.eval_rows > len(all_val):  # (0 = all: never more than there are)
        print(f"note: eval_rows={cfg.optim.eval_rows} but {data_dir / 'val.jsonl'} has {len(all_val)} rows: "
              f"all {len(all_val)} evaluated (config.json records _rows_used)", flush=True)
    val_pairs = spread_sample(all_val, cfg.optim.eval_rows)  # seeded, spread over all x, the same for every run
    gate = gate_sample(all_val, val_pairs, train_pairs, cfg.aid.handover_rows) if cfg.aid.aid in GATE_AIDS else None
    gate_ids = [p.id for p in gate.pairs] if gate is not None else []
    gate_record = {} if gate is None else {"split": gate.split, "rows": len(gate_ids),
                                           "ids_sha256": ids_sha256(gate_ids), "ids": gate_ids}
    if gate is not None and gate.note:
        print(gate.note, flush=True)
    max_len = context_length(backbone)
    rows = {"train": train_pairs, "val": val_pairs, **({f"gate ({gate.split})": gate.pairs} if gate else {})}
    encoded = {}
    for split, pairs in rows.items():  # two batched tokenizer calls each (one a pair: 4x slower)
        encoded[split] = enc = encode_pairs(tok, pairs, max_length=max_len)
        if cut := sum(e.x_tokens_cut > 0 for e in enc):
            print(f"note: {cut} {split} rows had x cut from the left to fit the context length {max_len} "
                  "(as in the z-free reference)", flush=True)
    train, val, *gate_rows = encoded.values()
    ref, train_ref, prefix = _references(cfg, backbone, tok, data_dir, base_dir, ref_source, out)
    val_ids = [p.id for p in val_pairs]
    val_b = np.array(ref.b_of(val_ids))
    val_tok = dict(zip(val_ids, ref.surprisal_of(val_ids))) if cfg.objective.weighting == "token" else None
    gate_b = None if gate is None else _gate_b(gate, gate_ids, ref, train_ref, prefix, backbone, tok)
    meta = read_json(data_dir / "metadata.json") if (data_dir / "metadata.json").exists() else {}
    pad = pad_id_of(tok)
    eval_kw = dict(b=val_b, c_base=ref.c_base, objective=cfg.objective, pad_id=pad, tokenizer=tok,
                   strategies=meta.get("parameters", {}).get("strategies"), decode_rows=cfg.optim.decode_rows,
                   seed=cfg.optim.seed, base_token_nll=val_tok)
    return RunData(tok, pad, ref.c_base, train, val, val_pairs, val_b, train_ref, eval_kw, ref.stored, reference=ref,
                   gate=gate_rows[0] if gate else [], gate_pairs=gate.pairs if gate else [], gate_b=gate_b,
                   gate_split=gate.split if gate else None, gate_record=gate_record, given=given,
                   rows_used={"eval_rows": len(val_pairs), "decode_rows": min(cfg.optim.decode_rows, len(val_pairs))})


def _references(cfg: TrainConfig, backbone, tok, data_dir: Path, base_dir: Path, ref_source: str,
                out: Path | None) -> tuple[Reference, Reference | None, Callable[..., Reference] | None]:
    """(the validation rows' reference, the training rows' where the weighting needs b, else None, and under
    ``injection: prefix`` the function scoring or reading a prefix reference of a split's rows, else None):
    ``setup_data``'s references (its docstring). ValueError for a prefix run without ``out``."""
    if cfg.model.injection != "prefix":
        ref = resolve_reference(ref_source, base_dir, data_dir, "val", model=backbone, tokenizer=tok)
        train_ref = (resolve_reference("pretrained_source", base_dir, data_dir, "train", model=backbone, tokenizer=tok)
                     if cfg.objective.needs_example_b else None)  # b (and b_t) on training rows, scored once and cached
        return ref, train_ref, None
    if out is None:
        raise ValueError("injection='prefix': setup_data needs the run folder (out) to store its reference")
    soft = initial_soft_token(backbone)  # every b read through the route's initial soft token

    def prefix(split: str, pairs: list[Pair] | None = None, folder: str | None = None) -> Reference:
        """The prefix reference of ``split``'s rows (``pairs``: some of them, stored as ``folder``)."""
        return prefix_reference(backbone, tok, data_dir / f"{split}.jsonl", soft,
                                out / PREFIX_REFERENCE_DIR / (folder or split), pairs=pairs, split=folder or split)
    return prefix("val"), (prefix("train") if cfg.objective.needs_example_b else None), prefix


def _gate_b(gate, gate_ids: list[str], ref: Reference, train_ref: Reference | None,
            prefix: Callable[..., Reference] | None, backbone, tok) -> np.ndarray:
    """The gate rows' b (nats per token): from their split's reference where the run has it, else the prefix
    reference of exactly those rows (stored as ``gate``) under ``injection: prefix``, else scored now."""
    if (gate_ref := ref if gate.split == "val" else train_ref) is not None:
        return np.array(gate_ref.b_of(gate_ids))
    if prefix is not None:
        return np.array(prefix(gate.split, gate.pairs, "gate").b_of(gate_ids))
    scored = score_pairs(backbone, tok, gate.pairs).per_example  # (cached as it caches)
    return np.array(scored.set_index("id").loc[gate_ids, "b"], dtype=float)


def batch_references(data: RunData, batch, weighting: str, device: torch.device, dtype: torch.dtype = torch.float32
                      ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """b (batch,) and, under token weighting, the base-token matrix (batch, seq) of a training
    batch, on ``device``, from the run's training-row reference (``RunData.train_ref``: a prefix run's is
    read through its soft token). ``batch`` is the host (CPU) batch: both are built on the host and copied
    once, so no device value is read back (``base_token_matrix`` reads prefix_len per row). ``dtype``:
    the model's loss dtype (``zfree.models.precision.acc_dtype``)."""
    if data.train_ref is None:
        return None, None
    b = torch.as_tensor(data.train_ref.b_of(batch.ids), dtype=dtype)
    if weighting != "token":
        return to_device(b, device), None
    tok = base_token_matrix(batch.target_mask, batch.prefix_len, data.train_ref.surprisal_of(batch.ids), dtype=dtype)
    return to_device(b, device), to_device(tok, device)


