"""Injection routes: where the latent vector u enters the decoder p(y | x, z) (docs/concepts/problem.md#models; issue 55).

Both CVAEs turn a latent value into one vector u in R^d_model (discrete: the embedding e_k; continuous:
W z) and hand it to a route, chosen by ``ModelConfig.injection``:

  embedding  u added to the input embedding at the separator and every position predicting a y token
             (the embedding scheme of Optimus, Li et al. 2020; the original path, ``zfree.models.injection``).
  mid        u added to the residual stream entering decoder layer n_layer // 2 at the same positions
             (a forward pre-hook on that layer; the Free Transformer, Fleuret 2025, injects z at
             mid-depth). With one layer that is layer 0's input: the embedding path again.
  memory     u projected to one key/value per layer that the separator and the y positions attend
             to (the memory scheme of Optimus, Li et al. 2020; LangVAE passes z as past_key_values).
  prefix     one soft token s + u inserted before the separator (prompt tuning, Lester et al. 2021):
             s is a latent-independent learned vector, the latent value a delta on it.

Step 0 (u = 0 for every value: e_k and W start at zero):
  embedding, mid: u = 0 is added, so the decoder is the base model bit for bit.
  memory: an *extra* slot cannot be exact and learn at once: exactness needs its softmax weight to be
    exactly 0 (a zero value still takes mass from the other positions), and then no gradient reaches
    its key or value. So the memory slot *takes the place* of the first position's key/value (the
    attention sink, which every row has) for the separator and y queries: it is that position's
    z-free key/value plus (dk_l, dv_l) = M_l u, M a random (trainable) projection. At u = 0 the
    slot is an exact copy, so every query sees the same keys and values as the base model; the
    gradient reaches u through the first position's attention weight, which is > 0. x queries keep
    the original entry, so the x-prefix stays z-free and its cache shareable. Needs prefix_len >= 2
    (a token before the separator); at step 0, M u = 0 whatever M is, and dL/du = M^T dL/d(dk, dv) != 0.
  prefix: a soft token changes the context, so no CVAE with one equals the base model. It is exact
    against its own reference: the base model reading [bos] x, s_0, sep, y, with s_0 the initial
    shared soft token (the mean input embedding of the vocabulary, ``initial_soft_token``); every value
    decodes exactly that at step 0, and u = 0 is the zero-initialised delta (tests/test_injection_routes.py).
    So a prefix run's z-free reference (b, b_t, c_base: every weighting's, and rho's) is the base model
    reading s_0, scored once at run start by ``zfree.reference.prefix`` (tests/test_prefix_reference.py).

Equal capacity (``ModelConfig.latent_capacity``, issue 55): under ``per_value`` the CVAE hands the route
its own vector per latent value (e_k; W z); under ``shared_delta`` it hands s + e_k (s + W z), s one
latent-independent vector (``latent_shared_vector``) that every arm trains on every row, the z-free control
(K = 1) included, so the K values are deltas on a shared adaptation rather than K copies of it. s and the
deltas start at zero, so every route's step-0 statement above holds unchanged; the prefix route's soft
token already is such an s, so it gets no second one.

Every route has a full pass (one forward of the model's own body per latent vector; the reference
and the fallback) and a suffix pass reusing the z-free pass's x-prefix cache for the n vectors,
under the same ``shared_prefix`` modes and fallback warning as the embedding route
(``zfree.models.injection.suffix_full_pass_reason``); both are tested equal. The CVAE binds its
route to its backbone (``bind_route``) so that decoding helpers given only the backbone
(``zfree.models.decoding.decode_with_latents``) decode through it.
"""

from __future__ import annotations

import contextlib
import math
from typing import get_args

import torch
from jaxtyping import Bool, Float, Int
from torch import nn
from transformers import DynamicCache

from zfree.config import Injection, LatentCapacity
from zfree.data.batching import Batch
from zfree.models.base import hidden_states
from zfree.models.injection import (decoder_hidden_full, decoder_hidden_suffix, gather_suffix, injection_mask,
                                    layer_kv, prefix_cache, prefix_slots_mask, repeat_batch, suffix_full_pass_reason,
                                    suffix_layout)
from zfree.models.kv_cache import CACHE_KW

#: the routes' names: the config's choices (``zfree.config.Injection``), each a key of ``ROUTES`` (tested)
INJECTIONS: tuple[str, ...] = get_args(Injection)
_ROUTE_ATTR = "_zfree_route"


class InjectionRoute(nn.Module):
    """Where u enters the decoder. ``full``: hidden states (B, n, T, D) of one full pass per latent
    vector; ``suffix``: (hidden (B, n, L, D) at the positions predicting S, valid (B, L)) reusing the
    z-free pass's cache; ``last_hidden``: the last position's hidden state of unpadded rows (decoding)."""

    name = "embedding"

    def full(self, backbone, batch: Batch, latents: Float[torch.Tensor, "batch n d_model"]
             ) -> Float[torch.Tensor, "batch n seq d_model"]:
        """Hidden states (B, n, T, D) of one full pass over (x, y) per latent vector (the reference path)."""
        return decoder_hidden_full(backbone, batch, latents)

    def suffix(self, backbone, batch: Batch, cache, latents: Float[torch.Tensor, "batch n d_model"],
               shared_prefix: str | None = None) -> tuple[torch.Tensor, Bool[torch.Tensor, "batch pos"]]:
        """(hidden (B, n, L, D) at the positions predicting S, valid (B, L)) of the passes over the y-region
        reusing ``cache``'s x-prefix slots; the full pass where ``shared_prefix`` says so."""
        return decoder_hidden_suffix(backbone, batch, cache, latents, shared_prefix)

    def last_hidden(self, backbone, ids: Int[torch.Tensor, "rows seq"], P: int,
                    latents: Float[torch.Tensor, "rows d_model"]) -> Float[torch.Tensor, "rows d_model"]:
        """The last position's hidden state of rows ``ids`` (G, T) sharing the prefix length ``P`` (no
        padding), u injected from the separator (P - 1) on: the full pass of ``decoding_batch``."""
        return self.full(backbone, decoding_batch(ids, P), latents[:, None])[:, 0, -1]


def decoding_batch(ids: Int[torch.Tensor, "rows seq"], P: int) -> Batch:
    """Unpadded rows (G, T) of prefix length ``P`` as a ``Batch`` whose injection positions are
    P - 1 .. T - 1 (the separator and every generated token; ``target_len`` = T - P + 1)."""
    G, T = ids.shape
    t = torch.arange(T, device=ids.device)[None, :].expand(G, T)
    return Batch(ids, torch.ones_like(ids), t >= P, torch.full((G,), P, device=ids.device),
                 torch.full((G,), T - P + 1, device=ids.device), [""] * G, [None] * G, (P, T - P + 1))


# ------------------------------------------------------------------------------------- mid


def decoder_layers(backbone) -> nn.ModuleList:
    """The body's list of decoder layers: the first ``nn.ModuleList`` of ``num_hidden_layers`` modules
    under ``backbone.base_model`` (GPT-2's ``h``, Llama's ``layers``, OPT's ``decoder.layers``).
    Raises ValueError naming the model when there is none."""
    n = backbone.config.get_text_config().num_hidden_layers
    for mod in backbone.base_model.modules():
        if isinstance(mod, nn.ModuleList) and len(mod) == n:
            return mod
    raise ValueError(f"{type(backbone).__name__}: no list of {n} decoder layers found for injection='mid'")


@contextlib.contextmanager
def residual_added(layer: nn.Module, delta: Float[torch.Tensor, "rows seq d_model"]):
    """Inside the block, ``delta`` is added to the hidden states entering ``layer`` (a forward
    pre-hook, positional or keyword ``hidden_states``); removed on exit."""

    def pre(module, args, kwargs):
        if args:
            return (args[0] + delta.to(args[0].dtype), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": kwargs["hidden_states"] + delta.to(kwargs["hidden_states"].dtype)}

    handle = layer.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


class MidRoute(InjectionRoute):
    """u added to the residual stream entering decoder layer ``n_layer // 2`` at the separator and the
    positions predicting y (module docstring). No parameters of its own."""

    name = "mid"

    def __init__(self, backbone):
        super().__init__()
        layers = decoder_layers(backbone)
        self.layer_index = len(layers) // 2

    def layer(self, backbone) -> nn.Module:
        """The decoder layer whose input u is added to (``layer_index`` of ``decoder_layers``)."""
        return decoder_layers(backbone)[self.layer_index]

    def full(self, backbone, batch, latents):
        """``InjectionRoute.full`` with u added to layer ``layer_index``'s input instead of the embeddings."""
        B, T = batch.input_ids.shape
        n = latents.shape[1]
        emb = backbone.get_input_embeddings()(batch.decoder_inputs)  # (B, T, D)
        inj = injection_mask(batch).to(latents.dtype)  # (B, T)
        delta = (inj[:, None, :, None] * latents[:, :, None, :]).reshape(B * n, T, -1)  # (B*n, T, D)
        with residual_added(self.layer(backbone), delta):
            h = hidden_states(backbone, repeat_batch(batch, n), inputs_embeds=emb.repeat_interleave(n, 0))
        return h.reshape(B, n, T, -1)

    def suffix(self, backbone, batch, cache, latents, shared_prefix=None):
        """``InjectionRoute.suffix`` with u added to layer ``layer_index``'s input over the y-region."""
        B, T = batch.input_ids.shape
        n = latents.shape[1]
        Pc, L, pos, valid = suffix_layout(batch)
        if suffix_full_pass_reason(backbone, batch, cache, Pc + L, shared_prefix):
            return gather_suffix(self.full(backbone, batch, latents), pos), valid
        ids = batch.decoder_inputs.gather(1, pos.clamp_max(T - 1))
        x = backbone.get_input_embeddings()(ids).repeat_interleave(n, 0)  # (B*n, L, D)
        delta = latents[:, :, None, :].expand(B, n, L, -1).reshape(B * n, L, -1)
        mask = torch.cat([prefix_slots_mask(batch, Pc), valid], 1).long().repeat_interleave(n, 0)
        with residual_added(self.layer(backbone), delta):
            h = backbone.base_model(inputs_embeds=x, attention_mask=mask, position_ids=pos.repeat_interleave(n, 0),
                                    use_cache=True, **{CACHE_KW: prefix_cache(cache, Pc, n)}).last_hidden_state
        return h.reshape(B, n, L, -1), valid


# ------------------------------------------------------------------------------------- memory


class MemoryRoute(InjectionRoute):
    """One key/value per layer from u, taking the first position's place for the separator and y
    queries (module docstring): slot_l = (k_l(x_0) + dk_l, v_l(x_0) + dv_l), (dk, dv) = M u with
    M (all layers' key and value sizes x d_model) drawn N(0, 1/d_model) and trained."""

    name = "memory"

    def __init__(self, backbone):
        super().__init__()
        self.kv_shapes = cache_shapes(backbone)  # per layer: (heads, key dim, value dim)
        d = backbone.get_input_embeddings().weight.shape[1]
        self.proj = nn.Linear(d, sum(h * (dk + dv) for h, dk, dv in self.kv_shapes), bias=False)
        nn.init.normal_(self.proj.weight, std=1.0 / math.sqrt(d))  # u = 0 at step 0: M u = 0 whatever M is

    def deltas(self, latents: Float[torch.Tensor, "batch n d_model"]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(dk_l, dv_l) per layer, each (B * n, heads, 1, dim), rows in (b, s) order."""
        flat = self.proj(latents.reshape(-1, latents.shape[-1]))  # (B*n, sum)
        out, i = [], 0
        for h, dk, dv in self.kv_shapes:
            k, v = flat[:, i : i + h * dk], flat[:, i + h * dk : i + h * (dk + dv)]
            out.append((k.reshape(-1, h, 1, dk), v.reshape(-1, h, 1, dv)))
            i += h * (dk + dv)
        return out

    def suffix(self, backbone, batch, cache, latents, shared_prefix=None):
        """``InjectionRoute.suffix`` with the first cached slot's key/value shifted by M u per layer."""
        B, T = batch.input_ids.shape
        n = latents.shape[1]
        Pc, L, pos, valid = suffix_layout(batch)
        _check_prefix(batch)
        if suffix_full_pass_reason(backbone, batch, cache, Pc + L, shared_prefix):
            return gather_suffix(self.full(backbone, batch, latents), pos), valid
        ids = batch.decoder_inputs.gather(1, pos.clamp_max(T - 1))
        x = backbone.get_input_embeddings()(ids).repeat_interleave(n, 0)  # (B*n, L, D)
        mask = torch.cat([prefix_slots_mask(batch, Pc), valid], 1).long().repeat_interleave(n, 0)
        h = backbone.base_model(inputs_embeds=x, attention_mask=mask, position_ids=pos.repeat_interleave(n, 0),
                                use_cache=True, **{CACHE_KW: prefix_cache(cache, Pc, n, self.deltas(latents))})
        return h.last_hidden_state.reshape(B, n, L, -1), valid

    def full(self, backbone, batch, latents):
        """Per prefix length P (rows without padding inside the prefix): a z-free pass over the x-prefix
        (positions 0 .. P - 2) into an unbounded cache, then one pass from the separator on per latent
        vector with slot 0 replaced. Cache coordinates are true positions, so sliding windows are
        applied exactly by the model's own masks. Reads prefix lengths on the host (one copy)."""
        B, T = batch.input_ids.shape
        n = latents.shape[1]
        _check_prefix(batch)
        emb_layer = backbone.get_input_embeddings()
        pieces, order = [], []
        lengths = batch.prefix_len.tolist()
        for P in sorted(set(lengths)):
            idx = torch.tensor([b for b, p in enumerate(lengths) if p == P], device=batch.input_ids.device)
            G = len(idx)
            x_ids = batch.input_ids[idx, : P - 1]  # the x-prefix, unpadded within the group
            pre = backbone.base_model(input_ids=x_ids, attention_mask=torch.ones_like(x_ids), use_cache=True,
                                      **{CACHE_KW: DynamicCache()})  # unbounded: every layer keeps position 0
            cache = getattr(pre, "cache", None) or pre.past_key_values
            x = emb_layer(batch.decoder_inputs[idx, P - 1 :]).repeat_interleave(n, 0)  # (G*n, T-P+1, D)
            mask = torch.cat([torch.ones_like(x_ids), batch.attention_mask[idx, P - 1 :]], 1)
            pos = torch.arange(P - 1, T, device=x.device)[None, :].expand(G * n, -1)
            suf = backbone.base_model(inputs_embeds=x, attention_mask=mask.repeat_interleave(n, 0), position_ids=pos,
                                      use_cache=True,
                                      **{CACHE_KW: prefix_cache(cache, P - 1, n, self.deltas(latents[idx]))})
            h_pre = pre.last_hidden_state[:, None].expand(G, n, P - 1, -1)  # z-free x-prefix, every value
            pieces.append(torch.cat([h_pre, suf.last_hidden_state.reshape(G, n, T - P + 1, -1)], 2))
            order.append(idx)
        h = torch.cat(pieces, 0)  # (B, n, T, D), rows grouped by prefix length
        return h[torch.argsort(torch.cat(order))]


def cache_shapes(backbone) -> list[tuple[int, int, int]]:
    """(heads, key dim, value dim) of every layer's key/value cache, read from a one-token z-free
    pass (no gradient, eval mode, the training flag restored)."""
    param = next(backbone.parameters())
    was = backbone.training
    backbone.eval()
    one = torch.zeros((1, 1), dtype=torch.long, device=param.device)
    try:
        with torch.no_grad():
            # one token, nothing padded, only the cache's shapes read: harmless without a mask, but token 0
            # is the pad id of many tokenizers, and transformers then warns "pass an attention_mask" (once
            # per process, so it looked like the route's forward's); the all-ones mask says what is true
            out = backbone.base_model(input_ids=one, attention_mask=torch.ones_like(one), use_cache=True)
    finally:
        backbone.train(was)
    cache = getattr(out, "cache", None) or out.past_key_values
    return [(int(k.shape[1]), int(k.shape[-1]), int(v.shape[-1])) for k, v in layer_kv(cache)]


def _check_prefix(batch: Batch) -> None:
    """The memory slot takes the first position's place: every row needs a token before its separator
    (prefix_len >= 2). Checked on the device without a host copy (``torch._assert_async``)."""
    torch._assert_async((batch.prefix_len >= 2).all(),
                        "injection='memory' needs a token before the separator in every row (prefix_len >= 2)")


# ------------------------------------------------------------------------------------- prefix


def initial_soft_token(backbone) -> Float[torch.Tensor, "d_model"]:
    """s_0, the prefix route's soft token at step 0: the mean over the vocabulary of the input embedding
    module's output (its own scaling, Gemma's sqrt(d), included), in the embeddings' dtype and device, no
    gradient. A run's prefix reference is scored reading it (``zfree.reference.prefix``)."""
    emb = backbone.get_input_embeddings()
    V, chunk = emb.weight.shape[0], 4096  # chunked: a 256k vocabulary's embeddings at once would be GBs
    with torch.no_grad():
        total = sum(emb(torch.arange(i, min(i + chunk, V), device=emb.weight.device)).sum(0)
                    for i in range(0, V, chunk))
    return total / V


class PrefixRoute(InjectionRoute):
    """One soft token s + u inserted before the separator (module docstring). s (d_model) is learned
    and latent-independent, initialised at the mean input embedding of the vocabulary."""

    name = "prefix"

    def __init__(self, backbone):
        super().__init__()
        self.shared = nn.Parameter(initial_soft_token(backbone))

    def soft(self, latents: Float[torch.Tensor, "batch n d_model"], dtype: torch.dtype | None = None
             ) -> Float[torch.Tensor, "batch n d_model"]:
        """The soft token of each latent vector: s + u, in ``dtype`` (the body's; default the latents')."""
        return (self.shared.to(latents.dtype) + latents).to(dtype or latents.dtype)

    def full(self, backbone, batch, latents):
        """One pass over [x-prefix, soft token, sep, y] per latent vector (T + 1 positions, the soft
        token at position prefix_len - 1), returned in the layout of (x, y) (the soft position dropped)."""
        B, T = batch.input_ids.shape
        n = latents.shape[1]
        t = torch.arange(T + 1, device=batch.input_ids.device)[None, :]
        at = (batch.prefix_len - 1)[:, None]  # (B, 1) the soft token's position
        src = t - (t > at).long()  # (B, T+1) the token each extended position reads
        emb = backbone.get_input_embeddings()(batch.decoder_inputs.gather(1, src))  # (B, T+1, D)
        soft = (t == at)[:, None, :, None]  # (B, 1, T+1, 1)
        x = torch.where(soft, self.soft(latents, emb.dtype)[:, :, None, :], emb[:, None])  # (B, n, T+1, D)
        mask = torch.where(t == at, 1, batch.attention_mask.gather(1, src)).repeat_interleave(n, 0)
        h = backbone.base_model(inputs_embeds=x.reshape(B * n, T + 1, -1), attention_mask=mask,
                                use_cache=False).last_hidden_state.reshape(B, n, T + 1, -1)
        back = torch.arange(T, device=t.device)[None, :] + (torch.arange(T, device=t.device)[None, :] >= at).long()
        return h.gather(2, back[:, None, :, None].expand(B, n, T, h.shape[-1]))

    def suffix(self, backbone, batch, cache, latents, shared_prefix=None):
        """``InjectionRoute.suffix`` with the soft token s + u before the separator (one more position a pass)."""
        B, T = batch.input_ids.shape
        n = latents.shape[1]
        Pc, L, pos, valid = suffix_layout(batch)
        if suffix_full_pass_reason(backbone, batch, cache, Pc + 1 + L, shared_prefix):
            return gather_suffix(self.full(backbone, batch, latents), pos), valid
        ids = batch.decoder_inputs.gather(1, pos.clamp_max(T - 1))
        emb = backbone.get_input_embeddings()(ids)  # (B, L, D)
        x = torch.cat([self.soft(latents, emb.dtype)[:, :, None, :], emb[:, None].expand(B, n, L, -1)], 2)  # (B, n, 1+L, D)
        pos1 = torch.cat([pos[:, :1], pos + 1], 1)  # the soft token at prefix_len - 1, sep and y one later
        ones = torch.ones_like(valid[:, :1])
        mask = torch.cat([prefix_slots_mask(batch, Pc), ones, valid], 1).long().repeat_interleave(n, 0)
        h = backbone.base_model(inputs_embeds=x.reshape(B * n, 1 + L, -1), attention_mask=mask,
                                position_ids=pos1.repeat_interleave(n, 0),
                                use_cache=True, **{CACHE_KW: prefix_cache(cache, Pc, n)}).last_hidden_state
        return h.reshape(B, n, 1 + L, -1)[:, :, 1:], valid


#: ``ModelConfig.latent_capacity``: the latent vectors as K own vectors, or as deltas on one shared vector
LATENT_CAPACITIES: tuple[str, ...] = get_args(LatentCapacity)  # the config's choices (zfree.config.LatentCapacity)


def latent_shared_vector(capacity: str, injection: str, d_model: int) -> nn.Parameter | None:
    """The latent-independent vector s of ``capacity='shared_delta'`` (module docstring): zeros (d_model,),
    in the default dtype, so u = s + delta = 0 at step 0; None under ``per_value`` and under the prefix
    route, whose soft token is s already. Raises ValueError listing ``LATENT_CAPACITIES``."""
    if capacity not in LATENT_CAPACITIES:
        raise ValueError(f"latent_capacity={capacity!r} is not one of {list(LATENT_CAPACITIES)}")
    if capacity == "per_value" or injection == "prefix":
        return None
    return nn.Parameter(torch.zeros(d_model))


#: injection -> the route's class (``ModelConfig.injection``)
ROUTES: dict[str, type[InjectionRoute]] = {"embedding": InjectionRoute, "prefix": PrefixRoute,
                                            "memory": MemoryRoute, "mid": MidRoute}


def build_route(injection: str, backbone) -> InjectionRoute:
    """The route ``injection`` on ``backbone``, bound to it (``bind_route``). ValueError listing the routes."""
    if injection not in ROUTES:
        raise ValueError(f"injection={injection!r}: expected one of {sorted(ROUTES)}")
    route = ROUTES[injection]() if injection == "embedding" else ROUTES[injection](backbone)
    bind_route(backbone, route)
    return route


def bind_route(backbone, route: InjectionRoute) -> None:
    """Record ``route`` on ``backbone`` (a plain attribute, not a submodule: its parameters stay the
    CVAE's), so ``zfree.models.decoding.decode_with_latents`` decodes through it."""
    object.__setattr__(backbone, _ROUTE_ATTR, route)


def route_of(backbone) -> InjectionRoute | None:
    """The route bound to ``backbone`` (None: none, i.e. the embedding path)."""
    return backbone.__dict__.get(_ROUTE_ATTR)
