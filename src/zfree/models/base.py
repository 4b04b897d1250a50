"""The z-free base model p_theta(y | x): build the synthetic GPT-2, load any local causal LM, and
read per-token log-probs of the supervised y-region."""

from __future__ import annotations

from pathlib import Path

import torch
from jaxtyping import Float
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel

from zfree.data.batching import Batch
from zfree.paths import TOKENIZER_FILES


def build_synthetic_gpt2(vocab_size: int, *, n_positions: int = 64, n_layer: int = 2, n_embd: int = 128,
                         n_head: int = 4, seed: int = 0) -> GPT2LMHeadModel:
    """A small GPT-2 from a config, dropout 0 (so teacher-forced losses are deterministic)."""
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=vocab_size, n_positions=n_positions, n_layer=n_layer, n_embd=n_embd,
                     n_head=n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     bos_token_id=1, eos_token_id=3, pad_token_id=0)
    return GPT2LMHeadModel(cfg)


def load_base(model_dir: Path | str, *, trust_remote_code: bool = False, device: str = "cpu"):
    """Load ``(model, tokenizer)`` from a local HF folder (no hub access), model in eval mode, fp32.

    Raises FileNotFoundError if the folder is missing, ValueError if it holds no tokenizer.
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model folder {model_dir} does not exist")
    if not any((model_dir / f).exists() for f in TOKENIZER_FILES):  # transformers 5 would invent an empty one
        raise ValueError(f"model folder {model_dir} has no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
    try:
        tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, TypeError) as e:
        raise ValueError(f"{model_dir}: no loadable tokenizer ({type(e).__name__}: {e})") from None
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, trust_remote_code=trust_remote_code,
                                                 dtype=torch.float32)
    return model.to(device).eval(), tok


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
    """log p(token_t | tokens_<t) at the y-region positions t (0 elsewhere), in nats, fp32.

    Gathers the hidden states of the positions that predict y tokens (t - 1) *before* the output
    head, so logits are never materialized for x positions; log-softmax runs in float32.
    """
    B, T, _ = hidden.shape
    predict = batch.target_mask[:, 1:]  # (B, T-1): position t-1 predicts supervised token t
    h = hidden[:, :-1][predict]  # (N, D)
    logits = model.get_output_embeddings()(h).float()  # (N, V)
    tokens = batch.input_ids[:, 1:][predict]  # (N,)
    lp = torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
    out = hidden.new_zeros((B, T), dtype=torch.float32)
    out[:, 1:][predict] = lp
    return out


def target_logprobs(model, batch: Batch, inputs_embeds: torch.Tensor | None = None) -> Float[torch.Tensor, "batch seq"]:
    """Per-token log-probs of the supervised y-region under ``model`` (see ``target_logprobs_from_hidden``)."""
    return target_logprobs_from_hidden(model, hidden_states(model, batch, inputs_embeds), batch)


@torch.no_grad()
def greedy_decode_with_latents(backbone, prefixes, latents: Float[torch.Tensor, "rows d_model"], *, eos_id: int,
                               max_new_tokens: int) -> list[list[int]]:
    """Greedy decoding of y after each prefix ([bos] + x + [sep]) with one latent vector per row
    added to the input embeddings at the separator and every generated position (as in training).
    Rows are grouped by prefix length, so no padding is needed. Returns the generated ids without
    the end token. Shared by the discrete (latent = e_z) and continuous (latent = W z) CVAEs."""
    dev = latents.device
    out: list[list[int]] = [[] for _ in prefixes]
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(prefixes):
        groups.setdefault(len(p), []).append(i)
    emb_layer, head = backbone.get_input_embeddings(), backbone.get_output_embeddings()
    for P, idx in groups.items():
        ids = torch.tensor([list(prefixes[i]) for i in idx], device=dev)
        lat = latents[idx]  # (G, D)
        done = torch.zeros(len(idx), dtype=torch.bool, device=dev)
        for _ in range(max_new_tokens):
            T = ids.shape[1]
            inj = (torch.arange(T, device=dev) >= P - 1).to(lat.dtype)  # separator and y positions
            emb = emb_layer(ids) + inj[None, :, None] * lat[:, None, :]
            nxt = head(backbone.base_model(inputs_embeds=emb, use_cache=False).last_hidden_state[:, -1]).argmax(-1)
            nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
            ids = torch.cat([ids, nxt[:, None]], 1)
            done |= nxt == eos_id
            if done.all():
                break
        for r, i in enumerate(idx):
            gen = ids[r, P:].tolist()
            out[i] = gen[: gen.index(eos_id)] if eos_id in gen else gen
    return out
