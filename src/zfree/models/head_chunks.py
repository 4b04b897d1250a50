"""Target-token log-probabilities through the output head without (rows x vocab) logits alive at once.

The decoder reads log p(y_t | ...) = log_softmax(head(h_t))[y_t] at every supervised position, for
every latent value: N = K * sum |S| rows of ``vocab`` logits. Materialized at once, those logits and
their log-softmax (which autograd saves for backward) cost K times the base step's memory at a 50k
vocabulary. ``head_token_logprobs`` cuts the rows into chunks of at most ``HEAD_CHUNK_ELEMENTS``
logits; under gradient each chunk runs inside ``torch.utils.checkpoint`` (non-reentrant), which
keeps only the chunk's hidden states and recomputes its logits in backward, so the peak memory of
forward and backward is bounded by a few chunks, whatever K and the batch. This is the scheme of
torchtune's ``CEWithChunkedOutputLoss`` and of Cut Cross-Entropy (Wijmans et al. 2024, "Cut Your
Losses in Large-Vocabulary Language Models"), with the gradient by recomputation rather than a
fused kernel. Chunks cut rows only, so every chunk goes through the model's own head path
(``zfree.models.head.logits_from_hidden``: soft-capping, scaling, bias) exactly as today.

Cost: one extra head matmul per chunk in backward (4 instead of 3 per row), paid only when the
rows do not fit one chunk; a call that fits one chunk runs the plain path (log_softmax, gather),
bit for bit the computation of the unchunked code. Paths that need the full next-token
distributions (``with_distributions``, the decoder JSD) stay unchunked: their output is
(rows x vocab) anyway.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch.utils.checkpoint import checkpoint

from zfree.models.head import logits_from_hidden, verify_head

#: logits (rows x vocab) computed at once per chunk: 16M float32 values = 64 MiB (130 rows at a
#: 128k vocabulary; 4M left 32-row matmuls there, 1.7x slower than the whole head on the base step,
#: bench_head_chunks.py); backward holds about three chunk-sized tensors at a time
HEAD_CHUNK_ELEMENTS = 1 << 24
_SETTINGS = {"elements": HEAD_CHUNK_ELEMENTS}


def set_head_chunk(elements: int | None) -> int | None:
    """Set the module-wide chunk size in logits per chunk (None: never chunk, the unchunked path);
    returns the previous value. Raises ValueError for a size < 1."""
    if elements is not None and (not isinstance(elements, int) or elements < 1):
        raise ValueError(f"head chunk elements={elements!r}: expected an integer >= 1 or None")
    prev, _SETTINGS["elements"] = _SETTINGS["elements"], elements
    return prev


def head_chunk_rows(vocab: int, elements: int | None = None) -> int | None:
    """Rows per chunk for a ``vocab``-sized head: max(1, elements // vocab) with ``elements``
    defaulting to the module setting; None when chunking is off."""
    elements = _SETTINGS["elements"] if elements is None else elements
    return None if elements is None else max(1, elements // max(1, vocab))


def _chunk_logprobs(model, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log_softmax(head(hidden))[tokens], the model's own logits in float32 (float64 model: float64)."""
    logp = torch.log_softmax(logits_from_hidden(model, hidden), -1)  # (n, V)
    return logp.gather(-1, tokens[:, None]).squeeze(-1)


def head_token_logprobs(model, hidden: Float[torch.Tensor, "rows d_model"], tokens: Int[torch.Tensor, "rows"],
                        *, elements: int | None = None) -> Float[torch.Tensor, "rows"]:
    """log p(tokens[i] | hidden[i]) = log_softmax(logits_i)[tokens[i]] in nats, float32 (float64
    for a float64 model), the logits the model's own head path gives (``zfree.models.head``).

    Rows are processed ``head_chunk_rows(vocab, elements)`` at a time; under gradient each chunk is
    checkpointed (its logits recomputed in backward), so neither forward nor backward holds more
    than a few (chunk x vocab) tensors. Exact: chunking cuts rows only (equal to the unchunked
    path up to float summation order of the head matmul; tests/test_head_chunks.py, also against
    float64). Source: the chunked cross-entropy of torchtune's ``CEWithChunkedOutputLoss`` and
    Wijmans et al. 2024 (Cut Cross-Entropy), gradient by recomputation (``torch.utils.checkpoint``).
    Raises ModelLoadError when the head path cannot be reproduced (``verify_head``).
    """
    verify_head(model, name=type(model).__name__)
    out_layer = model.get_output_embeddings()
    rows = head_chunk_rows(int(out_layer.weight.shape[0]), elements)
    N = hidden.shape[0]
    if rows is None or N <= rows:
        return _chunk_logprobs(model, hidden, tokens)
    grad = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in model.parameters()))
    pieces = []
    for s in range(0, N, rows):
        h, t = hidden[s : s + rows], tokens[s : s + rows]
        if grad:  # keeps h and t; the chunk's logits are recomputed in backward
            pieces.append(checkpoint(_chunk_logprobs, model, h, t, use_reentrant=False))
        else:
            pieces.append(_chunk_logprobs(model, h, t))
    return torch.cat(pieces)
