"""Target-token log-probabilities through the output head without (rows x vocab) logits alive at once.

The decoder reads log p(y_t | ...) = log_softmax(head(h_t))[y_t] at every supervised position, for
every latent value: N = K * sum |S| rows of ``vocab`` logits. Materialized at once, those logits and
their log-softmax (which autograd saves for backward) cost K times the base step's memory at a 50k
vocabulary. ``head_token_logprobs`` cuts the rows into chunks of at most ``HEAD_CHUNK_ELEMENTS``
logits and, under gradient, runs them through ``_HeadLogprobs``, a ``torch.autograd.Function`` with
the gradient scheme of Cut Cross-Entropy (Wijmans et al. 2024, "Cut Your Losses in Large-Vocabulary
Language Models") and of Liger-Kernel's fused linear cross-entropy, written in torch ops:

  forward   per chunk: z = head(h), overwritten in place by log_softmax(z); return its entry at y
            (nats); nothing of the chunk is saved
  backward  per chunk: recompute z = head(h) with autograd on, overwrite it in place with
            dL/dz = g * (onehot(y) - softmax(z)), and backpropagate that through the model's own
            head path into h and the parameters it uses (tied weights, bias, a learnable scale)

So forward saves the hidden states and the tokens, never (rows x vocab), except the chunk computed
last, which is kept (its logits' graph and log_softmax) and differentiated first without
recomputation: a call that fits one chunk never recomputes. The logits are always the model's own
(``zfree.models.head.logits_from_hidden``: soft-capping, scaling, bias), in forward and in
backward, so the gradient of any post-processing comes from autograd, not from a formula here.
The softmax is recomputed from the recomputed logits rather than from a saved logsumexp: the
fused row-wise kernel, in place, reads and writes a chunk about once, where exp(z - lse) takes
two passes over it (one thread, a 333 x 50257 chunk: log_softmax in place 7 ms, max / sub / exp /
sum passes 17 ms, log_softmax into a new tensor 35 ms, most of it page faults of the new 64 MiB).

Cost against the whole head (log_softmax, gather): forward the same matmul and one in-place
log_softmax; backward one extra head matmul per recomputed chunk, and none of log_softmax's saved
output, zero-filled gather gradient or softmax backward, so no (rows x vocab) tensor is allocated
beyond the logits themselves. The scheme before this Function (``torch.utils.checkpoint`` around
log_softmax + gather per chunk, as torchtune's ``CEWithChunkedOutputLoss``) stays as
``_checkpoint_logprobs`` for comparison (tests/test_head_chunks.py, bench_head_chunks.py). Paths
that need the full next-token distributions (``with_distributions``, the decoder JSD) stay
unchunked: their output is (rows x vocab) anyway.
"""

from __future__ import annotations

import contextlib

import torch
from jaxtyping import Float, Int
from torch.utils.checkpoint import checkpoint

from zfree.models.head import logits_from_hidden, verify_head

#: logits (rows x vocab) computed at once per chunk: 16M float32 values = 64 MiB (130 rows at a
#: 128k vocabulary; 4M left 32-row matmuls there, 1.7x slower than the whole head on the base step,
#: bench_head_chunks.py); forward keeps one chunk for backward, backward holds one or two more
HEAD_CHUNK_ELEMENTS = 1 << 24
_SETTINGS = {"elements": HEAD_CHUNK_ELEMENTS, "grad": "function"}


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


def _whole_logprobs(model, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log_softmax(head(hidden))[tokens], the model's own logits in float32 (float64 model: float64):
    the unchunked path, and one chunk of the checkpointed one."""
    logp = torch.log_softmax(logits_from_hidden(model, hidden), -1)  # (n, V)
    return logp.gather(-1, tokens[:, None]).squeeze(-1)


def _checkpoint_logprobs(model, hidden, tokens, rows: int) -> torch.Tensor:
    """The scheme before ``_HeadLogprobs``: each chunk's log_softmax + gather under
    ``torch.utils.checkpoint`` (non-reentrant), recomputed and differentiated by autograd in backward;
    a call that fits one chunk runs the whole head (``_whole_logprobs``)."""
    if hidden.shape[0] <= rows:
        return _whole_logprobs(model, hidden, tokens)
    return torch.cat([checkpoint(_whole_logprobs, model, hidden[s : s + rows], tokens[s : s + rows],
                                 use_reentrant=False) for s in range(0, hidden.shape[0], rows)])


def _log_softmax_(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """In place: ``logits`` <- log_softmax(logits) per row; returns the (n,) entries at ``tokens``.
    ``out=`` the input: the row-wise kernel reads a row's max and sum before it writes the row (the
    same bits as the out-of-place op, tests/test_head_chunks.py) and, unlike separate max / sub /
    exp / sum passes, keeps the row in cache: about 1 read and 1 write of the chunk, no new chunk."""
    torch.log_softmax(logits, -1, out=logits)
    return logits.gather(-1, tokens[:, None]).squeeze(-1)


def _chunks_no_grad(model, hidden, tokens, rows: int) -> torch.Tensor:
    """The forward of ``_HeadLogprobs`` without autograd: log_softmax(z)[y] per row, a chunk at a time."""
    with torch.no_grad():
        return torch.cat([_log_softmax_(logits_from_hidden(model, hidden[s : s + rows]), tokens[s : s + rows])
                          for s in range(0, hidden.shape[0], rows)])


@contextlib.contextmanager
def _saved_storages():
    """Autograd graphs built inside save their tensors through these hooks; yields the set of the
    storages (data pointers) they saved, so a caller can tell whether overwriting an output in
    place would corrupt a saved tensor (e.g. a head ending in tanh, whose backward reads its output).
    Saved tensors are kept detached (first-order gradients only)."""
    ptrs: set[int] = set()

    def pack(t):
        ptrs.add(t.untyped_storage().data_ptr())
        return t.detach()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield ptrs


def _head_logits_with_graph(model, h):
    """(h', edge, buf): the model's own logits for a detached, grad-requiring copy h' of ``h``, the
    autograd edge they hang on, and a buffer of their values free to overwrite in place (their own
    storage, or a copy when their graph saved it). The edge is taken before any overwrite: an
    in-place change to a view (the logits are one) would make autograd rebuild its backward as a
    zero-filled as_strided copy, a (chunk x vocab) fill and copy per chunk."""
    h = h.detach().requires_grad_(True)
    with torch.enable_grad(), _saved_storages() as saved:
        logits = logits_from_hidden(model, h)  # (n, V)
    edge = torch.autograd.graph.get_gradient_edge(logits)
    buf = logits.detach()
    return h, edge, buf if logits.untyped_storage().data_ptr() not in saved else buf.clone()


class _HeadLogprobs(torch.autograd.Function):
    """z[y] - logsumexp(z) per row, z the model's own logits, chunked, gradient by recomputation
    (module docstring). Inputs: (model, rows, hidden, tokens, *params) with ``params`` the model's
    parameters that require grad, so that autograd routes their gradients through this node."""

    @staticmethod
    def forward(ctx, model, rows: int, hidden, tokens, *params):
        dev = hidden.device.type
        ctx.model, ctx.rows, ctx.params = model, rows, params
        ctx.autocast = (dev, torch.is_autocast_enabled(dev), torch.get_autocast_dtype(dev))
        N = hidden.shape[0]
        out = []
        last = (N - 1) // rows * rows  # the chunk kept for backward
        for s in range(0, N, rows):
            if s == last:
                h, edge, buf = _head_logits_with_graph(model, hidden[s:])
                out.append(_log_softmax_(buf, tokens[s:]))  # buf: log_softmax(z), kept
                ctx.kept = (h, edge, buf)
            else:
                out.append(_log_softmax_(logits_from_hidden(model, hidden[s : s + rows]), tokens[s : s + rows]))
        ctx.save_for_backward(hidden, tokens)
        return torch.cat(out)

    @staticmethod
    def backward(ctx, g):
        hidden, tokens = ctx.saved_tensors
        model, rows = ctx.model, ctx.rows
        want_h = ctx.needs_input_grad[2]
        params = [p for p, need in zip(ctx.params, ctx.needs_input_grad[4:]) if need]
        grad_h = torch.zeros_like(hidden) if want_h else None
        grad_p: list[torch.Tensor | None] = [None] * len(params)
        N = hidden.shape[0]
        last = (N - 1) // rows * rows
        order = [last] + list(range(0, last, rows))  # the kept chunk first: its memory goes first
        dev, enabled, dtype = ctx.autocast
        replay = (lambda: torch.autocast(device_type=dev, dtype=dtype)) if enabled else contextlib.nullcontext
        kept, ctx.kept = ctx.kept, None  # a second backward (retain_graph) recomputes every chunk
        for s in order:
            e = min(N, s + rows)
            gs, ts = g[s:e, None], tokens[s:e, None]  # (n, 1)
            if s == last and kept is not None:
                h, edge, buf = kept
                kept = None
                buf.exp_()  # softmax(z) from log_softmax(z)
            else:
                # forward's autocast state for the recomputation only: the backward kernels below
                # must run as autograd's own do, outside autocast (it would cast their matmuls)
                with replay():
                    h, edge, buf = _head_logits_with_graph(model, hidden[s:e])
                torch.softmax(buf, -1, out=buf)  # in place, as _log_softmax_
            buf.mul_(-gs)  # -g * softmax(z)
            buf.scatter_add_(1, ts, gs.to(buf.dtype))  # + g * onehot(y)
            inputs = ([h] if want_h else []) + params
            grads = torch.autograd.grad(edge, inputs, buf, allow_unused=True)
            del edge, buf
            if want_h:
                if grads[0] is not None:
                    grad_h[s:e] = grads[0]
                grads = grads[1:]
            for i, gp in enumerate(grads):
                if gp is not None:
                    grad_p[i] = gp if grad_p[i] is None else grad_p[i].add_(gp)
        it = iter(grad_p)
        return (None, None, grad_h, None, *[next(it) if need else None for need in ctx.needs_input_grad[4:]])


#: the gradient scheme under autograd (tests and the benchmark switch it with ``_grad_scheme``)
_GRAD_SCHEMES = {"function": lambda model, h, t, rows, params: _HeadLogprobs.apply(model, rows, h, t, *params),
                 "checkpoint": lambda model, h, t, rows, params: _checkpoint_logprobs(model, h, t, rows)}


@contextlib.contextmanager
def _grad_scheme(name: str):
    """Inside: head_token_logprobs under gradient uses scheme ``name`` (``_GRAD_SCHEMES``).
    Raises KeyError listing the schemes."""
    if name not in _GRAD_SCHEMES:
        raise KeyError(f"head gradient scheme {name!r} is not one of {sorted(_GRAD_SCHEMES)}")
    prev, _SETTINGS["grad"] = _SETTINGS["grad"], name
    try:
        yield
    finally:
        _SETTINGS["grad"] = prev


def head_token_logprobs(model, hidden: Float[torch.Tensor, "rows d_model"], tokens: Int[torch.Tensor, "rows"],
                        *, elements: int | None = None) -> Float[torch.Tensor, "rows"]:
    """log p(tokens[i] | hidden[i]) = z_i[tokens[i]] - logsumexp(z_i) in nats, one value per row, z_i
    the logits the model's own head path gives (``zfree.models.head``), float32 (float64 for a
    float64 model); ``hidden`` (rows, d_model) in any float dtype, ``tokens`` (rows,) int64 ids.

    Rows are processed ``head_chunk_rows(vocab, elements)`` at a time (``elements`` None: the module
    setting, ``set_head_chunk``). Under gradient (grad mode on and ``hidden`` or a model parameter
    requiring grad) through ``_HeadLogprobs``: forward keeps the hidden states, the tokens and the
    last chunk's logits; backward recomputes the other chunks' logits and sends
    g * (onehot - softmax) back through the head path, so gradients reach ``hidden`` and every
    parameter of ``model`` the head path uses (a tied input embedding's adds to its other
    gradients; tensors that are not ``model.parameters()``, e.g. swapped in by
    ``torch.func.functional_call``, get none; first-order only: no ``create_graph``; a second
    backward with ``retain_graph`` recomputes every chunk). Neither pass holds more than about three
    (chunk x vocab) tensors. Without gradient: the same forward, chunk by chunk. With chunking off
    (``set_head_chunk(None)``): log_softmax + gather over the whole head at once.
    Exact: chunking cuts rows only; equal to the whole head up to float summation order
    (tests/test_head_chunks.py: values and gradients, float64 gradcheck, tied, biased, soft-capped
    and scaled heads, LoRA, bf16). Source: Wijmans et al. 2024 (Cut Cross-Entropy), the gradient
    by recomputation in torch ops. Raises ModelLoadError when the head path cannot be reproduced
    (``verify_head``).
    """
    verify_head(model, name=type(model).__name__)
    out_layer = model.get_output_embeddings()
    rows = head_chunk_rows(int(out_layer.weight.shape[0]), elements)
    if rows is None or hidden.shape[0] == 0:
        return _whole_logprobs(model, hidden, tokens)
    params = [p for p in model.parameters() if p.requires_grad] if torch.is_grad_enabled() else []
    if not (torch.is_grad_enabled() and (hidden.requires_grad or params)):
        return _chunks_no_grad(model, hidden, tokens, rows)
    return _GRAD_SCHEMES[_SETTINGS["grad"]](model, hidden, tokens, rows, params)
