"""Decoder passes with a latent vector added to the input embeddings, shared by both CVAEs
(docs/concepts/problem.md#models): the ``embedding`` injection route, and the suffix-pass pieces every
route shares (the other routes, ``mid``, ``memory`` and ``prefix``, are in ``zfree.models.routes``).

The latent enters as an additive vector ``u`` (discrete: the embedding e_k of value k; continuous:
the projection W z of a sample) at the separator and at every position that predicts a y token,
in the body's dtype (a float32 u onto a bfloat16-stored frozen body is rounded to bfloat16 there;
its parameters and gradient stay float32: ``zfree.models.precision``).
Because the x-prefix ([bos] + x) does not depend on z, the K (or S) decoder passes reuse the key/value
cache of one z-free pass over (x, y) and run only over the y-region ("shared prefix"):
cost |x| + n·|y| instead of n·(|x| + |y|) per example. ``decoder_hidden_full`` is the naive reference
path (a full pass per latent vector); both are tested equal.

The prefix cache can be reused exactly only when every cached layer still holds all prefix
positions and no sliding-window mask would bite inside the suffix pass (its mask is laid out in
cache coordinates, which differ from a shorter row's true positions). ``shared_prefix_problem``
checks this on the actual cache and config; under ``SHARED_PREFIX = "auto"`` (the default)
``decoder_hidden_suffix`` falls back to the full pass when it fails and warns once per model
class; ``"on"`` raises instead, ``"off"`` always takes the full pass (``set_shared_prefix``).
Logits always come from the model's own head path (``zfree.models.head``).

Packed rows (issue 56): the training step's x-prefix pass and decoder passes as one forward over the
batch's rows without padding are in ``zfree.models.packing``.
"""

from __future__ import annotations

import warnings

import torch
from jaxtyping import Bool, Float, Int
from transformers import DynamicCache

from zfree.data.batching import Batch
from zfree.models.base import hidden_states
from zfree.models.head import exact_logits_from_hidden
from zfree.models.head_chunks import head_token_logprobs
from zfree.models.kv_cache import CACHE_KW, sliding_window_of

SHARED_PREFIX_MODES = {"auto": "shared prefix where exact, else the full pass (warned once)",
                       "on": "shared prefix; an inexact cache is an error",
                       "off": "always the full pass"}
SHARED_PREFIX = "auto"  # module-level default; set with set_shared_prefix
_WARNED: set = set()

def set_shared_prefix(mode: str) -> str:
    """Set the module-wide shared-prefix mode (``SHARED_PREFIX_MODES``); returns the previous one.
    Raises ValueError listing the valid modes."""
    global SHARED_PREFIX
    if mode not in SHARED_PREFIX_MODES:
        raise ValueError(f"shared_prefix={mode!r}: expected one of {sorted(SHARED_PREFIX_MODES)}")
    prev, SHARED_PREFIX = SHARED_PREFIX, mode
    return prev


def shared_prefix_problem(backbone, cache, n_cached: int, extent: int) -> str | None:
    """Why ``cache`` (of a z-free pass over ``n_cached`` positions) cannot serve a suffix pass whose
    cache-coordinate extent is ``extent`` (= cached prefix slots + suffix length) exactly; None when
    it can. Checks every layer's stored length and every sliding window (cache layer or config)."""
    windows = [sliding_window_of(backbone.config)]
    for i, (k, _) in enumerate(layer_kv(cache)):
        if k.shape[-2] < n_cached:
            return f"cache layer {i} keeps {k.shape[-2]} of {n_cached} positions (sliding window)"
    for layer in getattr(cache, "layers", []):
        windows.append(getattr(layer, "sliding_window", None))
    ws = [w for w in windows if isinstance(w, int) and w > 0]
    if ws and extent > min(ws):
        return f"sliding window {min(ws)} < suffix extent {extent}"
    return None


def injection_mask(batch: Batch) -> Bool[torch.Tensor, "batch seq"]:
    """True at the separator and the positions that predict y tokens: prefix_len - 1 <= t <
    prefix_len + |S| - 1 (the last end token predicts nothing and gets no latent)."""
    t = torch.arange(batch.input_ids.shape[1], device=batch.input_ids.device)[None, :]
    start = (batch.prefix_len - 1)[:, None]
    return (t >= start) & (t < start + batch.target_len[:, None])


def repeat_batch(batch: Batch, n: int) -> Batch:
    """Each row repeated n times, consecutively (row b -> rows b*n .. b*n+n-1)."""
    r = lambda t: t.repeat_interleave(n, dim=0)
    return Batch(r(batch.input_ids), r(batch.attention_mask), r(batch.target_mask), r(batch.prefix_len),
                 r(batch.target_len), [i for i in batch.ids for _ in range(n)],
                 [s for s in batch.strategies for _ in range(n)], batch.host_max,
                 None if batch.decoder_input_ids is None else r(batch.decoder_input_ids))


def layer_kv(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) per layer, each (batch, heads, seq, head_dim), across transformers versions."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


#: the attribute of a z-free pass's cache that records how many positions the pass fed it
CACHED_POSITIONS = "zfree_positions"


def zfree_pass(backbone, batch: Batch, use_cache: bool = True, prefix_only: bool = False):
    """The z-free pass: (hidden (B, T', D), its key/value cache or None), over (x, y) (T' = T) or, with
    ``prefix_only``, over the first T' = max prefix_len columns only: every row's [bos] + x + separator
    (a row with a shorter prefix also reads its first y tokens there, which none of its prefix positions
    attends to). Causal attention: the prefix positions' states and cache slots are the full pass's, so
    the router (the separator state) and the decoder's shared prefix need no more (``DiscreteCVAE``);
    only the y-region's z-free states (an amortized posterior's features, the z-free NLL) need (x, y).
    The cache records the positions fed (``CACHED_POSITIONS``; ``shared_prefix_problem`` checks them)."""
    ids, mask = batch.input_ids, batch.attention_mask
    if prefix_only:
        P = batch.max_lengths()[0]  # a host int: no device read
        ids, mask = ids[:, :P], mask[:, :P]
    out = backbone.base_model(input_ids=ids, attention_mask=mask, use_cache=use_cache)
    if not use_cache:
        return out.last_hidden_state, None
    cache = getattr(out, "cache", None) or out.past_key_values
    setattr(cache, CACHED_POSITIONS, ids.shape[1])
    return out.last_hidden_state, cache


def decoder_hidden_full(backbone, batch: Batch, latents: Float[torch.Tensor, "batch n d_model"]
                        ) -> Float[torch.Tensor, "batch n seq d_model"]:
    """Reference path: one full pass over (x, y) per latent vector, ``latents[b, s]`` added at the
    injection positions of row b; the decoder reads ``batch.decoder_inputs`` (word dropout).
    Returns hidden states (B, n, T, D)."""
    B, T = batch.input_ids.shape
    n = latents.shape[1]
    emb = backbone.get_input_embeddings()(batch.decoder_inputs)  # (B, T, D)
    inj = injection_mask(batch).to(emb.dtype)  # (B, T)
    x = emb[:, None] + inj[:, None, :, None] * latents.to(emb.dtype)[:, :, None, :]  # (B, n, T, D), the body's dtype
    h = hidden_states(backbone, repeat_batch(batch, n), inputs_embeds=x.reshape(B * n, T, -1))
    return h.reshape(B, n, T, -1)


def suffix_full_pass_reason(backbone, batch: Batch, cache, extent: int, shared_prefix: str | None = None) -> str | None:
    """Whether a suffix pass of cache-coordinate ``extent`` must take the full pass instead, under
    ``shared_prefix`` (default: the module's ``SHARED_PREFIX``): None to take the suffix pass, else
    the reason ("off", "no cache" or ``shared_prefix_problem``'s). "auto" warns once per model class
    when the cache is not exactly reusable; "on" raises ValueError then; every mode not in
    ``SHARED_PREFIX_MODES`` raises ValueError listing them. Shared by every injection route."""
    mode = SHARED_PREFIX if shared_prefix is None else shared_prefix
    if mode not in SHARED_PREFIX_MODES:
        raise ValueError(f"shared_prefix={mode!r}: expected one of {sorted(SHARED_PREFIX_MODES)}")
    if mode == "off":
        return "off"
    if cache is None:
        return "no cache"
    problem = shared_prefix_problem(backbone, cache, getattr(cache, CACHED_POSITIONS, batch.input_ids.shape[1]), extent)
    if problem and mode == "on":
        raise ValueError(f"shared_prefix='on' but the prefix cache of {type(backbone).__name__} cannot be reused "
                         f"exactly: {problem} (use 'auto' or 'off')")
    if problem and type(backbone).__name__ not in _WARNED:
        _WARNED.add(type(backbone).__name__)
        warnings.warn(f"{type(backbone).__name__}: shared-prefix decoding is not exact here ({problem}); "
                      f"using the full pass per latent (exact, slower)", stacklevel=3)
    return problem


def suffix_layout(batch: Batch) -> tuple[int, int, Int[torch.Tensor, "batch pos"], Bool[torch.Tensor, "batch pos"]]:
    """(Pc, L, pos, valid) of a suffix pass: Pc = max prefix_len - 1 cached prefix slots (without the
    separator), L = max |S|, pos (B, L) the positions of sep, y_0 .. y_{|S|-2} per row, valid (B, L)
    the entries inside each row's S. Host ints from ``batch.max_lengths`` (no device->host copy)."""
    P_max, L = batch.max_lengths()
    j = torch.arange(L, device=batch.input_ids.device)[None, :]
    return P_max - 1, L, (batch.prefix_len - 1)[:, None] + j, j < batch.target_len[:, None]


def prefix_cache(cache, Pc: int, n: int, first_slot_delta=None) -> DynamicCache:
    """A fresh cache of the first ``Pc`` slots of ``cache`` (the z-free pass's), each row repeated
    ``n`` times consecutively; ``first_slot_delta`` (a (key delta, value delta) per layer, each
    (B * n, heads, 1, head_dim)) is added to slot 0 (the memory route)."""
    data = []
    for i, (k, v) in enumerate(layer_kv(cache)):
        k, v = k[:, :, :Pc], v[:, :, :Pc]  # views: the suffix pass's update concatenates into new tensors
        if n > 1:
            k, v = k.repeat_interleave(n, 0), v.repeat_interleave(n, 0)
        if first_slot_delta is not None:
            dk, dv = first_slot_delta[i]
            dk, dv = dk.to(k.dtype), dv.to(v.dtype)  # the cache's dtype (a bfloat16-stored body's)
            k, v = torch.cat([k[:, :, :1] + dk, k[:, :, 1:]], 2), torch.cat([v[:, :, :1] + dv, v[:, :, 1:]], 2)
        data.append((k, v))
    return DynamicCache(ddp_cache_data=data)


def prefix_slots_mask(batch: Batch, Pc: int) -> Bool[torch.Tensor, "batch slots"]:
    """(B, Pc): True at the cached slots of a row's own x-prefix (masks its y tokens and padding)."""
    return torch.arange(Pc, device=batch.input_ids.device)[None, :] < (batch.prefix_len - 1)[:, None]


def gather_suffix(full: Float[torch.Tensor, "batch n seq d_model"], pos: Int[torch.Tensor, "batch pos"]
                  ) -> Float[torch.Tensor, "batch n pos d_model"]:
    """The positions ``pos`` (B, L) of each row out of a full pass's hidden states (B, n, T, D)."""
    B, n, T, D = full.shape
    return full.gather(2, pos.clamp_max(T - 1)[:, None, :, None].expand(B, n, pos.shape[1], D))


def decoder_hidden_suffix(backbone, batch: Batch, cache, latents: Float[torch.Tensor, "batch n d_model"],
                          shared_prefix: str | None = None) -> tuple[Float[torch.Tensor, "batch n pos d_model"], Bool[torch.Tensor, "batch pos"]]:
    """Decoder hidden states over the y-region for each latent vector, reusing ``cache`` (the z-free
    pass's key/value cache) for the x-prefix.

    Returns (hidden (B, n, L, D) at the positions predicting S, valid (B, L)), L = max |S|. Each
    row's suffix starts at its separator (position prefix_len - 1) with explicit position ids and
    reads ``batch.decoder_inputs`` (word dropout; the cached prefix is the same either way);
    cache slots beyond a row's own prefix (its y tokens, or padding) are masked. Equals
    ``decoder_hidden_full`` at those positions (tests/test_models.py, tests/test_architectures.py).
    ``shared_prefix`` (default: the module's ``SHARED_PREFIX``) "auto" takes the full pass (same
    layout) when ``shared_prefix_problem`` finds the cache not exactly reusable, warning once
    per model class; "on" raises ValueError then; "off" always takes the full pass
    (``suffix_full_pass_reason``).
    """
    B, T = batch.input_ids.shape
    n = latents.shape[1]
    Pc, L, pos, valid = suffix_layout(batch)
    if suffix_full_pass_reason(backbone, batch, cache, Pc + L, shared_prefix):
        return gather_suffix(decoder_hidden_full(backbone, batch, latents), pos), valid  # (B, n, L, D)
    ids = batch.decoder_inputs.gather(1, pos.clamp_max(T - 1))  # the y-region as the decoder reads it
    emb = backbone.get_input_embeddings()(ids)  # (B, L, D)
    x = emb[:, None] + latents.to(emb.dtype)[:, :, None, :]  # (B, n, L, D), the body's dtype
    mask = torch.cat([prefix_slots_mask(batch, Pc), valid], 1).long().repeat_interleave(n, 0)  # (B*n, Pc + L)
    h = backbone.base_model(inputs_embeds=x.reshape(B * n, L, -1), attention_mask=mask,
                            position_ids=pos.repeat_interleave(n, 0),
                            use_cache=True, **{CACHE_KW: prefix_cache(cache, Pc, n)}).last_hidden_state
    return h.reshape(B, n, L, -1), valid


def suffix_target_logprobs(backbone, batch: Batch, hz: Float[torch.Tensor, "batch n pos d_model"],
                           valid: Bool[torch.Tensor, "batch pos"], with_distributions: bool = False):
    """Per-token log p(y_t | x, y_<t, u_s) in nats from ``decoder_hidden_suffix``'s output, laid out
    as (B, n, T) with zeros off the supervised positions (the layout of ``target_logprobs``); the
    output head runs in float32 on the supervised positions only, at most a chunk of logits at a time
    (``zfree.models.head_chunks.head_token_logprobs``: memory bounded by the chunk, not by n or V).
    With ``with_distributions`` also returns the full next-token log-distributions (B, n, L, V)
    (zeros where not ``valid``); that path is unchunked (its output is rows x vocab anyway)."""
    B, n, L, _ = hz.shape
    T = batch.input_ids.shape[1]
    sel = valid[:, None].expand(B, n, L)
    tgt_pos = (batch.prefix_len[:, None] + torch.arange(L, device=hz.device)[None, :]).clamp_max(T - 1)
    tokens = batch.input_ids.gather(1, tgt_pos)[:, None].expand(B, n, L)[sel]  # (N,), (b, s, j) order
    if with_distributions:  # the full distributions are (N, V) anyway: unchunked
        logp_all = torch.log_softmax(exact_logits_from_hidden(backbone, hz[sel]), -1)  # (N, V)
        lp = logp_all.gather(-1, tokens[:, None]).squeeze(-1)
    else:
        lp = head_token_logprobs(backbone, hz[sel], tokens)  # (N,), at most a chunk of logits at once
    tlp = hz.new_zeros((B, n, T), dtype=lp.dtype)  # float32 (float64 for a float64 model)
    tlp[:, :, 1:][batch.target_mask[:, 1:][:, None].expand(B, n, T - 1)] = lp  # same (b, s, position) order
    if not with_distributions:
        return tlp, None
    dist = logp_all.new_zeros((B, n, L, logp_all.shape[-1]))
    dist[sel] = logp_all
    return tlp, dist


def full_target_logprobs(backbone, batch: Batch, hz: Float[torch.Tensor, "batch n seq d_model"],
                         with_distributions: bool = False):
    """``suffix_target_logprobs`` for ``decoder_hidden_full``'s output (B, n, T, D)."""
    B, n, T, _ = hz.shape
    predict = batch.target_mask[:, 1:][:, None].expand(B, n, T - 1)
    tokens = batch.input_ids[:, 1:][:, None].expand(B, n, T - 1)[predict]
    if not with_distributions:
        lp = head_token_logprobs(backbone, hz[:, :, :-1][predict], tokens)  # (N,), chunked
        tlp = hz.new_zeros((B, n, T), dtype=lp.dtype)  # float32 (float64 for a float64 model)
        tlp[:, :, 1:][predict] = lp
        return tlp, None
    logp_all = torch.log_softmax(exact_logits_from_hidden(backbone, hz[:, :, :-1][predict]), -1)  # unchunked
    tlp = hz.new_zeros((B, n, T), dtype=logp_all.dtype)
    tlp[:, :, 1:][predict] = logp_all.gather(-1, tokens[:, None]).squeeze(-1)
    P = batch.max_lengths()[1]
    pos_mask = torch.arange(P, device=hz.device)[None, :] < batch.target_len[:, None]  # (B, P)
    dist = logp_all.new_zeros((B, n, P, logp_all.shape[-1]))
    dist[pos_mask[:, None].expand(B, n, P)] = logp_all
    return tlp, dist
