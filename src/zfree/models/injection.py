"""Decoder passes with a latent vector added to the input embeddings, shared by both CVAEs (DESIGN §3).

The latent enters as an additive vector ``u`` (discrete: the embedding e_k of value k; continuous:
the projection W z of a sample) at the separator and at every position that predicts a y token.
Because the x-prefix ([bos] + x) does not depend on z, the K (or S) decoder passes reuse the key/value
cache of one z-free pass over (x, y) and run only over the y-region ("shared prefix"):
cost |x| + n·|y| instead of n·(|x| + |y|) per example. ``decoder_hidden_full`` is the naive reference
path (a full pass per latent vector); both are tested equal.
"""

from __future__ import annotations

import inspect

import torch
from jaxtyping import Bool, Float
from transformers import DynamicCache

from zfree.data.batching import Batch
from zfree.models.base import hidden_states

# transformers 5 renamed the forward keyword ``past_key_values`` to ``cache``
_CACHE_KW = "cache" if "cache" in inspect.signature(__import__("transformers").GPT2Model.forward).parameters \
    else "past_key_values"


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
                 [s for s in batch.strategies for _ in range(n)])


def layer_kv(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) per layer, each (batch, heads, seq, head_dim), across transformers versions."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


def zfree_pass(backbone, batch: Batch, use_cache: bool = True):
    """The z-free pass over (x, y): (hidden (B, T, D), its key/value cache or None)."""
    out = backbone.base_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=use_cache)
    return out.last_hidden_state, (getattr(out, "cache", None) or out.past_key_values) if use_cache else None


def decoder_hidden_full(backbone, batch: Batch, latents: Float[torch.Tensor, "batch n d_model"]
                        ) -> Float[torch.Tensor, "batch n seq d_model"]:
    """Reference path: one full pass over (x, y) per latent vector, ``latents[b, s]`` added at the
    injection positions of row b. Returns hidden states (B, n, T, D)."""
    B, T = batch.input_ids.shape
    n = latents.shape[1]
    emb = backbone.get_input_embeddings()(batch.input_ids)  # (B, T, D)
    inj = injection_mask(batch).to(emb.dtype)  # (B, T)
    x = emb[:, None] + inj[:, None, :, None] * latents[:, :, None, :]  # (B, n, T, D)
    h = hidden_states(backbone, repeat_batch(batch, n), inputs_embeds=x.reshape(B * n, T, -1))
    return h.reshape(B, n, T, -1)


def decoder_hidden_suffix(backbone, batch: Batch, cache, latents: Float[torch.Tensor, "batch n d_model"]
                          ) -> tuple[Float[torch.Tensor, "batch n pos d_model"], Bool[torch.Tensor, "batch pos"]]:
    """Decoder hidden states over the y-region for each latent vector, reusing ``cache`` (the z-free
    pass's key/value cache) for the x-prefix.

    Returns (hidden (B, n, L, D) at the positions predicting S, valid (B, L)), L = max |S|. Each
    row's suffix starts at its separator (position prefix_len - 1) with explicit position ids;
    cache slots beyond a row's own prefix (its y tokens, or padding) are masked. Equals
    ``decoder_hidden_full`` at those positions (tests/test_models.py, tests/test_continuous.py).
    """
    B, T = batch.input_ids.shape
    n = latents.shape[1]
    Pc = int(batch.prefix_len.max()) - 1  # cached prefix slots (without the separator)
    L = int(batch.target_len.max())
    dev = batch.input_ids.device
    j = torch.arange(L, device=dev)[None, :]
    valid = j < batch.target_len[:, None]  # (B, L)
    pos = (batch.prefix_len - 1)[:, None] + j  # (B, L) positions of sep, y_0 .. y_{|S|-2}
    ids = batch.input_ids.gather(1, pos.clamp_max(T - 1))
    x = backbone.get_input_embeddings()(ids)[:, None] + latents[:, :, None, :]  # (B, n, L, D)
    prefix_cache = DynamicCache(ddp_cache_data=[(k[:, :, :Pc].repeat_interleave(n, 0), v[:, :, :Pc].repeat_interleave(n, 0))
                                                for k, v in layer_kv(cache)])
    pre_mask = torch.arange(Pc, device=dev)[None, :] < (batch.prefix_len - 1)[:, None]  # (B, Pc)
    mask = torch.cat([pre_mask, valid], 1).long().repeat_interleave(n, 0)  # (B*n, Pc + L)
    h = backbone.base_model(inputs_embeds=x.reshape(B * n, L, -1), attention_mask=mask,
                            position_ids=pos.repeat_interleave(n, 0),
                            use_cache=True, **{_CACHE_KW: prefix_cache}).last_hidden_state
    return h.reshape(B, n, L, -1), valid


def suffix_target_logprobs(backbone, batch: Batch, hz: Float[torch.Tensor, "batch n pos d_model"],
                           valid: Bool[torch.Tensor, "batch pos"], with_distributions: bool = False):
    """Per-token log p(y_t | x, y_<t, u_s) in nats from ``decoder_hidden_suffix``'s output, laid out
    as (B, n, T) with zeros off the supervised positions (the layout of ``target_logprobs``); the
    output head runs in float32 on the supervised positions only. With ``with_distributions`` also
    returns the full next-token log-distributions (B, n, L, V) (zeros where not ``valid``)."""
    B, n, L, _ = hz.shape
    T = batch.input_ids.shape[1]
    sel = valid[:, None].expand(B, n, L)
    logp_all = torch.log_softmax(backbone.get_output_embeddings()(hz[sel]).float(), -1)  # (N, V), (b, s, j) order
    tgt_pos = (batch.prefix_len[:, None] + torch.arange(L, device=hz.device)[None, :]).clamp_max(T - 1)
    tokens = batch.input_ids.gather(1, tgt_pos)[:, None].expand(B, n, L)[sel]
    lp = logp_all.gather(-1, tokens[:, None]).squeeze(-1)
    tlp = hz.new_zeros((B, n, T), dtype=torch.float32)
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
    logp_all = torch.log_softmax(backbone.get_output_embeddings()(hz[:, :, :-1][predict]).float(), -1)
    tokens = batch.input_ids[:, 1:][:, None].expand(B, n, T - 1)[predict]
    tlp = hz.new_zeros((B, n, T), dtype=torch.float32)
    tlp[:, :, 1:][predict] = logp_all.gather(-1, tokens[:, None]).squeeze(-1)
    if not with_distributions:
        return tlp, None
    P = int(batch.target_len.max())
    pos_mask = torch.arange(P, device=hz.device)[None, :] < batch.target_len[:, None]  # (B, P)
    dist = logp_all.new_zeros((B, n, P, logp_all.shape[-1]))
    dist[pos_mask[:, None].expand(B, n, P)] = logp_all
    return tlp, dist
