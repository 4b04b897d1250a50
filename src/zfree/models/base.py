"""The z-free base model p_theta(y | x): build the synthetic GPT-2, load any local causal LM, and
read per-token log-probs of the supervised y-region."""

from __future__ import annotations

from pathlib import Path

import torch
from jaxtyping import Float
from transformers import GPT2Config, GPT2LMHeadModel

from zfree.data.batching import Batch
from zfree.models.head import exact_logits_from_hidden
from zfree.models.head_chunks import head_token_logprobs
from zfree.models.kv_cache import CACHE_KW, sliding_window_of
from zfree.models.loading import load_causal_lm
from zfree.models.precision import default_dtype


def build_synthetic_gpt2(vocab_size: int, *, n_positions: int = 64, n_layer: int = 2, n_embd: int = 128,
                         n_head: int = 4, seed: int = 0, dtype: torch.dtype = torch.float32) -> GPT2LMHeadModel:
    """A small GPT-2 from a config, dropout 0 (so teacher-forced losses are deterministic), its
    weights initialised in ``dtype`` (float32; float64 for the fp64 reference mode)."""
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=vocab_size, n_positions=n_positions, n_layer=n_layer, n_embd=n_embd,
                     n_head=n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     bos_token_id=1, eos_token_id=3, pad_token_id=0)
    with default_dtype(dtype):
        return GPT2LMHeadModel(cfg)


def load_base(source: Path | str, *, device: str = "auto", dtype: str = "float32", trust_remote_code: bool = False):
    """``(model, tokenizer)`` for training a CVAE on a base model: ``load_causal_lm`` with float32
    weights by default. ``source``, errors: see ``zfree.models.loading.load_causal_lm``."""
    return load_causal_lm(source, device=device, dtype=dtype, trust_remote_code=trust_remote_code)


def hidden_states(model, batch: Batch, inputs_embeds: torch.Tensor | None = None) -> Float[torch.Tensor, "batch seq d_model"]:
    """Final hidden states of the causal LM body (after its final norm), right padding masked."""
    body = model.base_model
    if inputs_embeds is None:
        out = body(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
    else:
        out = body(inputs_embeds=inputs_embeds, attention_mask=batch.attention_mask, use_cache=False)
    return out.last_hidden_state


def target_logprobs_from_hidden(model, hidden: Float[torch.Tensor, "batch seq d_model"], batch: Batch
                                ) -> Float[torch.Tensor, "batch seq"]:
    """log p(token_t | tokens_<t) at the y-region positions t (0 elsewhere), in nats, float32
    (float64 for a float64 model: ``zfree.models.precision.acc_dtype``).

    Gathers the hidden states of the positions that predict y tokens (t - 1) *before* the output
    head, so logits are never materialized for x positions; the logits are the model's own
    (``zfree.models.head``: soft-capping, scaling, bias honoured), log-softmax runs in float32, at
    most ``zfree.models.head_chunks.HEAD_CHUNK_ELEMENTS`` logits at a time (gradient by recomputation,
    ``head_token_logprobs``). Raises ModelLoadError if the model's head path cannot be reproduced.
    """
    B, T, _ = hidden.shape
    predict = batch.target_mask[:, 1:]  # (B, T-1): position t-1 predicts supervised token t
    h = hidden[:, :-1][predict]  # (N, D)
    tokens = batch.input_ids[:, 1:][predict]  # (N,)
    lp = head_token_logprobs(model, h, tokens)  # (N,) float32, chunked over rows for a large vocabulary
    out = hidden.new_zeros((B, T), dtype=lp.dtype)  # float32 (float64 for a float64 model)
    out[:, 1:][predict] = lp
    return out


def target_logprobs(model, batch: Batch, inputs_embeds: torch.Tensor | None = None) -> Float[torch.Tensor, "batch seq"]:
    """Per-token log-probs of the supervised y-region under ``model`` (see ``target_logprobs_from_hidden``)."""
    return target_logprobs_from_hidden(model, hidden_states(model, batch, inputs_embeds), batch)


def prefix_groups(prefixes, latents: Float[torch.Tensor, "rows d_model"]):
    """The rows grouped by prefix length (so a decoder needs no padding): a list of (P, row indices,
    their prefix ids (G, P), their latents (G, d_model)), on the latents' device."""
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(prefixes):
        groups.setdefault(len(p), []).append(i)
    return [(P, idx, torch.tensor([list(prefixes[i]) for i in idx], device=latents.device), latents[idx])
            for P, idx in groups.items()]


def context_length(model) -> int | None:
    """The model's maximum sequence length from its config (``max_position_embeddings``, GPT-2's
    ``n_positions`` under that name too), or None if it does not say."""
    n = getattr(model.config, "max_position_embeddings", None)
    return int(n) if isinstance(n, int) and n > 0 else None


def new_token_room(prefix_len: int, max_new_tokens: int, context: int | None) -> int:
    """How many tokens may follow a prefix of ``prefix_len`` tokens: ``max_new_tokens``, capped so that
    prefix + new tokens never exceed the model's ``context`` (absolute positions past it do not exist:
    an IndexError in the position embedding, or garbage in a rotary model); at least 0."""
    return max_new_tokens if context is None else max(0, min(max_new_tokens, context - prefix_len))


@torch.no_grad()
def decode_with_latents(backbone, prefixes, latents: Float[torch.Tensor, "rows d_model"], *, eos_id: int,
                        max_new_tokens: int, generator: torch.Generator | None = None,
                        cache: bool = True) -> list[list[int]]:
    """Decoding of y after each prefix ([bos] + x + [sep]) with one latent vector per row added to
    the input embeddings at the separator and every generated position (as in training); shared by
    the discrete (latent = e_z) and continuous (latent = W z) CVAEs. Rows are grouped by prefix
    length, so no padding is needed. ``generator`` None: greedy, the next token the argmax of the
    model's own logits (``zfree.models.head``); else ancestral sampling at temperature 1:
    each next token drawn from the softmax of the model's own logits with ``generator`` (a CPU
    generator; the probabilities are copied to the host, float32 or the model's float64), rows of one
    prefix length drawn together. The same rows and generator state give the same ids.

    ``cache`` (default): the key/value cache, one pass over each prefix group and then one position
    per new token; without it (``cache=False``, the reference the cached path is tested against, and
    the path taken for a model whose sliding window is shorter than prefix + new tokens:
    ``zfree.models.kv_cache.sliding_window_of``) every token re-reads the whole sequence. The two
    agree up to float rounding (tests/test_latent_stats.py); SmolLM2-135M's samples of 3 E2E MRs x 4
    latent values took 117 s uncached on 2 CPU cores. prefix + new tokens never exceed the model's
    context (``new_token_room``; a note says how many rows were cut). prefixes: list of id lists;
    latents (rows, d_model). A backbone whose CVAE injects through another route than ``embedding``
    (``zfree.models.routes.route_of``) decodes through that route's full pass, uncached.
    Returns the generated ids without the end token."""
    window = sliding_window_of(backbone.config)
    longest = max((len(p) for p in prefixes), default=0) + max_new_tokens
    context = context_length(backbone)
    cut = sum(new_token_room(len(p), max_new_tokens, context) < max_new_tokens for p in prefixes)
    if cut:
        print(f"note: {cut} of {len(prefixes)} decoded rows were cut at the model's context of {context} tokens "
              f"(prefix + up to {max_new_tokens} new tokens did not fit)", flush=True)
    group = _group_cached if cache and (window is None or longest <= window) else _group_uncached
    route = backbone.__dict__.get("_zfree_route")  # zfree.models.routes.bind_route (no import: routes import us)
    if route is not None and route.name != "embedding":
        group = lambda *args: _group_uncached(*args, last_hidden=route.last_hidden)  # noqa: E731
    out: list[list[int]] = [[] for _ in prefixes]
    emb_layer = backbone.get_input_embeddings()
    if route is None or route.name == "embedding":  # added to the embeddings: in the body's dtype (a bf16 base)
        latents = latents.to(emb_layer.weight.dtype)
    for P, idx, ids, lat in prefix_groups(prefixes, latents):
        rows = group(backbone, emb_layer, P, ids, lat, new_token_room(P, max_new_tokens, context), eos_id, generator)
        for i, r in zip(idx, rows):
            out[i] = r[: r.index(eos_id)] if eos_id in r else r
    return out


def _next_token(logits: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """(G,) next ids from (G, V) logits: the argmax, or one draw per row from their softmax."""
    if generator is None:
        return logits.argmax(-1)
    return torch.multinomial(next_token_probs(logits).cpu(), 1, generator=generator)[:, 0].to(logits.device)


def _group_uncached(backbone, emb_layer, P: int, ids: torch.Tensor, lat: torch.Tensor, room: int, eos_id: int,
                    generator: torch.Generator | None, last_hidden=None) -> list[list[int]]:
    """The ids after the prefixes ``ids`` (G, P) of one group, up to ``room`` of them (the end token
    kept), every token re-reading the whole sequence (``decode_with_latents``' docstring).
    ``last_hidden(backbone, ids, P, lat)``: the last hidden states of another injection route
    (default: the latents added to the input embeddings from the separator on)."""
    dev = lat.device
    done = torch.zeros(len(ids), dtype=torch.bool, device=dev)
    for _ in range(room):
        T = ids.shape[1]
        if last_hidden is not None:
            h_last = last_hidden(backbone, ids, P, lat)
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


def _group_cached(backbone, emb_layer, P: int, ids: torch.Tensor, lat: torch.Tensor, room: int, eos_id: int,
                  generator: torch.Generator | None) -> list[list[int]]:
    """``_group_uncached`` with the key/value cache: one pass over the prefixes, then one position per new token."""
    if room == 0:  # the prefix fills the context: nothing can follow it
        return [[] for _ in ids]
    dev = lat.device
    inj = (torch.arange(P, device=dev) >= P - 1).to(lat.dtype)  # the separator
    res = backbone.base_model(inputs_embeds=emb_layer(ids) + inj[None, :, None] * lat[:, None, :], use_cache=True)
    gen, done = [], torch.zeros(len(ids), dtype=torch.bool, device=dev)
    for t in range(room):
        logits = exact_logits_from_hidden(backbone, res.last_hidden_state[:, -1])  # (G, V)
        nxt = torch.where(done, torch.full_like(logits[:, 0], eos_id, dtype=torch.long), _next_token(logits, generator))
        gen.append(nxt)
        done |= nxt == eos_id
        if done.all() or t == room - 1:  # the last token's own pass would sit past the context
            break
        past = getattr(res, "cache", None) or res.past_key_values
        res = backbone.base_model(inputs_embeds=(emb_layer(nxt) + lat)[:, None], use_cache=True, **{CACHE_KW: past})
    return torch.stack(gen, 1).tolist()


def next_token_probs(logits: Float[torch.Tensor, "rows vocab"]) -> Float[torch.Tensor, "rows vocab"]:
    """softmax of next-token logits in float32 at least (bf16 logits on a GPU), float64 kept. (rows, vocab)."""
    return torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)
