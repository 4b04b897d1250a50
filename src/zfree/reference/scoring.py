"""z-free surprisal per token and per example, for any causal LM: exact, batched, cached.

b(x, y) = (1/|S|) sum_{t in S} -log p_base(y_t | x, y_<t): the masked mean token NLL over the
supervised y-region S (y's tokens, plus the end token when ``ScoringPolicy.add_eos``), nats per
token; a per-example mean, never the token-weighted batch mean of ``model(labels=...).loss``.
c_base = mean of b over valid rows (docs/concepts/problem.md, docs/concepts/weightings.md).

x and y are tokenized separately (``zfree.data.batching``); a pair longer than the context loses x
tokens from the left (``x_tokens_cut``), never y tokens. Rows are right-padded with the attention
mask passed, so a padded row scores as it does alone (up to float32 summation order). The body runs
in the model's dtype; the head and log-sum-exp in float32 on the y positions only. Rows are batched
by length under a token budget and returned in input order.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from zfree.data.batching import (SPECIAL_TEXT, BosPolicy, EncodedPair, SepPolicy, SpecialText, encode_pairs,
                                 holds_special_text, pad_id_of, special_convention)
from zfree.data.pairs import Pair, load_pairs
from zfree.core.io import atomic_write_json, atomic_write_parquet, sha256_json, sha256_state_dict
from zfree.core.progress import bar as progress_bar
from zfree.models.base import context_length  # noqa: F401 - scoring's context length, re-exported
from zfree.models.head import head_is_exact, logits_from_hidden
from zfree.models.loading import load_causal_lm
from zfree.models.precision import acc_dtype
from zfree.reference.score_cache import (config_sha256, default_cache_dir, load_entry, rows_sha256,  # noqa: F401
                                         store_entry, tokenizer_sha256)

SCORER_VERSION = "3"  # bump whenever a change can move a number: it is part of the cache key
# everything in a score's settings that enters its cache key (the batch budget does not: it moves
# numbers only at float32 rounding)
CACHE_KEY_FIELDS = ("policy", "max_length", "weights_sha256", "config_sha256", "tokenizer_sha256", "data_sha256",
                    "scorer_version", "dtype", "device")


@dataclass(frozen=True)
class ScoringPolicy:
    """Every choice that decides which tokens are scored (all of it goes into the cache key)."""

    bos: BosPolicy = "auto"  # see zfree.data.batching: the tokenizer's own convention, exactly once
    sep: SepPolicy = "auto"  # append the tokenizer's sep token after x when it has one
    add_eos: bool = True  # S includes the end token (the model must learn to stop)
    max_length: int | None = None  # None: the model's context length (config.max_position_embeddings)
    # a special token's text inside x or y ("<|endoftext|>"): "text" encodes its characters, "tokens" the
    # token (zfree.data.batching); in the cache key only where some row holds such text
    special_text: SpecialText = "text"

    def __post_init__(self):
        if self.special_text not in SPECIAL_TEXT:
            raise ValueError(f"ScoringPolicy.special_text={self.special_text!r}: expected one of {SPECIAL_TEXT}")
        if self.bos not in ("auto", "always", "never"):
            raise ValueError(f"ScoringPolicy.bos={self.bos!r}: expected 'auto', 'always' or 'never'")
        if self.sep not in ("auto", "never"):
            raise ValueError(f"ScoringPolicy.sep={self.sep!r}: expected 'auto' or 'never'")
        if self.max_length is not None and self.max_length < 2:
            raise ValueError(f"ScoringPolicy.max_length={self.max_length}: must be >= 2 (a context and a y token)")


@dataclass
class ScoreResult:
    """Per-example and per-token z-free surprisal, in the input order.

    per_example: id, b (nats per token), n_tokens (|S|), sequence_nll (nats per sequence),
        x_tokens_cut, valid (b finite).
    per_token: id, position (0-based within S), token_id, surprisal (nats).
    settings: everything that affects the numbers (hashes, dtype, device, policy, version).
    """

    per_example: pd.DataFrame
    per_token: pd.DataFrame
    settings: dict = field(default_factory=dict)
    cache_hit: bool = False

    @property
    def c_base(self) -> float:
        """Mean of b over valid rows (a plain mean of per-example means), nats per token."""
        return float(self.per_example.loc[self.per_example["valid"], "b"].mean())

    @property
    def n_valid(self) -> int:
        """Rows scored (``valid``: y fitted the context and tokenized to at least one token)."""
        return int(self.per_example["valid"].sum())

    def summary(self) -> dict:
        """summary.json's record: c_base (nats/token), row and token counts, the first 50 invalid ids,
        the x tokens cut, the units and every setting (the cache key's fields among them)."""
        bad = self.per_example.loc[~self.per_example["valid"], "id"].tolist()
        return {"c_base": self.c_base, "n_rows": len(self.per_example), "n_valid": self.n_valid,
                "invalid_ids": bad[:50], "n_tokens": int(self.per_example["n_tokens"].sum()),
                "x_tokens_cut": int(self.per_example["x_tokens_cut"].sum()),
                "units": "b: nats per token (masked mean over S); surprisal: nats", **self.settings}


def load_scoring_model(source: Path | str, *, device: str = "auto", dtype: str = "auto",
                       trust_remote_code: bool = False):
    """``(model, tokenizer)`` for scoring: ``zfree.models.loading.load_causal_lm`` (its sources, dtypes
    and errors: FileNotFoundError for a missing path, ModelLoadError for what zfree refuses)."""
    return load_causal_lm(source, device=device, dtype=dtype, trust_remote_code=trust_remote_code)


def plan_batches(lengths: np.ndarray, max_batch_tokens: int, max_batch_rows: int | None = None) -> list[slice]:
    """Cut rows sorted by ascending length into batches: padded tokens (rows x longest) within
    ``max_batch_tokens`` (a longer row alone), at most ``max_batch_rows`` rows; a batch closes at a
    length change once it holds 1/16 of the budget, so most batches carry no padding."""
    out, start, real = [], 0, 0
    for i, n in enumerate(lengths.tolist()):
        rows = i - start
        if rows and ((rows + 1) * n > max_batch_tokens or (max_batch_rows is not None and rows >= max_batch_rows)
                     or (n != lengths[i - 1] and 16 * real >= max_batch_tokens)):
            out.append(slice(start, i))
            start, real = i, 0
        real += n
    if len(lengths):
        out.append(slice(start, len(lengths)))
    return out


def _head_logprobs(model, h: torch.Tensor, tokens: torch.Tensor, chunk: int) -> torch.Tensor:
    """log p(token) = logit[token] - logsumexp(logits), the model's own logits from hidden states
    (``zfree.models.head.logits_from_hidden``: float32, float64 for a float64 model), ``chunk`` at a time."""
    out = []
    for s in range(0, h.shape[0], chunk):
        logits = logits_from_hidden(model, h[s : s + chunk])  # (n, vocab) float32
        out.append(logits.gather(-1, tokens[s : s + chunk, None]).squeeze(-1) - logits.logsumexp(-1))
    return torch.cat(out) if out else h.new_zeros(0, dtype=acc_dtype(h.dtype))


@torch.inference_mode()
def score_encoded(model, encoded: Sequence[EncodedPair], *, pad_id: int = 0, max_batch_tokens: int = 8192,
                  max_batch_rows: int | None = None, progress: bool = False,
                  soft_token: torch.Tensor | None = None) -> ScoreResult:
    """Score already-encoded pairs with ``model`` on its own device and dtype, in eval mode; no cache.

    Batched by ``plan_batches``, returned in input order. With ``soft_token`` (d_model,): every row is
    read as [x-prefix, soft_token, sep, y] (the prefix route's context, ``zfree.reference.prefix``): the
    vector is inserted as an input embedding just before the separator (position prefix_len - 1), every
    later token one position on; S and its tokens are unchanged. A row of non-finite surprisal is kept
    with ``valid=False`` and a warning, out of ``c_base``. Raises ValueError naming the row for a pair
    longer than the model's context (with the soft token), or without a context or y token; or for no rows.
    """
    if not encoded:
        raise ValueError("nothing to score: no rows")
    P = np.fromiter((len(e.prefix_ids) for e in encoded), np.int64, len(encoded))
    L = np.fromiter((len(e.target_ids) for e in encoded), np.int64, len(encoded))
    n = P + L
    _check_lengths(model, encoded, P, L, n + (soft_token is not None))
    flat = np.fromiter((t for e in encoded for t in (*e.prefix_ids, *e.target_ids)), np.int64, int(n.sum()))
    starts = np.cumsum(n) - n  # row k's tokens are flat[starts[k] : starts[k] + n[k]]
    order = np.argsort(n, kind="stable")
    was_training = model.training
    model.eval()
    try:
        via_hidden = head_is_exact(model)
        # on a terminal or in a notebook only: a few seconds' bar would only add lines to a log
        bar = progress_bar(total=len(encoded), desc="scoring", progress=progress, terminal_only=True, leave=False)
        pieces = []
        for sl in plan_batches(n[order], max_batch_tokens, max_batch_rows):
            pieces.append(_batch_logprobs(model, flat, starts[order[sl]], P[order[sl]], L[order[sl]], pad_id,
                                          via_hidden, soft_token))
            bar.update(sl.stop - sl.start)
        bar.close()
    finally:
        model.train(was_training)
    surp_sorted = -torch.cat(pieces).double().cpu().numpy()  # segments in sorted row order
    off = np.empty_like(L)
    off[order] = np.cumsum(L[order]) - L[order]  # row k's first token in the sorted segments
    within = np.arange(L.sum()) - np.repeat(np.cumsum(L) - L, L)
    surp = surp_sorted[np.repeat(off, L) + within]  # input order
    res = _result(encoded, surp, flat[np.repeat(starts + P, L) + within], within, L)
    param = next(model.parameters())
    res.settings = {"scorer_version": SCORER_VERSION, "dtype": str(param.dtype).replace("torch.", ""),
                    "head_dtype": str(acc_dtype(param.dtype)).replace("torch.", ""), "device": param.device.type,
                    "max_batch_tokens": max_batch_tokens, "head_path": "hidden_states" if via_hidden else "model_logits"}
    return res


def _check_lengths(model, encoded: Sequence[EncodedPair], P: np.ndarray, L: np.ndarray, n: np.ndarray) -> None:
    """ValueError naming the first row longer than the model's context, or without a context or y token."""
    ctx = context_length(model)
    if ctx is not None and n.max() > ctx:
        k = int(np.argmax(n > ctx))
        raise ValueError(f"row {encoded[k].id!r}: {n[k]} tokens exceed the model's context of {ctx}; "
                         f"encode with max_length={ctx} to cut x from the left")
    if (P < 1).any() or (L < 1).any():
        k = int(np.argmax((P < 1) | (L < 1)))
        raise ValueError(f"row {encoded[k].id!r}: needs at least one context token and one y token")


def _batch_logprobs(model, flat: np.ndarray, starts: np.ndarray, Pb: np.ndarray, Lb: np.ndarray, pad_id: int,
                    via_hidden: bool, soft: torch.Tensor | None = None) -> torch.Tensor:
    """log p of every y token of one batch of rows (``flat[starts[k]:]``, ``Pb[k]`` context and ``Lb[k]``
    y tokens), right-padded with ``pad_id``, in row order; only the positions predicting y reach the head.
    ``soft`` (d_model,): inserted as an input embedding at position ``Pb[k] - 1`` of every row (``score_encoded``)."""
    device = next(model.parameters()).device
    nb = Pb + Lb
    cols = np.arange(int(nb.max()))
    real = cols[None, :] < nb[:, None]  # (batch, seq) from lengths, never from token identity
    ids = np.where(real, flat[np.minimum(starts[:, None] + cols, len(flat) - 1)], pad_id)
    input_ids = torch.from_numpy(ids).to(device)
    attn = None if real.all() else torch.from_numpy(real.astype(np.int64)).to(device)
    within = np.arange(Lb.sum()) - np.repeat(np.cumsum(Lb) - Lb, Lb)  # position inside S
    rows = np.repeat(np.arange(len(Lb)), Lb)
    pos = np.repeat(Pb - 1, Lb) + within  # position t - 1 predicts y token at t
    tgt = torch.from_numpy(ids[rows, pos + 1]).to(device)
    inputs = {"input_ids": input_ids}
    if soft is not None:  # [x-prefix, soft, sep, y]: extended position t > P - 1 reads token t - 1
        inputs, attn = _soft_token_inputs(model, ids, real, Pb - 1, soft)
        pos = pos + 1
    rows_t, pos_t = torch.from_numpy(rows).to(device), torch.from_numpy(pos).to(device)
    if via_hidden:
        vocab = int(getattr(model.get_output_embeddings(), "weight", torch.empty(1 << 16, 1)).shape[0])
        chunk = max(64, (1 << 22) // vocab)  # at most 4M fp32 logits (16 MiB) alive at once
        hidden = model.base_model(**inputs, attention_mask=attn, use_cache=False).last_hidden_state
        return _head_logprobs(model, hidden[rows_t, pos_t], tgt, chunk)  # (N,) only y positions
    logits = model(**inputs, attention_mask=attn, use_cache=False).logits[rows_t, pos_t]
    logits = logits.to(acc_dtype(next(model.parameters()).dtype))
    return logits.gather(-1, tgt[:, None]).squeeze(-1) - logits.logsumexp(-1)


def _soft_token_inputs(model, ids: np.ndarray, real: np.ndarray, at: np.ndarray, soft: torch.Tensor
                       ) -> tuple[dict, torch.Tensor | None]:
    """({"inputs_embeds": (batch, seq + 1, d_model)}, the attention mask or None) of right-padded ``ids``
    (batch, seq) with ``soft`` inserted at position ``at[k]`` of row k (later tokens one position on)."""
    device = next(model.parameters()).device
    cols = np.arange(ids.shape[1] + 1)
    src = np.minimum(cols[None, :] - (cols[None, :] > at[:, None]), ids.shape[1] - 1)  # (batch, seq + 1)
    real_x = np.take_along_axis(real, src, 1)  # at[k] reads real[k, at[k]]: True (at < prefix_len)
    emb = model.get_input_embeddings()(torch.from_numpy(np.take_along_axis(ids, src, 1)).to(device))
    is_soft = torch.from_numpy(cols[None, :] == at[:, None]).to(device)[..., None]  # (batch, seq + 1, 1)
    embeds = torch.where(is_soft, soft.to(device=device, dtype=emb.dtype), emb)
    attn = None if real_x.all() else torch.from_numpy(real_x.astype(np.int64)).to(device)
    return {"inputs_embeds": embeds}, attn


def _result(encoded: Sequence[EncodedPair], surp: np.ndarray, token_ids: np.ndarray, within: np.ndarray,
            L: np.ndarray) -> ScoreResult:
    """The result of surprisals ``surp`` in input order (``L[k]`` of row k); a non-finite row: invalid, warned."""
    seq_nll = np.add.reduceat(surp, np.cumsum(L) - L)
    b = seq_nll / L
    valid = np.isfinite(b)
    ids_col = [e.id for e in encoded]
    if not valid.all():
        bad = [ids_col[k] for k in np.flatnonzero(~valid)[:10]]
        warnings.warn(f"{int((~valid).sum())} rows have non-finite surprisal and are left out of c_base: {bad}")
    per_example = pd.DataFrame({"id": ids_col, "b": b, "n_tokens": L, "sequence_nll": seq_nll,
                                "x_tokens_cut": [e.x_tokens_cut for e in encoded], "valid": valid})
    per_token = pd.DataFrame({"id": np.repeat(np.array(ids_col, dtype=object), L), "position": within,
                              "token_id": token_ids, "surprisal": surp})
    return ScoreResult(per_example, per_token)


def soft_token_sha256(soft_token: torch.Tensor) -> str:
    """sha256 of a soft token's (d_model,) dtype, shape and bytes (``zfree.core.io.sha256_state_dict``): the
    key ``score_pairs`` and a stored prefix reference (``zfree.reference.prefix``) record it under."""
    return sha256_state_dict({"soft_token": soft_token.detach()})


def score_pairs(model, tokenizer, pairs: Sequence[Pair], *, policy: ScoringPolicy | None = None,
                cache: bool | None = None, cache_dir: Path | str | None = None, max_batch_tokens: int = 8192,
                max_batch_rows: int | None = None, progress: bool = False,
                soft_token: torch.Tensor | None = None) -> ScoreResult:
    """Tokenize ``pairs`` (x and y separately, ``zfree.data.batching``) and score them; with
    ``soft_token``, read through it (``score_encoded``; its sha256 is in the settings and the cache key).

    Cache: on unless ``cache=False`` (``cache=None``: off when ``$ZFREE_NO_CACHE=1``), under
    ``cache_dir`` (default ``default_cache_dir()``), keyed by ``CACHE_KEY_FIELDS`` (weights, config,
    tokenizer, dtype, device type, policy, max length, scorer version, data rows). A hit returns the
    stored values bit for bit; a damaged entry is dropped with a warning and scored again.

    Raises ValueError naming the row for a y that tokenizes to nothing, an empty x without a context
    token, or a y that does not fit the context (nothing is written).
    """
    policy = policy or ScoringPolicy()
    max_len = policy.max_length or context_length(model)
    encoded = encode_pairs(tokenizer, pairs, add_eos=policy.add_eos, bos=policy.bos, sep=policy.sep,
                           max_length=max_len, special_text=policy.special_text)
    conv = special_convention(tokenizer, bos=policy.bos, sep=policy.sep, add_eos=policy.add_eos)
    param = next(model.parameters())
    settings = {"policy": asdict(policy), "max_length": max_len, "bos_id": conv.bos_id, "sep_id": conv.sep_id,
                "eos_id": conv.eos_id, "empty_x_id": conv.empty_x_id, "pad_id": pad_id_of(tokenizer),
                "weights_sha256": sha256_state_dict(model.state_dict()), "config_sha256": config_sha256(model),
                "tokenizer_sha256": tokenizer_sha256(tokenizer),
                "data_sha256": rows_sha256(pairs), "scorer_version": SCORER_VERSION,
                "dtype": str(param.dtype).replace("torch.", ""), "device": param.device.type}
    soft_key = {}
    if soft_token is not None:
        soft_key = {"soft_token_sha256": soft_token_sha256(soft_token)}
        settings.update(soft_key)
    use_cache = cache if cache is not None else os.environ.get("ZFREE_NO_CACHE", "").lower() not in ("1", "true")
    key_dir = None
    if use_cache:
        key = sha256_json({k: settings[k] for k in CACHE_KEY_FIELDS} | _key_policy(settings["policy"], tokenizer, pairs)
                          | soft_key)
        key_dir = Path(cache_dir or default_cache_dir()) / key[:2] / key
        entry = load_entry(key_dir, [e.id for e in encoded], sum(len(e.target_ids) for e in encoded))
        if entry is not None:
            hit = ScoreResult(*entry, cache_hit=True)
            # an entry stored before the key was recorded: it is a function of the tokenizer and the policy,
            # both in the cache key
            hit.settings.setdefault("empty_x_id", conv.empty_x_id)
            return hit
    res = score_encoded(model, encoded, pad_id=settings["pad_id"], max_batch_tokens=max_batch_tokens,
                        max_batch_rows=max_batch_rows, progress=progress, soft_token=soft_token)
    res.settings = {**res.settings, **settings}
    if key_dir is not None:
        store_entry(key_dir, res.per_example, res.per_token, res.settings)
    return res


def _key_policy(policy: dict, tokenizer, pairs) -> dict:
    """The policy as the cache key holds it: ``special_text`` only where some row holds a special
    token's text (elsewhere both choices encode the same tokens)."""
    if holds_special_text(tokenizer, pairs):
        return {"policy": policy}
    return {"policy": {k: v for k, v in policy.items() if k != "special_text"}}


def score_file(model_dir: Path | str, data_file: Path | str, *, device: str = "auto", dtype: str = "auto",
               policy: ScoringPolicy | None = None, trust_remote_code: bool = False, limit: int | None = None,
               **kw) -> ScoreResult:
    """Load the model and tokenizer from ``model_dir``, read ``data_file`` (JSONL pairs) and score it;
    ``limit``: only its first ``limit`` rows (recorded as ``settings["limit"]``, so in summary.json).
    Errors as ``load_scoring_model``, ``zfree.data.pairs.load_pairs`` and ``score_pairs``."""
    pairs = load_pairs(data_file, limit=limit)
    model, tok = load_scoring_model(model_dir, device=device, dtype=dtype, trust_remote_code=trust_remote_code)
    res = score_pairs(model, tok, pairs, policy=policy, **kw)
    res.settings = {**res.settings, "model_dir": str(model_dir), "data_file": str(data_file),
                    **({"limit": limit} if limit is not None else {})}
    return res


def write_scores(res: ScoreResult, out_dir: Path | str) -> Path:
    """Write per_example.parquet, per_token.parquet and summary.json into ``out_dir``, each atomically,
    summary last (its presence marks a complete folder)."""
    out_dir = Path(out_dir)
    atomic_write_parquet(out_dir / "per_example.parquet", res.per_example)
    atomic_write_parquet(out_dir / "per_token.parquet", res.per_token)
    atomic_write_json(out_dir / "summary.json", res.summary())
    return out_dir
