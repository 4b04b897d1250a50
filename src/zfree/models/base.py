"""The z-free base model p_theta(y | x): build the synthetic GPT-2, load any local causal LM, and
read per-token log-probs of the supervised y-region. Decoding y with a latent: ``zfree.models.decoding``."""

from __future__ import annotations

from pathlib import Path

import torch
from jaxtyping import Float
from transformers import GPT2Config, GPT2LMHeadModel

from zfree.data.batching import Batch
from zfree.models.head_chunks import head_token_logprobs
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
