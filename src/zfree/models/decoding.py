"""Decoding y after x with one latent vector per row, through the CVAE's injection route
(``zfree.models.routes``): greedy, or ancestral sampling at temperature 1, with the key/value cache
on every route.

Each route decodes as it trains (``InjectionRoute.full``): embedding adds u to the input embeddings
from the separator on; mid adds it to the residual stream entering the middle layer at the same
positions; memory passes the x-prefix z-free and lets the separator and every generated token read
slot 0 shifted by M u; prefix reads one soft token s + u before the separator. The cached path runs
one pass over each prefix group and then one position per new token; the uncached path re-reads the
whole sequence for every token (the route's full pass). Both are tested to give the same ids on
several architectures (tests/test_route_decoding.py). Before routes had a cached path, a SmolLM2-135M
study's mid- and memory-route controls took about 2000 s to decode 30 E2E MRs x 6 samples on a
shared 2-core CPU, the embedding route's about 140 s.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from transformers import DynamicCache

from zfree.models.base import context_length, new_token_room, prefix_groups
from zfree.models.head import exact_logits_from_hidden
from zfree.models.injection import prefix_cache
from zfree.models.kv_cache import CACHE_KW, sliding_window_of
from zfree.models.routes import residual_added, route_of


#: the routes ``_start`` and ``_step`` inject u into with the cache; another route (one added later)
#: decodes through its own full pass per token (``InjectionRoute.last_hidden``): slower, never wrong
CACHED_ROUTES = frozenset({"embedding", "mid", "memory", "prefix"})


@torch.no_grad()
def decode_with_latents(backbone, prefixes, latents: Float[torch.Tensor, "rows d_model"], *, eos_id: int,
                        max_new_tokens: int, generator: torch.Generator | None = None,
                        cache: bool = True) -> list[list[int]]:
    """Decoding of y after each prefix ([bos] + x + [sep]) with one latent vector per row, injected
    through the route bound to ``backbone`` (``zfree.models.routes.route_of``; none: the embedding
    path, u added to the input embeddings at the separator and every generated position, as in
    training); shared by the discrete (latent = e_k) and continuous (latent = W z) CVAEs. Rows are
    grouped by prefix length, so no padding is needed. ``generator`` None: greedy, the next token
    the argmax of the model's own logits (``zfree.models.head``); else ancestral sampling at
    temperature 1: each next token drawn from the softmax of the model's own logits with
    ``generator`` (a CPU generator; the probabilities are copied to the host, float32 or the model's
    float64), rows of one prefix length drawn together. The same rows and generator state give the
    same ids.

    ``cache`` (default): the key/value cache, one pass over each prefix group and then one position
    per new token, on every route of ``CACHED_ROUTES``; without it (``cache=False``, the reference the cached path is
    tested against, and the path taken for a model whose sliding window is shorter than prefix + new
    tokens: ``zfree.models.kv_cache.sliding_window_of``) every token re-reads the whole sequence
    through the route's full pass. The two agree up to float rounding (tests/test_latent_stats.py,
    tests/test_route_decoding.py). prefix + new tokens (+ the prefix route's soft token) never exceed
    the model's context (``new_token_room``; a note says how many rows were cut). prefixes: list of
    id lists; latents (rows, d_model). Returns the generated ids without the end token."""
    route = route_of(backbone)
    name = _name(route)
    extra = 1 if name == "prefix" else 0  # the soft token is one more position
    window = sliding_window_of(backbone.config)
    longest = max((len(p) for p in prefixes), default=0) + extra + max_new_tokens
    context = context_length(backbone)
    cut = sum(new_token_room(len(p) + extra, max_new_tokens, context) < max_new_tokens for p in prefixes)
    if cut:
        print(f"note: {cut} of {len(prefixes)} decoded rows were cut at the model's context of {context} tokens "
              f"(prefix + up to {max_new_tokens} new tokens did not fit)", flush=True)
    cached = cache and name in CACHED_ROUTES and (window is None or longest <= window)
    out: list[list[int]] = [[] for _ in prefixes]
    emb_layer = backbone.get_input_embeddings()
    if name == "embedding":  # added to the embeddings: in the body's dtype (a bf16 base)
        latents = latents.to(emb_layer.weight.dtype)
    for P, idx, ids, lat in prefix_groups(prefixes, latents):
        room = new_token_room(P + extra, max_new_tokens, context)
        rows = (_group_cached(backbone, route, ids, lat, room, eos_id, generator) if cached else
                _group_uncached(backbone, route, ids, lat, room, eos_id, generator))
        for i, r in zip(idx, rows):
            out[i] = r[: r.index(eos_id)] if eos_id in r else r
    return out


def _name(route) -> str:
    """The route's name; "embedding" for none bound (the embedding path)."""
    return "embedding" if route is None else route.name


def _next_token(logits: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """(G,) next ids from (G, V) logits: the argmax, or one draw per row from their softmax."""
    if generator is None:
        return logits.argmax(-1)
    return torch.multinomial(next_token_probs(logits).cpu(), 1, generator=generator)[:, 0].to(logits.device)


def _group_uncached(backbone, route, ids: torch.Tensor, lat: torch.Tensor, room: int, eos_id: int,
                    generator: torch.Generator | None) -> list[list[int]]:
    """The ids after the prefixes ``ids`` (G, P) of one group, up to ``room`` of them (the end token
    kept), every token re-reading the whole sequence: the route's ``last_hidden`` (its full pass), or
    (no route) the latents added to the input embeddings from the separator on."""
    P, dev = ids.shape[1], lat.device
    emb_layer = backbone.get_input_embeddings()
    done = torch.zeros(len(ids), dtype=torch.bool, device=dev)
    for _ in range(room):
        T = ids.shape[1]
        if _name(route) != "embedding":
            h_last = route.last_hidden(backbone, ids, P, lat)
        else:
            inj = (torch.arange(T, device=dev) >= P - 1).to(lat.dtype)  # separator and y positions
            emb = emb_layer(ids) + inj[None, :, None] * lat[:, None, :]
            h_last = backbone.base_model(inputs_embeds=emb, use_cache=False).last_hidden_state[:, -1]
        logits = exact_logits_from_hidden(backbone, h_last)  # the model's own logits (G, V)
        nxt = _next_token(logits, generator)
        nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
        ids = torch.cat([ids, nxt[:, None]], 1)
        done |= nxt == eos_id
        if done.all():
            break
    return ids[:, P:].tolist()


def _group_cached(backbone, route, ids: torch.Tensor, lat: torch.Tensor, room: int, eos_id: int,
                  generator: torch.Generator | None) -> list[list[int]]:
    """``_group_uncached`` with the key/value cache: one pass over the prefixes (``_start``), then one
    position per new token (``_step``)."""
    if room == 0:  # the prefix fills the context: nothing can follow it
        return [[] for _ in ids]
    res = _start(backbone, route, ids, lat)
    gen, done = [], torch.zeros(len(ids), dtype=torch.bool, device=lat.device)
    for t in range(room):
        logits = exact_logits_from_hidden(backbone, res.last_hidden_state[:, -1])  # (G, V)
        nxt = torch.where(done, torch.full_like(logits[:, 0], eos_id, dtype=torch.long), _next_token(logits, generator))
        gen.append(nxt)
        done |= nxt == eos_id
        if done.all() or t == room - 1:  # the last token's own pass would sit past the context
            break
        res = _step(backbone, route, nxt, lat, getattr(res, "cache", None) or res.past_key_values)
    return torch.stack(gen, 1).tolist()


def _start(backbone, route, ids: torch.Tensor, lat: torch.Tensor):
    """The body's output (with its cache) over the prefixes ``ids`` (G, P), u entering at the separator
    (position P - 1) the way ``route`` trains it (module docstring)."""
    body, emb_layer = backbone.base_model, backbone.get_input_embeddings()
    G, P = ids.shape
    name = _name(route)
    if name == "memory":  # x z-free into an unbounded cache, then the separator reading slot 0 + M u
        if P < 2:
            raise ValueError("injection='memory' needs a token before the separator in every row (prefix_len >= 2)")
        ones = torch.ones_like(ids)
        pre = body(input_ids=ids[:, : P - 1], attention_mask=ones[:, : P - 1], use_cache=True,
                   **{CACHE_KW: DynamicCache()})
        past = prefix_cache(getattr(pre, "cache", None) or pre.past_key_values, P - 1, 1, route.deltas(lat[:, None]))
        return body(inputs_embeds=emb_layer(ids[:, P - 1 :]), attention_mask=ones,
                    position_ids=torch.full((G, 1), P - 1, device=ids.device), use_cache=True, **{CACHE_KW: past})
    emb = emb_layer(ids)
    if name == "prefix":  # [x-prefix, s + u, sep]: P + 1 positions
        soft = route.soft(lat[:, None], emb.dtype)  # (G, 1, D)
        return body(inputs_embeds=torch.cat([emb[:, : P - 1], soft, emb[:, P - 1 :]], 1), use_cache=True)
    delta = (torch.arange(P, device=ids.device) >= P - 1).to(lat.dtype)[None, :, None] * lat[:, None, :]
    if name == "mid":
        with residual_added(route.layer(backbone), delta):
            return body(inputs_embeds=emb, use_cache=True)
    return body(inputs_embeds=emb + delta, use_cache=True)


def _step(backbone, route, nxt: torch.Tensor, lat: torch.Tensor, past):
    """The body's output for one new token per row ``nxt`` (G,) after the cache ``past``, u entering
    it the way ``route`` trains it (memory and prefix: already in the cache)."""
    body, name = backbone.base_model, _name(route)
    emb = backbone.get_input_embeddings()(nxt)[:, None]  # (G, 1, D)
    if name == "mid":
        with residual_added(route.layer(backbone), lat[:, None]):
            return body(inputs_embeds=emb, use_cache=True, **{CACHE_KW: past})
    if name == "embedding":
        emb = emb + lat[:, None]
    return body(inputs_embeds=emb, use_cache=True, **{CACHE_KW: past})


def next_token_probs(logits: Float[torch.Tensor, "rows vocab"]) -> Float[torch.Tensor, "rows vocab"]:
    """softmax of next-token logits in float32 at least (bf16 logits on a GPU), float64 kept. (rows, vocab)."""
    return torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)
