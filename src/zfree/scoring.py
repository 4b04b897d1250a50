"""z-free surprisal per token and per example, batched and length-sorted.

b(x, y) = (1/|S|) sum_{t in S} -log p_base(y_t | x, y_<t): masked mean token NLL over the
supervised y-region S (y tokens and the end token), nats per token (seed 000, "Implementation
detail"). It is a per-example mean, never the token-weighted batch mean of ``model(labels=...)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from zfree.data.batching import EncodedPair, collate, encode_pair, pad_id_of
from zfree.data.pairs import Pair
from zfree.models.base import target_logprobs


@dataclass
class ScoreResult:
    """Per-example and per-token z-free surprisal, in the input order.

    per_example: id, b (nats per token), n_tokens (|S|), sequence_nll (nats per sequence).
    per_token: id, position (0-based within S), token_id, surprisal (nats).
    """

    per_example: pd.DataFrame
    per_token: pd.DataFrame

    @property
    def c_base(self) -> float:
        """Mean of b over rows (ratio of nothing: a plain mean of per-example means)."""
        return float(self.per_example["b"].mean())


@torch.inference_mode()
def score_encoded(model, encoded: Sequence[EncodedPair], *, pad_id: int = 0, max_batch_tokens: int = 8192,
                  progress: bool = False) -> ScoreResult:
    """Score already-encoded pairs: sort by total length, batch by a token budget, restore order.

    Raises ValueError naming the row if a score is not finite.
    """
    device = next(model.parameters()).device
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i].prefix_ids) + len(encoded[i].target_ids))
    b = np.zeros(len(encoded))
    tok_rows: list[tuple] = [()] * len(encoded)
    i = 0
    bar = tqdm(total=len(encoded), desc="scoring", disable=not progress, leave=False)
    while i < len(order):
        T = len(encoded[order[i]].prefix_ids) + len(encoded[order[i]].target_ids)
        j = i + 1
        while j < len(order):
            Tj = len(encoded[order[j]].prefix_ids) + len(encoded[order[j]].target_ids)
            if Tj * (j - i + 1) > max_batch_tokens:
                break
            T, j = Tj, j + 1
        idx = order[i:j]
        batch = collate([encoded[k] for k in idx], pad_id=pad_id).to(device)
        lp = target_logprobs(model, batch).double().cpu()
        for r, k in enumerate(idx):
            e = encoded[k]
            P, L = len(e.prefix_ids), len(e.target_ids)
            s = -lp[r, P : P + L].numpy()
            if not np.isfinite(s).all():
                raise ValueError(f"row {e.id!r}: non-finite surprisal")
            b[k] = s.mean()
            tok_rows[k] = (e.id, np.arange(L), np.array(e.target_ids), s)
        bar.update(len(idx))
        i = j
    bar.close()
    per_example = pd.DataFrame({"id": [e.id for e in encoded], "b": b,
                                "n_tokens": [len(e.target_ids) for e in encoded]})
    per_example["sequence_nll"] = per_example["b"] * per_example["n_tokens"]
    per_token = pd.DataFrame({
        "id": np.concatenate([[t[0]] * len(t[1]) for t in tok_rows]),
        "position": np.concatenate([t[1] for t in tok_rows]),
        "token_id": np.concatenate([t[2] for t in tok_rows]),
        "surprisal": np.concatenate([t[3] for t in tok_rows]),
    })
    return ScoreResult(per_example, per_token)


def score_pairs(model, tokenizer, pairs: Sequence[Pair], **kw) -> ScoreResult:
    """Tokenize (x and y separately, see ``zfree.data.batching``) and score ``pairs``."""
    encoded = [encode_pair(tokenizer, p) for p in pairs]
    return score_encoded(model, encoded, pad_id=pad_id_of(tokenizer), **kw)
