"""The posterior's input features: poolings of the z-free hidden states, or a separate encoder.

The encoder (``posterior_features='encoder'``) is a small bidirectional transformer over (x, y) trained
from scratch, as Optimus (Li et al. 2020, §3) reads the posterior from a separate BERT encoder; its
output is mean-pooled over the real tokens and projected to the backbone width.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import nn

from zfree.data.batching import Batch


class PosteriorEncoder(nn.Module):
    """Bidirectional transformer features of (x, y) for q(z | x, y); padding (attention_mask 0) is ignored."""

    def __init__(self, vocab_size: int, d_out: int, *, d_model: int = 64, n_layer: int = 2, n_head: int = 4,
                 max_positions: int = 1024):
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"d_model={d_model} must be divisible by n_head={n_head}")
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Embedding(max_positions, d_model)
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        nn.init.normal_(self.position_embedding.weight, std=0.02)
        layer = nn.TransformerEncoderLayer(d_model, n_head, 4 * d_model, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.layers = nn.TransformerEncoder(layer, n_layer, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.out = nn.Linear(d_model, d_out)
        self.max_positions = max_positions

    def forward(self, batch: Batch) -> Float[torch.Tensor, "batch d_out"]:
        """Mean-pooled bidirectional features of (x, y), (B, d_out). Raises ValueError for a sequence
        longer than ``max_positions``."""
        B, T = batch.input_ids.shape
        if T > self.max_positions:
            raise ValueError(f"sequence length {T} exceeds the encoder's max_positions={self.max_positions}")
        pos = torch.arange(T, device=batch.input_ids.device)
        h = self.token_embedding(batch.input_ids) + self.position_embedding(pos)[None]  # (B, T, d_model)
        keep = batch.attention_mask.bool()  # True = real token
        h = self.norm(self.layers(h, src_key_padding_mask=~keep))
        m = keep.to(h.dtype)[:, :, None]
        return self.out((h * m).sum(1) / m.sum(1))  # (B, d_out)


def build_posterior_encoder(backbone: nn.Module) -> PosteriorEncoder:
    """An encoder sized for ``backbone``: its vocabulary, its context length, output = its width,
    inner width min(width, 256)."""
    vocab, d = backbone.get_input_embeddings().weight.shape
    cfg = backbone.config
    max_pos = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None) or 1024
    d_model = min(d, 256)
    n_head = next(h for h in (4, 2, 1) if d_model % h == 0)
    return PosteriorEncoder(vocab, d, d_model=d_model, n_head=n_head, max_positions=int(max_pos))


def _pool_mean_y(module, h, batch):
    m = batch.target_mask.to(h.dtype)[:, :, None]
    return (h * m).sum(1) / m.sum(1)


def _pool_last(module, h, batch):
    return h[torch.arange(h.shape[0], device=h.device), batch.prefix_len + batch.target_len - 1]


def _pool_mean_first(module, h, batch):
    return torch.cat([_pool_mean_y(module, h, batch), h[torch.arange(h.shape[0], device=h.device), batch.prefix_len]], -1)


def _pool_attention(module, h, batch):
    scores = (h @ module.pool_query) / h.shape[-1] ** 0.5  # (B, T)
    scores = scores.masked_fill(~batch.target_mask, float("-inf"))
    return (torch.softmax(scores, -1)[:, :, None] * h).sum(1)


#: posterior_features -> pooling of the z-free hidden states ('optimal' pools like mean_y, for the probe)
POOLINGS = {"mean_y": _pool_mean_y, "last": _pool_last, "mean_first": _pool_mean_first, "attention": _pool_attention,
            "encoder": lambda module, h, batch: module.encoder(batch)}


def pool_posterior_features(module: nn.Module, kind: str, h: Float[torch.Tensor, "batch seq d_model"],
                            batch: Batch) -> Float[torch.Tensor, "batch d_feat"]:
    """The posterior head's input from the z-free hidden states ``h`` (B, T, D):

    ``mean_y``      mean over the supervised y-region (D);
    ``last``        the last supervised position (D);
    ``mean_first``  the mean joined with the first y position's state (2D; keeps which token came first);
    ``attention``   softmax pooling over the y-region with ``module.pool_query`` (D; zero query = mean_y);
    ``encoder``     ``module.encoder``'s own bidirectional features (D).
    Raises KeyError listing the poolings for another ``kind``.
    """
    if kind not in POOLINGS:
        raise KeyError(f"posterior_features={kind!r} is not one of {sorted(POOLINGS)}")
    return POOLINGS[kind](module, h, batch)
