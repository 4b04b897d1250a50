"""Tokenize pairs and collate right-padded batches with explicit y-region masks.

Convention (DESIGN §2): x and y are tokenized *separately* and concatenated, so no token straddles
the boundary. Sequence = [bos] + x + [sep] + y + [eos], where bos/sep are used when the tokenizer
defines them and eos closes the supervised region. The *prefix* is [bos] + x + [sep] (z-free);
the supervised y-region S is y + [eos]. Masks come from lengths, never from token identity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from jaxtyping import Bool, Int

from zfree.data.pairs import Pair


@dataclass(frozen=True)
class EncodedPair:
    id: str
    prefix_ids: tuple[int, ...]  # [bos] + x + [sep]
    target_ids: tuple[int, ...]  # y + [eos]: the supervised region S, |S| = len(target_ids)
    strategy: str | None = None


def encode_pair(tokenizer, pair: Pair, *, add_eos: bool = True) -> EncodedPair:
    """Tokenize one pair. Raises ValueError naming the row if y tokenizes to nothing."""
    x_ids = tokenizer(pair.x, add_special_tokens=False)["input_ids"] if pair.x else []
    y_ids = tokenizer(pair.y, add_special_tokens=False)["input_ids"]
    if not y_ids:
        raise ValueError(f"row {pair.id!r}: y={pair.y!r} tokenizes to nothing")
    prefix = ([tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []) + list(x_ids)
    if getattr(tokenizer, "sep_token_id", None) is not None:
        prefix.append(tokenizer.sep_token_id)
    if not prefix:
        raise ValueError(f"row {pair.id!r}: empty x and the tokenizer has no bos token to give y a context")
    target = list(y_ids) + ([tokenizer.eos_token_id] if add_eos and tokenizer.eos_token_id is not None else [])
    return EncodedPair(pair.id, tuple(prefix), tuple(target), pair.strategy)


@dataclass
class Batch:
    """Right-padded batch. Token t of row b is supervised iff ``target_mask[b, t]``; its log-prob
    is read from the model's output at position t - 1 (the caller shifts; labels are never -100'd)."""

    input_ids: Int[torch.Tensor, "batch seq"]
    attention_mask: Int[torch.Tensor, "batch seq"]  # 1 = real token, 0 = padding
    target_mask: Bool[torch.Tensor, "batch seq"]  # True on the y-region S (y tokens and end token)
    prefix_len: Int[torch.Tensor, "batch"]  # len([bos] + x + [sep]); sep sits at prefix_len - 1
    target_len: Int[torch.Tensor, "batch"]  # |S|
    ids: list[str]
    strategies: list[str | None]

    def to(self, device) -> "Batch":
        return Batch(*(getattr(self, f).to(device) for f in ("input_ids", "attention_mask", "target_mask",
                                                              "prefix_len", "target_len")),
                     self.ids, self.strategies)

    def __len__(self) -> int:
        return self.input_ids.shape[0]


def collate(encoded: Sequence[EncodedPair], pad_id: int = 0) -> Batch:
    """Right-pad a list of encoded pairs into a ``Batch``."""
    lengths = [len(e.prefix_ids) + len(e.target_ids) for e in encoded]
    T = max(lengths)
    B = len(encoded)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    tmask = torch.zeros((B, T), dtype=torch.bool)
    for b, e in enumerate(encoded):
        P, L = len(e.prefix_ids), len(e.target_ids)
        ids[b, : P + L] = torch.tensor(e.prefix_ids + e.target_ids)
        attn[b, : P + L] = 1
        tmask[b, P : P + L] = True
    return Batch(ids, attn, tmask,
                 torch.tensor([len(e.prefix_ids) for e in encoded]),
                 torch.tensor([len(e.target_ids) for e in encoded]),
                 [e.id for e in encoded], [e.strategy for e in encoded])


def pad_id_of(tokenizer) -> int:
    """Padding id: the tokenizer's pad, else its eos, else 0 (masks never read token identity)."""
    for tid in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if tid is not None:
            return int(tid)
    return 0
