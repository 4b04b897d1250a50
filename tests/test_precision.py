"""Where the weights of a bf16 run live (issue 56, item 1; ``zfree.models.precision``): a LoRA run's
frozen body stored in bfloat16, everything that trains in float32; a fully fine-tuned body keeps float32
master weights under autocast. The step-0 exactness tests keep their float64 / float32 references
(tests/test_device.py, tests/test_models.py); here the bfloat16 body's step 0 is checked against the
float32 base with a stated tolerance.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.tiny import PAIRS, pairs_batch, tiny_flat, tiny_gpt2
from zfree.config import TrainConfig
from zfree.models.base import target_logprobs
from zfree.models.discrete import DiscreteCVAE
from zfree.models.head import logits_from_hidden
from zfree.models.lora import apply_lora
from zfree.models.precision import body_autocast


def store_frozen_weights(*a):  # imported late: the placement tests then run (and fail) on code without it
    from zfree.models.precision import store_frozen_weights as f

    return f(*a)


def tf32_matmuls(device):
    from zfree.models.precision import tf32_matmuls as f

    return f(device)

#: nats per token: |log p under the bfloat16-stored body - log p under the float32 body| at step 0
#: (the GPU tier's bf16 scoring tolerance, tests/test_gpu.py BF16_TOL; the tiny model measured ~1e-3)
BF16_STEP0_TOL = 0.05


def _run(tiny_run, tmp_path, **kw):
    from zfree_lab.run.run_setup import setup_run

    data, base = tiny_run
    cfg = TrainConfig.from_flat(tiny_flat(data, base, device="cpu", precision="bf16", **kw))
    return setup_run(cfg, tmp_path / "run", progress=False)


def test_a_bf16_lora_run_stores_its_frozen_body_in_bf16_and_trains_in_fp32(tiny_run, tmp_path):
    run = _run(tiny_run, tmp_path, lora_rank=4)
    frozen = {n: p.dtype for n, p in run.model.named_parameters() if not p.requires_grad}
    trains = {n: p.dtype for n, p in run.model.named_parameters() if p.requires_grad}
    assert frozen and all(n.startswith("backbone.") for n in frozen)
    assert set(frozen.values()) == {torch.bfloat16}, {n: d for n, d in frozen.items() if d != torch.bfloat16}
    assert set(trains.values()) == {torch.float32}, {n: d for n, d in trains.items() if d != torch.float32}
    assert any("lora_" in n for n in trains) and "latent_embedding.weight" in trains and "router_head.weight" in trains
    opt_params = {id(p) for g in run.opt.param_groups for p in g["params"]}
    assert all(p.dtype == torch.float32 for p in run.model.parameters() if id(p) in opt_params)
    assert all(b.dtype != torch.bfloat16 for b in run.model.buffers())  # buffers (rotary frequencies...) as loaded


def test_a_bf16_full_fine_tuning_run_keeps_fp32_master_weights(tiny_run, tmp_path):
    run = _run(tiny_run, tmp_path)
    assert {p.dtype for p in run.model.parameters()} == {torch.float32}


def test_the_frozen_base_hash_is_of_the_weights_as_loaded(tiny_run, tmp_path):
    """A bf16 LoRA run's partial checkpoints name the same frozen base as an fp32 run's (the hash is
    taken before the cast), so either resumes over the base as loaded."""
    from zfree_lab.run.checkpoint_parts import frozen_base_sha

    bf16 = _run(tiny_run, tmp_path / "a", lora_rank=4)
    data, base = tiny_run
    from zfree_lab.run.run_setup import setup_run

    fp32 = setup_run(TrainConfig.from_flat(tiny_flat(data, base, device="cpu", lora_rank=4)), tmp_path / "b" / "run",
                     progress=False)
    assert frozen_base_sha(bf16.model) == frozen_base_sha(fp32.model)


def test_store_frozen_weights_casts_only_what_does_not_train_and_tied_weights_once():
    model, _ = tiny_gpt2()
    for n, p in model.named_parameters():
        p.requires_grad_(n == "transformer.h.0.attn.c_attn.weight")
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    assert store_frozen_weights(model, torch.bfloat16) == frozen
    assert model.lm_head.weight is model.transformer.wte.weight and model.lm_head.weight.dtype == torch.bfloat16
    assert model.transformer.h[0].attn.c_attn.weight.dtype == torch.float32
    assert store_frozen_weights(model, None) == 0 and store_frozen_weights(model, torch.bfloat16) == 0


def _lora_cvae(base, injection="embedding"):
    torch.manual_seed(0)
    m = DiscreteCVAE(copy.deepcopy(base), 3, "mean_y", injection=injection)
    apply_lora(m.backbone, 4, 8.0)
    store_frozen_weights(m.backbone, torch.bfloat16)
    return m


@pytest.mark.parametrize("injection", ["embedding", "mid", "memory"])
def test_bf16_body_step0_equals_the_fp32_base_within_tolerance(injection):
    """At step 0 every value decodes like the base model (DESIGN §3); with the body stored in bfloat16
    the log-probs are the fp32 base's within ``BF16_STEP0_TOL``, in evaluation (no autocast) and under
    the training step's autocast, and they come out in float32 (head, log-softmax)."""
    base, tok = tiny_gpt2()
    batch = pairs_batch(tok, PAIRS)
    want = target_logprobs(base, batch)
    m = _lora_cvae(base, injection).eval()
    with torch.no_grad():
        out = m(batch)
        with body_autocast("bf16", "cpu"):
            auto = m(batch, zfree_metrics=False)
    mask = batch.target_mask
    for got in (out.target_logprobs, auto.target_logprobs):
        assert got.dtype == torch.float32
        for k in range(3):
            diff = (got[:, k] - want)[mask].abs().max().item()
            assert diff <= BF16_STEP0_TOL, (injection, k, diff)
    assert out.prior_logits.dtype == out.posterior_logits.dtype == out.zfree_target_logprobs.dtype == torch.float32


def test_a_bf16_lora_step_sends_fp32_gradients_to_the_adapters_and_heads_only():
    base, tok = tiny_gpt2()
    batch = pairs_batch(tok, PAIRS)
    m = _lora_cvae(base).train()
    with body_autocast("bf16", "cpu"):
        out = m(batch, zfree_metrics=False)
    loss = -(out.target_logprobs.float().sum() + out.posterior_logits.float().logsumexp(-1).sum())
    assert torch.isfinite(loss)
    loss.backward()
    grads = {n: p.grad for n, p in m.named_parameters() if p.requires_grad}
    assert all(g is not None and g.dtype == torch.float32 for n, g in grads.items() if "lora_B" in n or n.startswith(("posterior_head", "latent_embedding")))
    assert all(p.grad is None for p in m.parameters() if not p.requires_grad)


def test_the_head_of_a_bf16_weight_accumulates_in_fp32_and_reuses_one_cast_copy():
    """Logits from a bfloat16-stored frozen head are float32 and equal the float32 product of the
    bfloat16 values; the float32 copy is made once and renewed when the weight changes in place."""
    from zfree.models import head

    base, _ = tiny_gpt2()
    m = copy.deepcopy(base).requires_grad_(False)
    store_frozen_weights(m, torch.bfloat16)
    h = torch.randn(5, 32)
    logits = logits_from_hidden(m, h)
    assert logits.dtype == torch.float32
    w = m.lm_head.weight
    torch.testing.assert_close(logits, h @ w.float().T, rtol=1e-6, atol=1e-5)
    first = head._ACC_WEIGHTS[w][1]
    logits_from_hidden(m, h)
    assert head._ACC_WEIGHTS[w][1] is first
    with torch.no_grad():
        w.mul_(2)
    torch.testing.assert_close(logits_from_hidden(m, h), h @ w.float().T, rtol=1e-6, atol=1e-5)


def test_tf32_is_switched_on_for_cuda_steps_only_and_restored():
    prev = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with tf32_matmuls("cpu"):
            assert torch.backends.cuda.matmul.allow_tf32 is False
        with tf32_matmuls("cuda"):
            assert torch.backends.cuda.matmul.allow_tf32 is True and torch.backends.cudnn.allow_tf32 is True
        assert torch.backends.cuda.matmul.allow_tf32 is False
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev


def test_a_bf16_lora_run_stops_and_resumes_over_its_bf16_body(tiny_run, tmp_path):
    """The partial checkpoint names the base as loaded (fp32 hash), and the resumed run stores its body in
    bf16 again: it resumes where it stopped and finishes with finite losses."""
    import math

    from zfree_lab.run.training import train_cvae

    data, base = tiny_run
    cfg = TrainConfig.from_flat(tiny_flat(data, base, device="cpu", precision="bf16", lora_rank=4, steps=2,
                                          eval_every=2, eval_rows=8, decode_rows=0, batch_size=4))
    assert train_cvae(cfg, tmp_path / "run", progress=False, stop_after=1) == {"stopped_at": 1}
    done = train_cvae(cfg, tmp_path / "run", progress=False)
    assert done["steps"] == 2 and math.isfinite(done["loss/val/objective"])
