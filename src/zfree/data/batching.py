"""Tokenize pairs and collate right-padded batches with explicit y-region masks.

Convention (docs/concepts/problem.md#models, tokenisation): x and y are tokenized *separately*
(``add_special_tokens=False``) and concatenated, so no token straddles the boundary; nothing is added to
the vocabulary. Sequence = [bos] + x + [sep] + y + [eos]:

- **bos** follows the tokenizer's own convention and appears exactly once: ``bos="auto"`` (the
  default) prepends it iff the tokenizer itself does (``add_special_tokens=True`` puts its bos
  token in front, e.g. Llama, Gemma, zfree's word-level tokenizer), the convention of
  lm-evaluation-harness and minicons. A tokenizer that defines a bos token but does not add it
  (GPT-2's ``<|endoftext|>``, SmolLM2's ``<|im_start|>``) gets none. ``"always"`` / ``"never"``
  override. If x's own tokens already start with bos it is not added again.
- **sep** is appended after x when the tokenizer defines a sep token (``sep="auto"``).
- **eos** closes the supervised region when ``add_eos`` and the tokenizer has an eos token.

x and y are data, encoded as text: a special token's text inside them (a literal "<|endoftext|>"
or "<eos>") is encoded as the characters it is (``split_special_tokens=True``), never as that
token -- else an "<|endoftext|>" in y would end S mid-sequence in the model's eyes (issue 61). The
documented opt-in ``special_text="tokens"`` (``encode_pairs``, ``zfree.reference.scoring.ScoringPolicy``)
parses it as the token, for data written in a chat template on purpose.

y is tokenized as given, as a text of its own. The x/y seam: whitespace at y's start is the
caller's choice and is kept: byte-level BPE (GPT-2, Llama-3, SmolLM2) encodes " mat." as "Ġmat"
"." — the same tokens a joint encoding of "... the mat." gives, so x="The cat sat on the",
y=" mat." scores exactly what a joint encoding does — while "mat." without the space is another
token sequence. SentencePiece (Llama-2, Gemma) prefixes every separately encoded text with its
word-start marker, so " mat." or "mat." alone may cost an extra "▁" token that a joint encoding
does not have (tests/test_scoring.py states both cases on trained tokenizers). lm-evaluation-
harness instead encodes x + y jointly and splits at len(encode(x)); the two agree whenever the
joint encoding does not merge across the seam (byte-level BPE with y starting with a space).

The *prefix* is [bos] + x + [sep] (z-free context); the supervised y-region S is y + [eos], so
|S| = len(target_ids) and the first y token is always scored: the prefix is never empty. An
empty x (unconditional text, ``zfree_lab.run.split.is_unconditional``) where neither bos nor sep is
used gets, under ``bos="auto"``, the tokenizer's bos token -- else its eos token -- as the one
token before y (``Convention.empty_x_id``): GPT-2 practice, which scores unconditional text after
``<|endoftext|>``; so y is scored by p(y) after the beginning token. Without either token (or under
``bos="never"``) an empty x is an error naming the row. If a pair is longer than
``max_length``, x is cut from the left (bos and sep are kept) and the cut is reported in
``x_tokens_cut``; y is never cut, a y that does not fit is an error naming the row.
Masks come from lengths, never from token identity (a pad id equal to the eos id is harmless).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np
import torch
from jaxtyping import Bool, Int

from zfree.data.pairs import Pair

BosPolicy = Literal["auto", "always", "never"]
SepPolicy = Literal["auto", "never"]
#: how special-token text inside x or y is encoded: "text" (the default) as its characters, "tokens" as the token
SpecialText = Literal["text", "tokens"]
SPECIAL_TEXT = ("text", "tokens")


@dataclass(frozen=True)
class EncodedPair:
    """One pair as token ids (``encode_pair``; the convention in the module docstring): the z-free
    prefix [bos] + x + [sep] and the supervised region S = y + [eos], each a tuple of token ids;
    ``collate`` right-pads rows into a ``Batch``."""

    id: str
    prefix_ids: tuple[int, ...]  # [bos] + x + [sep]
    target_ids: tuple[int, ...]  # y + [eos]: the supervised region S, |S| = len(target_ids)
    strategy: str | None = None
    x_tokens_cut: int = 0  # x tokens dropped from the left to fit max_length
    # the y-region as the decoder reads it when that differs from what it predicts (word dropout:
    # zfree.train.word_dropout); None = target_ids. Same length as target_ids
    y_input_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Convention:
    """Special-token ids an encoding uses (None = not used). ``empty_x_id``: the token put before y
    when x is empty and neither bos nor sep is used (the tokenizer's bos, else its eos; module docstring)."""

    bos_id: int | None
    sep_id: int | None
    eos_id: int | None
    empty_x_id: int | None = None


_CONVENTIONS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def special_convention(tokenizer, *, bos: BosPolicy = "auto", sep: SepPolicy = "auto", add_eos: bool = True
                       ) -> Convention:
    """Which bos / sep / eos ids (and the token before y for an empty x, ``empty_x_id``) to use for
    ``tokenizer`` under the policy (see the module docstring).

    Raises ValueError for an unknown policy or ``bos="always"`` on a tokenizer without a bos token.
    """
    if bos not in ("auto", "always", "never"):
        raise ValueError(f"bos={bos!r}: expected one of 'auto', 'always', 'never'")
    if sep not in ("auto", "never"):
        raise ValueError(f"sep={sep!r}: expected one of 'auto', 'never'")
    bos_tok, eos_tok = tokenizer.bos_token_id, tokenizer.eos_token_id  # what add_special_tokens=True does decides
    if bos == "auto":
        try:
            adds_bos = _CONVENTIONS[tokenizer]
        except (KeyError, TypeError):
            probe = "a"
            with_sp = tokenizer(probe, add_special_tokens=True)["input_ids"]
            without = tokenizer(probe, add_special_tokens=False)["input_ids"]
            adds_bos = bos_tok is not None and len(with_sp) > len(without) and with_sp[0] == bos_tok
            try:
                _CONVENTIONS[tokenizer] = adds_bos
            except TypeError:
                pass
        use_bos = bos_tok is not None and adds_bos
    elif bos == "always":
        if bos_tok is None:
            raise ValueError("bos='always' but the tokenizer has no bos token")
        use_bos = True
    else:
        use_bos = False
    sep_tok = getattr(tokenizer, "sep_token_id", None) if sep == "auto" else None
    # an empty x with nothing in front of y: the tokenizer's bos, else its eos (GPT-2's <|endoftext|>)
    empty_x = bos_tok if bos_tok is not None else eos_tok
    empty_x = None if (use_bos or sep_tok is not None or bos != "auto" or empty_x is None) else int(empty_x)
    return Convention(int(bos_tok) if use_bos else None, None if sep_tok is None else int(sep_tok),
                      int(eos_tok) if add_eos and eos_tok is not None else None, empty_x)


def encode_ids(pair_id: str, x_ids: Sequence[int], y_ids: Sequence[int], conv: Convention, *,
               strategy: str | None = None, max_length: int | None = None) -> EncodedPair:
    """Assemble one pair from its separately tokenized x and y under ``conv`` (module docstring).

    An empty ``x_ids`` gets ``conv.empty_x_id`` as its prefix when ``conv`` has no bos or sep.
    Raises ValueError naming the row if y is empty, if nothing gives y a context, or if y (plus
    bos, sep, eos and one context token) does not fit in ``max_length``.
    """
    if len(y_ids) == 0:
        raise ValueError(f"row {pair_id!r}: y tokenizes to nothing")
    x_ids = list(x_ids)
    if conv.bos_id is not None and x_ids[:1] == [conv.bos_id]:
        x_ids = x_ids[1:]  # x spelled out its own bos: keep exactly one, in front
    head = [] if conv.bos_id is None else [conv.bos_id]
    if not x_ids and conv.bos_id is None and conv.sep_id is None and conv.empty_x_id is not None:
        head = [conv.empty_x_id]  # unconditional text: y after the beginning token (module docstring)
    tail = [] if conv.sep_id is None else [conv.sep_id]
    target = tuple(int(t) for t in y_ids) + (() if conv.eos_id is None else (conv.eos_id,))
    cut = 0
    if max_length is not None:
        room = max_length - len(head) - len(tail) - len(target)  # tokens of x that fit
        if room < 0 or (not head and not tail and room < 1):
            raise ValueError(f"row {pair_id!r}: y has {len(target)} tokens (with the end token) and does not fit "
                             f"in max_length={max_length} with a context token; y is never cut")
        cut = max(0, len(x_ids) - room)
        x_ids = x_ids[cut:]
    prefix = tuple(int(t) for t in head + x_ids + tail)
    if not prefix:
        raise ValueError(f"row {pair_id!r}: x is empty and no bos, sep or eos token gives y a context (the "
                         f"tokenizer has none, or bos='never'; use bos='always' if the model was trained with one)")
    return EncodedPair(pair_id, prefix, target, strategy, cut)


def holds_special_text(tokenizer, pairs: Sequence[Pair]) -> bool:
    """Whether some x or y of ``pairs`` holds the text of one of ``tokenizer``'s special tokens (only
    then do ``special_text="text"`` and ``"tokens"`` encode differently)."""
    texts = [t for t in getattr(tokenizer, "all_special_tokens", ()) if t]
    return any(t in p.x or t in p.y for p in pairs for t in texts)


def encode_pairs(tokenizer, pairs: Sequence[Pair], *, add_eos: bool = True, bos: BosPolicy = "auto",
                 sep: SepPolicy = "auto", max_length: int | None = None,
                 special_text: SpecialText = "text") -> list[EncodedPair]:
    """Tokenize many pairs (one batched tokenizer call for all x, one for all y); see ``encode_pair``.
    ``special_text``: "text" encodes a special token's text inside x or y as its characters
    (``split_special_tokens=True``), "tokens" as the special token (module docstring)."""
    if special_text not in SPECIAL_TEXT:
        raise ValueError(f"special_text={special_text!r}: expected one of {SPECIAL_TEXT}")
    conv = special_convention(tokenizer, bos=bos, sep=sep, add_eos=add_eos)
    if not pairs:
        return []
    split = {"split_special_tokens": True} if special_text == "text" else {}
    xs = tokenizer([p.x for p in pairs], add_special_tokens=False, **split)["input_ids"]
    ys = tokenizer([p.y for p in pairs], add_special_tokens=False, **split)["input_ids"]
    return [encode_ids(p.id, x if p.x else [], y, conv, strategy=p.strategy, max_length=max_length)
            for p, x, y in zip(pairs, xs, ys)]


def encode_pair(tokenizer, pair: Pair, add_eos: bool = True, *, bos: BosPolicy = "auto", sep: SepPolicy = "auto",
                max_length: int | None = None, special_text: SpecialText = "text") -> EncodedPair:
    """Tokenize one pair under the convention of the module docstring.

    Raises ValueError naming the row if y tokenizes to nothing, if x is empty with nothing to give
    y a context, or if y does not fit in ``max_length``.
    """
    return encode_pairs(tokenizer, [pair], add_eos=add_eos, bos=bos, sep=sep, max_length=max_length,
                        special_text=special_text)[0]


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
    # (max prefix_len, max target_len) as host ints, set by ``collate``: shapes of the decoder
    # passes are read from here, so a batch on a GPU needs no device->host copy for them
    host_max: tuple[int, int] | None = None
    # the decoder's inputs where they differ from ``input_ids`` (word dropout on the y-region:
    # ``EncodedPair.y_input_ids``), same shape; None = ``input_ids``. Targets are always read from
    # ``input_ids``, and the z-free pass (the posterior's features, the prefix cache) reads them too
    decoder_input_ids: Int[torch.Tensor, "batch seq"] | None = None
    # (prefix_len, target_len) per row as host lists, set by ``collate`` (a packed pass lays rows out
    # on the host from them: ``zfree.models.packing.packed_prefix_suffix``); None: read from the tensors
    host_lens: tuple[tuple[int, ...], tuple[int, ...]] | None = None

    def host_lengths(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(prefix_len, target_len) of every row as host ints: ``host_lens`` when known, else read from
        the tensors (a device->host copy on an accelerator)."""
        if self.host_lens is not None:
            return self.host_lens
        return tuple(self.prefix_len.tolist()), tuple(self.target_len.tolist())

    @property
    def decoder_inputs(self) -> Int[torch.Tensor, "batch seq"]:
        """What a decoder pass reads: ``decoder_input_ids`` when set, else ``input_ids``."""
        return self.input_ids if self.decoder_input_ids is None else self.decoder_input_ids

    def to(self, device, non_blocking: bool = False) -> "Batch":
        """The batch on ``device`` (ids, strategies and ``host_max`` carried over)."""
        dec = self.decoder_input_ids
        return Batch(*(getattr(self, f).to(device, non_blocking=non_blocking)
                       for f in ("input_ids", "attention_mask", "target_mask", "prefix_len", "target_len")),
                     self.ids, self.strategies, self.host_max,
                     None if dec is None else dec.to(device, non_blocking=non_blocking), self.host_lens)

    def max_lengths(self) -> tuple[int, int]:
        """(max prefix_len, max target_len) as ints: ``host_max`` when known, else read from the
        tensors (a device->host copy on an accelerator)."""
        if self.host_max is not None:
            return self.host_max
        return int(self.prefix_len.max()), int(self.target_len.max())

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def first_targets(self, n: int) -> "Batch":
        """The batch with the y-region S cut to its first ``n`` tokens per row (``target_len`` =
        min(|S|, n), ``target_mask`` cleared after them); tokens and attention are unchanged, so a
        decoder pass over it sees the same inputs and scores only those tokens. ``n`` <= 0 or
        >= max |S|: the batch itself."""
        P, L = self.max_lengths()
        if n <= 0 or n >= L:
            return self
        t = torch.arange(self.input_ids.shape[1], device=self.input_ids.device)[None, :]
        mask = self.target_mask & (t < (self.prefix_len + n)[:, None])
        lens = None if self.host_lens is None else (self.host_lens[0], tuple(min(s, n) for s in self.host_lens[1]))
        return Batch(self.input_ids, self.attention_mask, mask, self.prefix_len, self.target_len.clamp_max(n),
                     self.ids, self.strategies, (P, n), self.decoder_input_ids, lens)


def collate(encoded: Sequence[EncodedPair], pad_id: int = 0) -> Batch:
    """Right-pad a list of encoded pairs into a ``Batch``; masks are built from lengths only. Rows
    with ``y_input_ids`` (word dropout) give the batch ``decoder_input_ids``: ``input_ids`` with
    their y-region replaced by them."""
    P = np.fromiter((len(e.prefix_ids) for e in encoded), dtype=np.int64, count=len(encoded))
    L = np.fromiter((len(e.target_ids) for e in encoded), dtype=np.int64, count=len(encoded))
    n = P + L
    T = int(n.max())
    ids = np.full((len(encoded), T), pad_id, dtype=np.int64)
    for b, e in enumerate(encoded):
        ids[b, : n[b]] = e.prefix_ids + e.target_ids
    dec = None
    if any(e.y_input_ids is not None for e in encoded):
        dec = ids.copy()
        for b, e in enumerate(encoded):
            if e.y_input_ids is not None:
                dec[b, P[b]: n[b]] = e.y_input_ids
    pos = np.arange(T)[None, :]
    attn = pos < n[:, None]
    tmask = (pos >= P[:, None]) & attn
    return Batch(torch.from_numpy(ids), torch.from_numpy(attn.astype(np.int64)), torch.from_numpy(tmask),
                 torch.from_numpy(P), torch.from_numpy(L), [e.id for e in encoded], [e.strategy for e in encoded],
                 (int(P.max()), int(L.max())), None if dec is None else torch.from_numpy(dec),
                 (tuple(P.tolist()), tuple(L.tolist())))


def pad_id_of(tokenizer) -> int:
    """Padding id: the tokenizer's pad, else its eos, else 0 (masks never read token identity)."""
    for tid in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if tid is not None:
            return int(tid)
    return 0
