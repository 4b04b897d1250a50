"""Shared discrete CVAE (DESIGN §3): one backbone, initialized from the z-free base model, serves

  posterior  q_xi(z | x, y)  a linear head on the mean of the z-free hidden states over the y-region
                             (``mean_y``, default) or on the last position (``last``);
  router     p_phi(z | x)    a linear head on the separator position (the last prefix position,
                             which predicts the first y token and sees only x);
  decoder    p_psi(y | x, z) the backbone with a latent embedding e_z added to the input embeddings
                             at the separator and y positions.

e_z is zero-initialized, so at initialization every latent value decodes exactly like the base
model (rho_recon = 1 at step 0; tested). The reconstruction expectation is exact: all K values
are decoded.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import nn
from transformers import DynamicCache

from zfree.data.batching import Batch
from zfree.models.base import hidden_states, target_logprobs_from_hidden
from zfree.models.encoder import build_posterior_encoder


# transformers 5 renamed the forward keyword ``past_key_values`` to ``cache``
_CACHE_KW = "cache" if "cache" in inspect.signature(__import__("transformers").GPT2Model.forward).parameters \
    else "past_key_values"


@dataclass
class DiscreteCVAEOutput:
    posterior_logits: Float[torch.Tensor, "batch n_latent"]  # q(z | x, y), unnormalized
    prior_logits: Float[torch.Tensor, "batch n_latent"]  # router p(z | x), unnormalized
    target_logprobs: Float[torch.Tensor, "batch n_latent seq"]  # log p(y_t | x, y_<t, z=k) on S, 0 elsewhere
    features: Float[torch.Tensor, "batch d_model"]  # the posterior head's input
    zfree_target_logprobs: Float[torch.Tensor, "batch seq"]  # current backbone without z (the z-free pass)
    next_token_logprobs: Float[torch.Tensor, "batch n_latent pos vocab"] | None = None  # with_distributions
    pos_mask: Bool[torch.Tensor, "batch pos"] | None = None  # valid entries of next_token_logprobs


def injection_mask(batch: Batch) -> Bool[torch.Tensor, "batch seq"]:
    """True at the separator and the positions that predict y tokens: prefix_len - 1 <= t <
    prefix_len + |S| - 1 (the last end token predicts nothing and gets no latent)."""
    t = torch.arange(batch.input_ids.shape[1], device=batch.input_ids.device)[None, :]
    start = (batch.prefix_len - 1)[:, None]
    return (t >= start) & (t < start + batch.target_len[:, None])


class DiscreteCVAE(nn.Module):
    """K-valued latent CVAE on a causal LM backbone. ``forward`` returns log-probs, never a loss."""

    FEATURES = ("mean_y", "last", "mean_first", "attention", "encoder")

    def __init__(self, backbone: nn.Module, n_latent: int, posterior_features: str = "mean_y",
                 latent_init_std: float = 0.0):
        super().__init__()
        if n_latent < 2:
            raise ValueError(f"n_latent={n_latent} must be >= 2")
        if posterior_features not in self.FEATURES:
            raise ValueError(f"posterior_features={posterior_features!r} is not one of {list(self.FEATURES)}")
        d = backbone.get_input_embeddings().weight.shape[1]
        self.backbone = backbone
        self.n_latent = n_latent
        self.posterior_features = posterior_features
        if posterior_features == "attention":
            self.pool_query = nn.Parameter(torch.zeros(d))  # zero query = mean_y at init
        if posterior_features == "encoder":  # a separate bidirectional encoder, from scratch (models/encoder.py)
            self.encoder = build_posterior_encoder(backbone)
        self.posterior_head = nn.Linear(2 * d if posterior_features == "mean_first" else d, n_latent)
        self.router_head = nn.Linear(d, n_latent)
        self.latent_embedding = nn.Embedding(n_latent, d)
        nn.init.zeros_(self.latent_embedding.weight)  # decoder == base model at step 0 (DESIGN §3)
        if latent_init_std > 0:  # an aid that deliberately breaks the step-0 equivalence
            nn.init.normal_(self.latent_embedding.weight, std=latent_init_std)
        nn.init.normal_(self.posterior_head.weight, std=0.02)
        nn.init.zeros_(self.posterior_head.bias)
        nn.init.zeros_(self.router_head.weight)  # router starts uniform
        self.shared_prefix = True  # reuse the x-prefix's key/value cache for the K decoder passes
        nn.init.zeros_(self.router_head.bias)

    @torch.no_grad()
    def restart_values(self, dead: list[int], donor: int, noise: float = 0.01) -> None:
        """Dead-value restart: each dead latent value becomes a perturbed copy of ``donor`` (its
        embedding and its posterior and router rows), so it can split the donor's cluster."""
        for k in dead:
            for w in (self.latent_embedding.weight, self.posterior_head.weight, self.router_head.weight):
                w[k] = w[donor] + noise * torch.randn_like(w[donor]) * (w[donor].std() + 1e-3)
            for bias in (self.posterior_head.bias, self.router_head.bias):
                bias[k] = bias[donor] - 0.01

    def new_parameter_names(self) -> list[str]:
        return [n for n, _ in self.named_parameters() if not n.startswith("backbone.")]

    def encode(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The z-free pass: (posterior_logits, prior_logits, features, zfree_hidden)."""
        h = hidden_states(self.backbone, batch)  # (B, T, D)
        return (*self._heads_from_hidden(h, batch), h)

    def _heads_from_hidden(self, h: torch.Tensor, batch: Batch):
        B = h.shape[0]
        rows = torch.arange(B, device=h.device)
        m = batch.target_mask.to(h.dtype)[:, :, None]
        if self.posterior_features == "last":
            feats = h[rows, batch.prefix_len + batch.target_len - 1]
        elif self.posterior_features == "attention":
            scores = (h @ self.pool_query) / h.shape[-1] ** 0.5  # (B, T)
            scores = scores.masked_fill(~batch.target_mask, float("-inf"))
            feats = (torch.softmax(scores, -1)[:, :, None] * h).sum(1)
        elif self.posterior_features == "encoder":
            feats = self.encoder(batch)
        else:
            feats = (h * m).sum(1) / m.sum(1)
            if self.posterior_features == "mean_first":
                feats = torch.cat([feats, h[rows, batch.prefix_len]], -1)
        sep = h[rows, batch.prefix_len - 1]
        return self.posterior_head(feats), self.router_head(sep), feats

    def decoder_hidden(self, batch: Batch, z: Int[torch.Tensor, "batch n"] | None = None
                       ) -> Float[torch.Tensor, "batch n seq d_model"]:
        """Decoder hidden states for latent values ``z`` (default: all K, n = K) in one batched pass."""
        B, T = batch.input_ids.shape
        if z is None:
            z = torch.arange(self.n_latent, device=batch.input_ids.device).expand(B, -1)
        n = z.shape[1]
        emb = self.backbone.get_input_embeddings()(batch.input_ids)  # (B, T, D)
        inj = injection_mask(batch).to(emb.dtype)  # (B, T)
        lat = self.latent_embedding(z)  # (B, n, D)
        x = emb[:, None] + inj[:, None, :, None] * lat[:, :, None, :]  # (B, n, T, D)
        rep = _repeat_batch(batch, n)
        h = hidden_states(self.backbone, rep, inputs_embeds=x.reshape(B * n, T, -1))
        return h.reshape(B, n, T, -1)

    def _encode_with_cache(self, batch: Batch):
        """The z-free pass that also returns its key/value cache (reused for the x-prefix)."""
        out = self.backbone.base_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=True)
        return out.last_hidden_state, getattr(out, "cache", None) or out.past_key_values

    def decoder_suffix_shared_prefix(self, batch: Batch, cache) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoder hidden states over the y-region for all K values, reusing the z-free pass's
        key/value cache of the x-prefix ([bos] + x, which does not depend on z).

        Returns (hidden (B, K, L, D) at the positions predicting S, valid (B, L)), L = max |S|.
        Each row's suffix starts at its separator (position prefix_len - 1) with explicit
        position ids; cache slots beyond a row's own prefix (its y tokens, or padding) are masked.
        Equals the naive full pass per latent value (tested).
        """
        B, T = batch.input_ids.shape
        K = self.n_latent
        Pc = int(batch.prefix_len.max()) - 1  # cached prefix slots (without the separator)
        L = int(batch.target_len.max())
        dev = batch.input_ids.device
        j = torch.arange(L, device=dev)[None, :]
        valid = j < batch.target_len[:, None]  # (B, L)
        pos = (batch.prefix_len - 1)[:, None] + j  # (B, L) positions of sep, y_0 .. y_{|S|-2}
        ids = batch.input_ids.gather(1, pos.clamp_max(T - 1))
        emb = self.backbone.get_input_embeddings()(ids)  # (B, L, D)
        x = emb[:, None] + self.latent_embedding.weight[None, :, None, :]  # (B, K, L, D)
        prefix_cache = DynamicCache(ddp_cache_data=[(k[:, :, :Pc].repeat_interleave(K, 0), v[:, :, :Pc].repeat_interleave(K, 0))
                                                    for k, v in _layer_kv(cache)])
        pre_mask = torch.arange(Pc, device=dev)[None, :] < (batch.prefix_len - 1)[:, None]  # (B, Pc)
        mask = torch.cat([pre_mask, valid], 1).long().repeat_interleave(K, 0)  # (B*K, Pc + L)
        h = self.backbone.base_model(inputs_embeds=x.reshape(B * K, L, -1), attention_mask=mask,
                                     position_ids=pos.repeat_interleave(K, 0),
                                     use_cache=True, **{_CACHE_KW: prefix_cache}).last_hidden_state
        return h.reshape(B, K, L, -1), valid

    def forward(self, batch: Batch, with_distributions: bool = False) -> DiscreteCVAEOutput:
        if self.shared_prefix:
            return self._forward_shared_prefix(batch, with_distributions)
        q_logits, p_logits, feats, h0 = self.encode(batch)
        hz = self.decoder_hidden(batch)  # (B, K, T, D)
        B, K, T, D = hz.shape
        head = self.backbone.get_output_embeddings()
        predict = batch.target_mask[:, 1:]  # (B, T-1)
        hsel = hz[:, :, :-1][predict[:, None].expand(B, K, T - 1)]  # (B*K*N_b summed, D) in (b, k, t) order
        logp_all = torch.log_softmax(head(hsel).float(), -1)
        tokens = batch.input_ids[:, 1:][:, None].expand(B, K, T - 1)[predict[:, None].expand(B, K, T - 1)]
        lp = logp_all.gather(-1, tokens[:, None]).squeeze(-1)
        tlp = hz.new_zeros((B, K, T), dtype=torch.float32)
        tlp[:, :, 1:][predict[:, None].expand(B, K, T - 1)] = lp
        t0 = target_logprobs_from_hidden(self.backbone, h0, batch)  # the current backbone without z
        out = DiscreteCVAEOutput(q_logits, p_logits, tlp, feats, t0)
        if with_distributions:
            P = int(batch.target_len.max())
            pos_mask = torch.arange(P, device=hz.device)[None, :] < batch.target_len[:, None]  # (B, P)
            V = logp_all.shape[-1]
            dist = logp_all.new_zeros((B, K, P, V))
            dist[pos_mask[:, None].expand(B, K, P)] = logp_all
            out.next_token_logprobs, out.pos_mask = dist, pos_mask
        return out


    def _forward_shared_prefix(self, batch: Batch, with_distributions: bool) -> DiscreteCVAEOutput:
        h0, cache = self._encode_with_cache(batch)
        q_logits, p_logits, feats = self._heads_from_hidden(h0, batch)
        head = self.backbone.get_output_embeddings()
        B, T = batch.input_ids.shape
        K = self.n_latent
        predict = batch.target_mask[:, 1:]
        t0 = target_logprobs_from_hidden(self.backbone, h0, batch)  # the current backbone without z
        hz, valid = self.decoder_suffix_shared_prefix(batch, cache)  # (B, K, L, D), (B, L)
        L = hz.shape[2]
        sel = valid[:, None].expand(B, K, L)
        logp_all = torch.log_softmax(head(hz[sel]).float(), -1)  # (N, V) in (b, k, j) order
        tgt_pos = (batch.prefix_len[:, None] + torch.arange(L, device=hz.device)[None, :]).clamp_max(T - 1)
        tokens = batch.input_ids.gather(1, tgt_pos)[:, None].expand(B, K, L)[sel]
        lp = logp_all.gather(-1, tokens[:, None]).squeeze(-1)
        tlp = hz.new_zeros((B, K, T), dtype=torch.float32)
        tlp[:, :, 1:][predict[:, None].expand(B, K, T - 1)] = lp  # same (b, k, position) order
        out = DiscreteCVAEOutput(q_logits, p_logits, tlp, feats, t0)
        if with_distributions:
            dist = logp_all.new_zeros((B, K, L, logp_all.shape[-1]))
            dist[sel] = logp_all
            out.next_token_logprobs, out.pos_mask = dist, valid
        return out


def _layer_kv(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) per layer, each (batch, heads, seq, head_dim), across transformers versions."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


def _repeat_batch(batch: Batch, n: int) -> Batch:
    """Each row repeated n times, consecutively (row b -> rows b*n .. b*n+n-1)."""
    r = lambda t: t.repeat_interleave(n, dim=0)  # noqa: E731
    return Batch(r(batch.input_ids), r(batch.attention_mask), r(batch.target_mask), r(batch.prefix_len),
                 r(batch.target_len), [i for i in batch.ids for _ in range(n)],
                 [s for s in batch.strategies for _ in range(n)])
