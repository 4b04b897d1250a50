"""A synthetic base trained on the prefix route's step-0 layout (``BaseTrainConfig.slot = "prefix"``).

The prefix route (``zfree.models.routes.PrefixRoute``) puts one soft token before the separator, and its
decoder at step 0 is the base reading [bos] x, s_0, sep, y (s_0 the mean input embedding). A base trained
from scratch on [bos] x, sep, y reads that extra position as a change of task (c_base 2.29 against 0.167
nats/token on the near-Bayes base: analysis/results/oracle-routes-synth), so the route could not be
checked on the benchmark. A base trained with the slot reads it as its own layout.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from zfree.config import BaseTrainConfig
from zfree.data.batching import EncodedPair
from zfree.models.base import build_synthetic_gpt2, target_logprobs
from zfree.models.routes import initial_soft_token
from zfree.reference.scoring import score_encoded
from zfree_lab.run import base_training
from zfree_lab.run.base_training import slot_inputs, train_base, train_text_base

ROWS = [EncodedPair("a", (1, 5, 6, 2), (7, 8, 3)), EncodedPair("b", (1, 5, 2), (9, 3)),
        EncodedPair("c", (1, 4, 4, 4, 6, 2), (7, 3))]


def _llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=20, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(cfg).double().eval()


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_the_slot_layout_is_what_the_prefix_reference_scores(arch):
    """Per row, the training step's y-region log-probs under ``slot="prefix"`` sum to minus the sequence NLL the
    scorer gives reading the same model's s_0 (``score_encoded(soft_token=...)``, the prefix reference's
    scorer), in float64; without the slot, to the plain score, which differs."""
    model = (build_synthetic_gpt2(20, n_positions=64, n_layer=2, n_embd=32, n_head=4, seed=0, dtype=torch.float64)
             if arch == "gpt2" else _llama()).eval()
    soft = initial_soft_token(model)
    for slot, want in (("prefix", score_encoded(model, ROWS, pad_id=0, soft_token=soft)),
                       ("none", score_encoded(model, ROWS, pad_id=0))):
        batch, embeds = slot_inputs(model, ROWS, 0, slot)
        assert (embeds is None) == (slot == "none")
        got = -target_logprobs(model, batch, embeds).sum(1)
        torch.testing.assert_close(got, torch.tensor(want.per_example["sequence_nll"].to_numpy()), rtol=0, atol=1e-10)
    plain, slotted = (score_encoded(model, ROWS, pad_id=0, soft_token=s).per_example["b"] for s in (None, soft))
    assert (plain - slotted).abs().min() > 1e-4


def test_a_slot_base_is_scored_and_stopped_through_its_own_soft_token(tmp_path, monkeypatch):
    """``train_base`` with ``slot="prefix"``: every step reads the slot (each batch's s_0 is the model's mean input
    embedding at that step), and the logged val c_base is the saved model reading its own s_0, not (x, y)."""
    from zfree.data.synth import DataConfig, write_benchmark

    data = write_benchmark(DataConfig(n_train=64, n_val=16, n_test=16), tmp_path / "bench")
    cfg = BaseTrainConfig(n_layer=1, n_embd=16, n_head=2, batch_size=8, max_steps=4, warmup_steps=2, eval_every=4,
                          max_minutes=None, target_ratio=1.0, slot="prefix")
    seen, real = [], base_training.lm_step

    def step(model, opt, sched, batch, inputs_embeds=None):
        at = batch.prefix_len - 2
        seen.append((inputs_embeds[torch.arange(len(at)), at] - initial_soft_token(model)).abs().max().item())
        return real(model, opt, sched, batch, inputs_embeds)

    monkeypatch.setattr(base_training, "lm_step", step)
    train_base(data, tmp_path / "base", cfg, threads=1, progress=False)
    assert len(seen) == 4 and max(seen) == 0.0
    log = json.loads((tmp_path / "base" / "train_log.json").read_text())
    assert log["config"]["slot"] == "prefix"
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "base" / "model", local_files_only=True).eval()
    from zfree.data.batching import encode_pair
    from zfree.data.pairs import load_pairs
    from zfree_lab.run.tokenizer import build_digit_tokenizer

    tok = build_digit_tokenizer(json.loads((data / "metadata.json").read_text())["parameters"]["vocab_size"])
    val = [encode_pair(tok, p) for p in load_pairs(data / "val.jsonl")]
    through = score_encoded(model, val, pad_id=tok.pad_token_id, soft_token=initial_soft_token(model)).c_base
    plain = score_encoded(model, val, pad_id=tok.pad_token_id).c_base
    assert log["history"][-1]["val_c_base"] == pytest.approx(through, rel=1e-6)
    assert abs(plain - through) > 1e-4 * through


def test_the_slot_is_checked_and_refused_for_a_text_base():
    with pytest.raises(ValueError, match="slot"):
        BaseTrainConfig(slot="suffix")
    with pytest.raises(ValueError, match="slot='prefix' applies to the synthetic"):
        train_text_base("nowhere", "nowhere-out", BaseTrainConfig(slot="prefix"), progress=False)
