"""Packed rows (issue 56, item 2): a training step that needs only the x-prefix's z-free states (the router's
separator state) and the n decoder passes over the y-region (``zfree.models.injection``: the prefix pass,
then the suffix passes on its key/value cache, each padded to the batch's longest) runs them as one forward
over the batch's rows concatenated without padding (``packed_prefix_suffix``): each row's prefix, then its n
y-blocks, with position ids restarting per row, a block mask that lets a block read its own row's prefix
(without the z-free separator, as the suffix pass reads the cache) and itself causally, and attention per row
segment (``segment_attention``). It forwards sum_b P_b + n |S_b| tokens instead of B (P_max + n L_max) and
equals the padded passes within float rounding (tests/test_packing.py); ``packing_problem`` says where it is
not taken (``PACKING``: "auto" packs on the CPU only, where it was measured faster:
analysis/benchmarks/bench_step_flops.py). The hard-EM step, whose decoded value is known only after its
E-step, packs the prefix once (``packed_prefix``) and its blocks in two passes reading its keys and values
(``packed_suffix``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float

from zfree.data.batching import Batch
from zfree.models.kv_cache import sliding_window_of

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


#: the packed prefix of the forward in flight (``packed_prefix`` records its keys and values, ``packed_suffix``
#: reads them): a ``PackedPrefix`` or None
_PREFIX: "PackedPrefix | None" = None


def segment_attention(module, query, key, value, attention_mask, **kwargs):
    """An attention function (transformers' ``AttentionInterface``) for the packed forward: SDPA over each
    row's segment alone (its own mask, ``segment_allowed``), so attention costs sum_b seg_b^2, not the
    packed sequence's square; a packed sequence's tail (padding) gets zeros. query (bins, heads, T, d),
    key / value (bins, kv heads, T, d); returns (bins, T, heads, d), None as ``sdpa_attention_forward``.
    With a ``PackedPrefix`` in flight (``_PREFIX``): recording, each call (one per layer, in order) keeps its
    keys and values; reading, row j's segment also attends to its row's recorded prefix slots (``packed_suffix``;
    its mask then covers those keys first)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    pre = _PREFIX
    if pre is not None:
        if pre.recording:
            pre.kv.append((key, value))
        else:
            pk, pv = pre.kv[pre.calls]
            pre.calls += 1
            key = [torch.cat([pk[:, :, pa:pb], key[:, :, a:b]], 2) for (pa, pb), (a, b, _) in zip(pre.keys, _SEGMENTS[0])]
            value = [torch.cat([pv[:, :, pa:pb], value[:, :, a:b]], 2) for (pa, pb), (a, b, _) in zip(pre.keys, _SEGMENTS[0])]
            pieces = [sdpa_attention_forward(module, query[:, :, a:b], k, v, m, **kwargs)[0]
                      for k, v, (a, b, m) in zip(key, value, _SEGMENTS[0])]
            return torch.cat(pieces, 1), None  # one bin, no tail
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


def packed_indices(P_list, S_list, T: int, n: int, capacity: int | None = None) -> dict:
    """The host-side index maps of a packed forward (``packed_prefix_suffix``) for rows of prefix lengths
    ``P_list`` and |S| ``S_list`` in a batch of width T, n blocks a row: ``pos`` (bins, Tp) position ids,
    ``blk`` (-1 prefix, s >= 0 block s, -2 a packed sequence's tail), ``src`` the flat index b * T + t of the
    token each slot reads, ``lat`` the flat index b * n + s of the latent a block slot adds, ``allow``
    (bins, Tp, Tp) the mask, ``pre`` / ``suf`` (packed slots, their flat places in (B, P_max) / (B, n, L)),
    ``segments`` per bin [(start, end, the row's ``segment_allowed``)]."""
    B, P_max, L = len(P_list), max(P_list), max(S_list)
    bins, starts, seg = packed_layout(P_list, S_list, n, capacity)
    nb, Tp = len(bins), max(sum(seg[b] for b in rows) for rows in bins)
    pos, src, lat = (np.zeros((nb, Tp), dtype=np.int64) for _ in range(3))
    blk = np.full((nb, Tp), -2, dtype=np.int64)
    allow = np.zeros((nb, Tp, Tp), dtype=bool)
    pre_src, pre_dst, suf_src, suf_dst, allowed = [], [], [], [], {}
    for b in range(B):
        i, o = starts[b]
        P, S = P_list[b], S_list[b]
        pos[i, o:o + P], blk[i, o:o + P], src[i, o:o + P] = np.arange(P), -1, b * T + np.arange(P)
        pre_src.append(i * Tp + o + np.arange(P))
        pre_dst.append(b * P_max + np.arange(P))
        for s in range(n):
            q = o + P + s * S
            pos[i, q:q + S], blk[i, q:q + S] = P - 1 + np.arange(S), s
            src[i, q:q + S], lat[i, q:q + S] = b * T + P - 1 + np.arange(S), b * n + s
            suf_src.append(i * Tp + q + np.arange(S))
            suf_dst.append((b * n + s) * L + np.arange(S))
        allowed[b] = segment_allowed(P, S, n)
        allow[i, o:o + seg[b], o:o + seg[b]] = allowed[b]
    bi, ti = np.nonzero(blk == -2)
    allow[bi, ti, ti] = True  # a tail slot sees itself (no empty softmax row)
    return dict(pos=pos, blk=blk, src=src, lat=lat, allow=allow,
                pre=(np.concatenate(pre_src), np.concatenate(pre_dst)), suf=(np.concatenate(suf_src), np.concatenate(suf_dst)),
                segments=[[(starts[b][1], starts[b][1] + seg[b], allowed[b]) for b in rows] for rows in bins])


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
    on the host (``Batch.host_lengths``; the index maps: ``packed_indices``). Callers check ``packing_problem`` first."""
    B, T = batch.input_ids.shape
    n = latents.shape[1]
    P_list, S_list = batch.host_lengths()
    P_max, L = max(P_list), max(S_list)
    configs = _sdpa_configs(backbone) if segments and _SEGMENT_READY else []
    ix = packed_indices(P_list, S_list, T, n, capacity)
    dev = batch.input_ids.device
    t = lambda a: torch.from_numpy(a).to(dev)  # noqa: E731
    in_block, flat = t(ix["blk"] >= 0), t(ix["src"])
    ids = torch.where(in_block, batch.decoder_inputs.reshape(-1)[flat], batch.input_ids.reshape(-1)[flat])
    emb = backbone.get_input_embeddings()(ids)  # (bins, Tp, D)
    x = emb + in_block[..., None].to(emb.dtype) * latents.reshape(B * n, -1).to(emb.dtype)[t(ix["lat"])]
    h = _segment_forward(backbone, x, t(ix["pos"]), t(ix["allow"]), ix["segments"], configs)  # (bins, Tp, D)
    hf = h.reshape(-1, h.shape[-1])
    D = hf.shape[-1]
    (ps, pd), (ss, sd) = ix["pre"], ix["suf"]
    h0 = hf.new_zeros((B * P_max, D)).index_copy(0, t(pd), hf[t(ps)]).reshape(B, P_max, D)
    hz = hf.new_zeros((B * n * L, D)).index_copy(0, t(sd), hf[t(ss)]).reshape(B, n, L, D)
    valid = torch.arange(L, device=dev)[None, :] < batch.target_len[:, None]
    return h0, hz, valid


def _segment_forward(backbone, x: torch.Tensor, pos: torch.Tensor, allow: torch.Tensor, segments: list,
                     configs: list, prefix: "PackedPrefix | None" = None) -> torch.Tensor:
    """The body over packed inputs ``x`` (bins, Tp, D) at position ids ``pos`` under the 4D additive mask of
    ``allow`` (bins, Tp, Tp), with attention per row segment (``segment_attention``; ``segments`` per bin
    [(start, end, bool mask)] as numpy) where ``configs`` (the SDPA configs to switch) is not empty, and
    ``prefix`` in flight (recorded or read). The model's attention settings and the module's state are
    restored after. Returns the last hidden states (bins, Tp, D)."""
    global _SEGMENTS, _PREFIX
    dev = x.device
    mask = torch.zeros((allow.shape[0], 1, *allow.shape[1:]), dtype=x.dtype, device=dev)
    mask.masked_fill_(~allow[:, None], torch.finfo(x.dtype).min)
    previous = [c._attn_implementation_internal for c in configs]
    if configs:
        _SEGMENTS = [[(a, b, torch.from_numpy(m).to(dev)[None, None]) for a, b, m in segs] for segs in segments]
        _PREFIX = prefix
        for c in configs:
            c._attn_implementation_internal = SEGMENT_ATTENTION
    try:
        return backbone.base_model(inputs_embeds=x, attention_mask=mask, position_ids=pos,
                                   use_cache=False).last_hidden_state
    finally:
        for c, prev in zip(configs, previous):
            c._attn_implementation_internal = prev
        _SEGMENTS = _PREFIX = None


@dataclass
class PackedPrefix:
    """The x-prefix pass over packed rows (``packed_prefix``), read by ``packed_suffix`` in place of a cache:
    ``kv`` each attention layer's (keys, values) (1, kv heads, sum_b P_b, head dim), in call order, with their
    graph; ``keys`` row b's slots without the z-free separator, [start_b, start_b + P_b - 1) (the cache slots
    the padded suffix pass reads); ``prefix_len`` the rows' P_b."""

    kv: list
    keys: list[tuple[int, int]]
    prefix_len: tuple[int, ...]
    recording: bool = True
    calls: int = 0


def _segment_configs(backbone) -> list:
    """``_sdpa_configs``, or ValueError without (the prefix reaches a block only through ``segment_attention``)."""
    configs = _sdpa_configs(backbone) if _SEGMENT_READY else []
    if not configs:
        raise ValueError(f"{type(backbone).__name__}: the packed prefix and suffix passes need SDPA attention")
    return configs


def packed_prefix(backbone, batch: Batch) -> tuple[Float[torch.Tensor, "batch P_max d_model"], PackedPrefix]:
    """The z-free x-prefix pass (``zfree_pass(prefix_only=True)``) over packed rows, for the hard-EM step
    (``DiscreteCVAE.forward_selected``): each row's [bos] x sep (positions 0 .. P_b - 1) in one sequence of
    sum_b P_b tokens, causal per row segment, recording every layer's keys and values (``PackedPrefix``) for
    ``packed_suffix``: the K no-grad E-step blocks and then the decoded value's block with gradient read them
    as the padded passes read the cache, sum_b P_b + K e_b + |S_b| tokens (the ideal; e_b = min(|S_b|, e)).
    Not taken: (a) ``packed_prefix_suffix`` without gradient over prefix + K E-step blocks, then (b) with
    gradient over prefix + the decoded block, the prefix twice. On the e2e preset's batches
    (bench_step_flops.py: SmolLM2, batch 8, K 4, e 3; mean P_b 35.9 / 42.3 / 38.3, P_max 47 / 48 / 48, mean
    |S_b| 24.0 / 28.5 / 31.9, L_max 36 / 40 / 45) decoder-layer tokens a row are 95 / 100 / 105 padded,
    107.8 / 125.0 / 120.4 by (a) + (b) (the prefix again costs more than the padding it saves), 71.9 / 82.8 /
    82.1 here. With a pass with gradient weighted 3 (a trained body's backward) or 2 (LoRA's frozen body),
    a no-grad one 1: (a) + (b) 0.87 / 0.97 / 0.90 (x3), 0.94 / 1.04 / 0.96 (x2) of padded, this 0.73 / 0.81
    / 0.76 and 0.74 / 0.82 / 0.77; packing (b) alone after a padded no-grad prefix and E-step costs more
    than (a) + (b). Returns (hidden (B, P_max, D), zero past each row's prefix; the ``PackedPrefix``).
    ValueError without SDPA attention (callers check ``packing_problem``); RuntimeError where not every
    layer's attention went through ``segment_attention``."""
    B, T = batch.input_ids.shape
    P_list, _ = batch.host_lengths()
    P_max, configs = max(P_list), _segment_configs(backbone)
    starts = np.cumsum([0, *P_list[:-1]]).tolist()
    allowed = [np.tril(np.ones((P, P), dtype=bool)) for P in P_list]
    allow = np.zeros((1, sum(P_list), sum(P_list)), dtype=bool)
    for o, P, m in zip(starts, P_list, allowed):
        allow[0, o:o + P, o:o + P] = m
    t = lambda parts: torch.from_numpy(np.concatenate(parts)).to(batch.input_ids.device)  # noqa: E731
    x = backbone.get_input_embeddings()(batch.input_ids.reshape(-1)[t([b * T + np.arange(P) for b, P in enumerate(P_list)])])
    prefix = PackedPrefix([], [(o, o + P - 1) for o, P in zip(starts, P_list)], tuple(P_list))
    h = _segment_forward(backbone, x[None], t([np.arange(P) for P in P_list])[None], t([allow]),
                         [list(zip(starts, [o + P for o, P in zip(starts, P_list)], allowed))], configs, prefix)
    prefix.recording = False
    if len(prefix.kv) != backbone.config.get_text_config().num_hidden_layers:
        raise RuntimeError(f"{type(backbone).__name__}: not every layer's attention went through segment_attention")
    dst = t([b * P_max + np.arange(P) for b, P in enumerate(P_list)])
    return h.new_zeros((B * P_max, h.shape[-1])).index_copy(0, dst, h[0]).reshape(B, P_max, -1), prefix


def packed_suffix(backbone, batch: Batch, prefix: PackedPrefix, latents: Float[torch.Tensor, "batch n d_model"]
                  ) -> tuple[Float[torch.Tensor, "batch n pos d_model"], torch.Tensor]:
    """``decoder_hidden_suffix`` over packed rows reading ``prefix`` (``packed_prefix`` of the same rows) in
    place of the cache: row b's n blocks one after the other, block s the separator and y_0 .. y_{|S_b|-2}
    (``batch.decoder_inputs``, positions P_b - 1 .. P_b + |S_b| - 2) plus ``latents[b, s]``, attending to its
    row's prefix slots without the separator and causally to itself (``segment_attention``). ``batch`` may cut
    S (``Batch.first_targets``). Forwards sum_b n |S_b| tokens. Returns (hidden (B, n, L, D) at the positions
    predicting S, zero where not valid; valid (B, L)), the padded pass's layout. ValueError for prefix lengths
    other than ``prefix``'s; RuntimeError where the layers' attention calls do not match the prefix's."""
    B, T = batch.input_ids.shape
    n = latents.shape[1]
    P_list, S_list = batch.host_lengths()
    if tuple(P_list) != prefix.prefix_len:
        raise ValueError("packed_suffix: the batch's prefix lengths are not the packed prefix's")
    L, configs = max(S_list), _segment_configs(backbone)
    starts = np.cumsum([0, *[n * S for S in S_list[:-1]]]).tolist()
    pos, src, lat, dst, segments = [], [], [], [], []
    allow = np.zeros((1, n * sum(S_list), n * sum(S_list)), dtype=bool)
    for b, (o, P, S) in enumerate(zip(starts, P_list, S_list)):
        own = np.kron(np.eye(n, dtype=bool), np.tril(np.ones((S, S), dtype=bool)))  # each block causally
        allow[0, o:o + n * S, o:o + n * S] = own
        segments.append((o, o + n * S, np.concatenate([np.ones((n * S, P - 1), dtype=bool), own], 1)))
        pos += [P - 1 + np.arange(S)] * n
        src += [b * T + P - 1 + np.arange(S)] * n
        lat += [np.full(S, b * n + s) for s in range(n)]
        dst += [(b * n + s) * L + np.arange(S) for s in range(n)]
    t = lambda parts: torch.from_numpy(np.concatenate(parts)).to(batch.input_ids.device)  # noqa: E731
    emb = backbone.get_input_embeddings()(batch.decoder_inputs.reshape(-1)[t(src)])  # (sum n S, D)
    prefix.calls = 0
    h = _segment_forward(backbone, (emb + latents.reshape(B * n, -1).to(emb.dtype)[t(lat)])[None], t(pos)[None],
                         t([allow]), [segments], configs, prefix)
    if prefix.calls != len(prefix.kv):
        raise RuntimeError(f"{type(backbone).__name__}: {prefix.calls} attention calls read a prefix of {len(prefix.kv)}")
    hz = h.new_zeros((B * n * L, h.shape[-1])).index_copy(0, t(dst), h[0]).reshape(B, n, L, -1)
    return hz, torch.arange(L, device=h.device)[None, :] < batch.target_len[:, None]
