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

Packed rows (issue 56): a training step that needs only the x-prefix's z-free states (the router's
separator state) and the n decoder passes over the y-region can run them as one forward over the batch's
rows concatenated without padding (``packed_prefix_suffix``): each row's prefix, then its n y-blocks, with
position ids restarting per row, a block mask that lets a block read its own row's prefix (without the
z-free separator, as the suffix pass reads the cache) and itself causally, and attention per row segment
(``segment_attention``). It forwards sum_b P_b + n |S_b| tokens instead of B (P_max + n L_max) and equals
the padded passes within float rounding (tests/test_packing.py); ``packing_problem`` says where it is not
taken (``PACKING``: "auto" packs on the CPU only, where it was measured faster).
"""

from __future__ import annotations

import warnings

import numpy as np
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


# ------------------------------------------------------------------------------------- packed rows

#: ``packing`` modes of the decoder's prefix + suffix passes (``packing_problem``): "auto" packs on the CPU
#: (measured faster there: analysis/benchmarks/bench_step_flops.py), "on" wherever supported, "off" never
PACKING_MODES = {"auto": "packed rows on the CPU where supported, else the padded passes",
                 "on": "packed rows wherever supported, else the padded passes",
                 "off": "always the padded passes"}
PACKING = "auto"  # module-level default; set with set_packing

#: model types whose packed pass is tested equal to the padded passes (tests/test_packing.py): a 4D mask
#: used as given and explicit position ids. Others take the padded passes
PACKED_MODEL_TYPES = frozenset({"llama", "gpt2", "qwen2", "qwen3", "mistral", "phi3", "gemma", "gemma2",
                                "gemma3_text", "granite", "cohere", "gpt_neox", "opt"})


def set_packing(mode: str) -> str:
    """Set the module-wide packing mode (``PACKING_MODES``); returns the previous one. ValueError listing them."""
    global PACKING
    if mode not in PACKING_MODES:
        raise ValueError(f"packing={mode!r}: expected one of {sorted(PACKING_MODES)}")
    prev, PACKING = PACKING, mode
    return prev


def packing_problem(backbone, batch: Batch, mode: str | None = None) -> str | None:
    """Why the packed pass (``packed_prefix_suffix``) is not taken for ``batch`` under ``mode`` (default: the
    module's ``PACKING``), or None to take it: "off"; "auto" off the CPU; a model type not in
    ``PACKED_MODEL_TYPES``; a compiled body (``compile: true``); attention other than SDPA
    (``segment_attention`` calls SDPA); a sliding window shorter than a row (the 4D mask is applied as given, so a
    window must not bite: prefix + |S| <= window). Host ints only (``Batch.host_lengths``)."""
    mode = PACKING if mode is None else mode
    if mode not in PACKING_MODES:
        raise ValueError(f"packing={mode!r}: expected one of {sorted(PACKING_MODES)}")
    if mode == "off":
        return "off"
    if mode == "auto" and batch.input_ids.device.type != "cpu":
        return "not on the CPU"
    mt = getattr(backbone.config, "model_type", None)
    if mt not in PACKED_MODEL_TYPES:
        return f"model type {mt!r} not tested packed"
    if getattr(backbone.base_model, "_compiled_call_impl", None) is not None:
        return "the body is compiled (every batch's packed layout and segments would retrace it)"
    if not (_SEGMENT_READY and _sdpa_configs(backbone)):
        return "attention is not SDPA (packing pays by attention per row segment)"
    window = sliding_window_of(backbone.config)
    if window is not None:
        P, S = batch.host_lengths()
        if max(p + s for p, s in zip(P, S)) > window:
            return f"sliding window {window} shorter than a row"
    return None


def pack_bins(lengths: list[int], capacity: int) -> list[list[int]]:
    """Rows into packed sequences of at most ``capacity`` tokens (a row longer than it gets one alone):
    first fit, longest rows first; each bin lists its rows in placement order. Host ints only."""
    bins: list[list[int]] = []
    room: list[int] = []
    for b in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for i, r in enumerate(room):
            if lengths[b] <= r:
                bins[i].append(b)
                room[i] -= lengths[b]
                break
        else:
            bins.append([b])
            room.append(capacity - lengths[b])
    return bins


def packed_layout(prefix_len, target_len, n: int, capacity: int | None = None):
    """The host-side layout of a packed prefix + n suffix pass (``packed_prefix_suffix``): per row b a
    segment of P_b prefix tokens then n blocks of S_b tokens. Returns (bins, starts, seg): ``bins`` the rows
    of each packed sequence (``pack_bins`` at ``capacity``; None: all rows in one), ``starts[b]`` (bin,
    offset of its segment), ``seg[b]`` its tokens."""
    seg = [p + n * s for p, s in zip(prefix_len, target_len)]
    bins = pack_bins(seg, sum(seg) if capacity is None else capacity)
    starts = {}
    for i, rows in enumerate(bins):
        off = 0
        for b in rows:
            starts[b] = (i, off)
            off += seg[b]
    return bins, starts, seg


def segment_allowed(P: int, S: int, n: int) -> np.ndarray:
    """(P + nS, P + nS) bool: which keys each query of one row's packed segment attends to (prefix causal;
    block s: the prefix without its z-free separator, then its own block causally)."""
    m = P + n * S
    allow = np.zeros((m, m), dtype=bool)
    allow[:P, :P] = np.tril(np.ones((P, P), dtype=bool))
    for s in range(n):
        q = P + s * S
        allow[q:q + S, :P - 1] = True
        allow[q:q + S, q:q + S] = np.tril(np.ones((S, S), dtype=bool))
    return allow


#: the segments of the packed forward in flight (``segment_attention``): per bin, [(start, end, bool mask)]
_SEGMENTS: list | None = None
SEGMENT_ATTENTION = "zfree_segments"


def segment_attention(module, query, key, value, attention_mask, **kwargs):
    """An attention function (transformers' ``AttentionInterface``) for the packed forward: SDPA over each
    row's segment alone (its own mask, ``segment_allowed``), so attention costs sum_b seg_b^2, not the
    packed sequence's square; a packed sequence's tail (padding) gets zeros. query (bins, heads, T, d),
    key / value (bins, kv heads, T, d); returns (bins, T, heads, d), None as ``sdpa_attention_forward``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    outs = []
    for i, segs in enumerate(_SEGMENTS):
        pieces = [sdpa_attention_forward(module, query[i:i + 1, :, a:b], key[i:i + 1, :, a:b],
                                         value[i:i + 1, :, a:b], m, **kwargs)[0] for a, b, m in segs]
        tail = query.shape[2] - segs[-1][1]
        if tail:
            pieces.append(query.new_zeros((1, tail, query.shape[1], value.shape[-1])))
        outs.append(torch.cat(pieces, 1))
    return torch.cat(outs, 0), None


def _register_segment_attention() -> bool:
    try:
        from transformers import AttentionInterface
    except ImportError:  # pragma: no cover - transformers without the interface: the dense mask serves
        return False
    AttentionInterface.register(SEGMENT_ATTENTION, segment_attention)
    return True


_SEGMENT_READY = _register_segment_attention()


def _sdpa_configs(backbone) -> list:
    """The distinct config objects of ``backbone``'s modules whose attention is SDPA (the ones
    ``segment_attention`` can stand in for: it calls SDPA per segment)."""
    seen = {}
    for mod in backbone.modules():
        c = getattr(mod, "config", None)
        if c is not None and id(c) not in seen and getattr(c, "_attn_implementation", None) == "sdpa":
            seen[id(c)] = c
    return list(seen.values())


def packed_prefix_suffix(backbone, batch: Batch, latents: Float[torch.Tensor, "batch n d_model"],
                         capacity: int | None = None, segments: bool = True):
    """The z-free x-prefix pass and the n suffix passes of ``zfree_pass(prefix_only=True)`` +
    ``decoder_hidden_suffix`` in one forward over packed rows (no padding tokens but a packed sequence's
    tail). Row b's segment is its prefix [bos] x sep (positions 0 .. P_b - 1, z-free) followed by n blocks,
    block s the separator and y_0 .. y_{|S|-2} (positions P_b - 1 .. P_b + |S_b| - 2, reading
    ``batch.decoder_inputs``) with ``latents[b, s]`` added; a block attends to its row's prefix without the
    z-free separator (the cached slots of the suffix pass) and causally to itself, a prefix position
    causally to its prefix (``segment_allowed``): a 4D additive mask (the model applies a 4D mask as given)
    and explicit position ids. Rows go to packed sequences of at most ``capacity`` tokens (``packed_layout``;
    None: one). ``segments`` (default) and an SDPA model: attention runs per row segment
    (``segment_attention``: sum_b seg_b^2 scores); else dense over each packed sequence under the mask (every
    score computed: on SmolLM2 on one CPU thread that ate the saving, 0.89x the padded passes' time for a
    control step and 1.0x for K = 4, against 0.75x and 0.76x by segments; ``packing_problem`` therefore asks
    for SDPA, and the dense mask serves the tests and any layer the segments do not reach).
    Returns (prefix hidden (B, P_max, D), zero past each row's prefix; hidden (B, n, L, D) at the positions
    predicting S, zero where not valid; valid (B, L)), the layouts of the padded passes. Reads the lengths
    on the host (``Batch.host_lengths``). Callers check ``packing_problem`` first."""
    global _SEGMENTS
    B, T = batch.input_ids.shape
    n = latents.shape[1]
    P_list, S_list = batch.host_lengths()
    P_max, L = max(P_list), max(S_list)
    configs = _sdpa_configs(backbone) if segments and _SEGMENT_READY else []
    seg_mode = bool(configs)
    bins, starts, seg = packed_layout(P_list, S_list, n, capacity)
    dev = batch.input_ids.device
    nb = len(bins)
    Tp = max(sum(seg[b] for b in rows) for rows in bins)
    pos = np.zeros((nb, Tp), dtype=np.int64)
    blk = np.full((nb, Tp), -2, dtype=np.int64)  # -1 prefix, s >= 0 block s, -2 a packed sequence's tail
    src = np.zeros((nb, Tp), dtype=np.int64)  # flat index (b * T + t) of the token each slot reads
    lat_idx = np.zeros((nb, Tp), dtype=np.int64)  # flat index (b * n + s) of the latent a block slot adds
    allow = np.zeros((nb, Tp, Tp), dtype=bool)
    pre_src, pre_dst, suf_src, suf_dst = [], [], [], []
    allowed = {}
    for b in range(B):
        i, o = starts[b]
        P, S = P_list[b], S_list[b]
        pos[i, o:o + P] = np.arange(P)
        blk[i, o:o + P] = -1
        src[i, o:o + P] = b * T + np.arange(P)
        pre_src.append(i * Tp + o + np.arange(P))
        pre_dst.append(b * P_max + np.arange(P))
        for s in range(n):
            q = o + P + s * S
            pos[i, q:q + S] = P - 1 + np.arange(S)
            blk[i, q:q + S] = s
            src[i, q:q + S] = b * T + P - 1 + np.arange(S)
            lat_idx[i, q:q + S] = b * n + s
            suf_src.append(i * Tp + q + np.arange(S))
            suf_dst.append((b * n + s) * L + np.arange(S))
        allowed[b] = segment_allowed(P, S, n)
        allow[i, o:o + seg[b], o:o + seg[b]] = allowed[b]
    tail = blk == -2
    bi, ti = np.nonzero(tail)
    allow[bi, ti, ti] = True  # a tail slot sees itself (no empty softmax row)
    t = lambda a: torch.from_numpy(a).to(dev)  # noqa: E731
    emb_layer = backbone.get_input_embeddings()
    in_block = t(blk >= 0)
    flat = t(src)
    ids = torch.where(in_block, batch.decoder_inputs.reshape(-1)[flat], batch.input_ids.reshape(-1)[flat])
    emb = emb_layer(ids)  # (nb, Tp, D)
    lat = latents.reshape(B * n, -1).to(emb.dtype)[t(lat_idx)]  # (nb, Tp, D)
    x = emb + in_block[..., None].to(emb.dtype) * lat
    mask = torch.zeros((nb, 1, Tp, Tp), dtype=emb.dtype, device=dev)
    mask.masked_fill_(~t(allow)[:, None], torch.finfo(emb.dtype).min)
    previous = [c._attn_implementation_internal for c in configs]
    if seg_mode:
        _SEGMENTS = [[(starts[b][1], starts[b][1] + seg[b], t(allowed[b])[None, None]) for b in rows] for rows in bins]
        for c in configs:
            c._attn_implementation_internal = SEGMENT_ATTENTION
    try:
        h = backbone.base_model(inputs_embeds=x, attention_mask=mask, position_ids=t(pos),
                                use_cache=False).last_hidden_state  # (nb, Tp, D)
    finally:
        for c, prev in zip(configs, previous):
            c._attn_implementation_internal = prev
        _SEGMENTS = None
    D = h.shape[-1]
    hf = h.reshape(nb * Tp, D)
    cat = lambda a: t(np.concatenate(a))  # noqa: E731
    h0 = hf.new_zeros((B * P_max, D)).index_copy(0, cat(pre_dst), hf[cat(pre_src)]).reshape(B, P_max, D)
    hz = hf.new_zeros((B * n * L, D)).index_copy(0, cat(suf_dst), hf[cat(suf_src)]).reshape(B, n, L, D)
    valid = torch.arange(L, device=dev)[None, :] < batch.target_len[:, None]
    return h0, hz, valid
