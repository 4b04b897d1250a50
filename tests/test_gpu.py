"""GPU tier (``-m gpu``; skipped without CUDA): scoring fp32 vs bf16, and the decoder's step-0
equality on CUDA for the architecture matrix. TF32 is switched off for the fp32 checks."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch

from test_architectures import ATOL, CONFIGS, build, make_pairs, oracle
from zfree.data.batching import collate, encode_pairs
from zfree.models.continuous import ContinuousCVAE
from zfree.models.discrete import DiscreteCVAE
from zfree.models.base import target_logprobs
from zfree.models.injection import decoder_hidden_suffix, suffix_target_logprobs, zfree_pass
from zfree.models.loading import load_causal_lm
from zfree.reference.reference import RHO0_TOL_LOW_PRECISION
from zfree.reference.scoring import score_pairs

pytestmark = pytest.mark.gpu
BF16_TOL = 0.05  # nats/token: |b_bf16 - b_fp32| per example (bf16 body, fp32 head and log-softmax)


@pytest.fixture(autouse=True)
def no_tf32():
    prev = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev


def test_scoring_fp32_vs_bf16_on_cuda(tmp_path):
    folder = build("llama", tmp_path / "m")
    pairs = make_pairs(20)
    m32, tok = load_causal_lm(folder, device="cuda", dtype="float32")
    m16, _ = load_causal_lm(folder, device="cuda", dtype="bfloat16")
    cpu, _ = load_causal_lm(folder, device="cpu", dtype="float32")
    r32, r16 = (score_pairs(m, tok, pairs, cache=False) for m in (m32, m16))
    rcpu = score_pairs(cpu, tok, pairs, cache=False)
    assert r32.settings["device"] == "cuda" and r16.settings["dtype"] == "bfloat16"
    np.testing.assert_allclose(r32.per_token["surprisal"], rcpu.per_token["surprisal"], atol=ATOL, rtol=0)
    diff = np.abs(r16.per_example["b"].to_numpy() - r32.per_example["b"].to_numpy())
    print(f"bf16 vs fp32: max |delta b| = {diff.max():.4g} nats/token")
    assert diff.max() <= BF16_TOL


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_decoder_step0_on_cuda_equals_the_float64_oracle(tmp_path, name):
    model, tok = load_causal_lm(build(name, tmp_path / name), device="cuda", dtype="float32")
    enc = encode_pairs(tok, make_pairs())
    want = [oracle(model.cpu(), list(e.prefix_ids + e.target_ids), len(e.target_ids)) for e in enc]
    model.cuda()
    batch = collate(enc, pad_id=0).to("cuda")
    lat = torch.zeros(len(enc), 2, model.get_input_embeddings().weight.shape[1], device="cuda")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, cache = zfree_pass(model, batch)
        tlp, _ = suffix_target_logprobs(model, batch, *decoder_hidden_suffix(model, batch, cache, lat))
    for r, w in enumerate(want):
        got = -tlp[r, 1][batch.target_mask[r]].double().cpu().numpy()
        np.testing.assert_allclose(got, w, atol=1e-4, rtol=0, err_msg=f"{name} row {r}")


@pytest.mark.parametrize("kind", ["discrete", "continuous"])
def test_cvae_step0_on_cuda(tmp_path, kind):
    model, tok = load_causal_lm(build("qwen3-sliding", tmp_path / "m"), device="cuda", dtype="float32")
    batch = collate(encode_pairs(tok, make_pairs()), pad_id=0).to("cuda")
    cvae = (DiscreteCVAE(copy.deepcopy(model), n_latent=3) if kind == "discrete"
            else ContinuousCVAE(copy.deepcopy(model), d_latent=4, n_samples=2)).to("cuda")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref, out = target_logprobs(model, batch), cvae(batch)
    for s in range(out.target_logprobs.shape[1]):
        torch.testing.assert_close(out.target_logprobs[:, s], ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_chunked_head_on_cuda_equals_the_whole_head_and_bounds_memory(precision):
    """Issue 24: the K-way step with the chunked head (the gradient Function, head_chunks._HeadLogprobs,
    replaying autocast on the autograd thread) under the body's precision gives the whole head's
    log-probs and gradients (head and log-softmax fp32 in both), and its peak CUDA memory stays
    below the whole head's (vocabulary 32 768, tiny body)."""
    from zfree.data.batching import EncodedPair
    from zfree.models.base import build_synthetic_gpt2
    from zfree.models.head_chunks import set_head_chunk
    from zfree.models.nll import masked_mean_token_nll
    from zfree.models.precision import body_autocast

    V = 32768
    rng = np.random.default_rng(0)
    batch = collate([EncodedPair(f"r{i}", tuple(rng.integers(5, V, 20).tolist()), tuple(rng.integers(5, V, 20).tolist()))
                     for i in range(32)], pad_id=0).to("cuda")
    cvae = DiscreteCVAE(build_synthetic_gpt2(V, n_layer=2, n_embd=64, n_head=4), n_latent=4).cuda()
    torch.nn.init.normal_(cvae.latent_embedding.weight, std=0.5)
    res = {}
    for elements in (None, 1 << 20):
        prev = set_head_chunk(elements)
        try:
            cvae.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            with body_autocast(precision, "cuda"):
                out = cvae(batch)
            loss = masked_mean_token_nll(-out.target_logprobs, batch.target_mask).mean()
            loss.backward()
            torch.cuda.synchronize()
            res[elements] = (out.target_logprobs.detach(), cvae.backbone.lm_head.weight.grad.clone(),
                             torch.cuda.max_memory_allocated() - before)
        finally:
            set_head_chunk(prev)
    (t0, g0, m0), (t1, g1, m1) = res[None], res[1 << 20]
    assert t1.dtype == torch.float32
    torch.testing.assert_close(t1, t0, atol=1e-5, rtol=0)
    rel = float((g1 - g0).norm() / g0.norm())  # tied head: includes the body's (bf16) embedding gradient
    assert rel <= (1e-5 if precision == "fp32" else 1e-2), rel
    print(f"{precision}: peak CUDA MiB whole head {m0 / 2**20:.0f}, chunked {m1 / 2**20:.0f}")
    assert m1 < 0.5 * m0


# ---------------------------------------------------------------------------- training on CUDA (issue 16)


def _train_cfg(data, base, **kw):
    """device left at "auto" (CUDA here); ``tiny_run`` is the session fixture of tests/conftest.py."""
    from tests.tiny import tiny_flat
    from zfree.config import TrainConfig

    return TrainConfig.from_flat(tiny_flat(data, base, **{"steps": 6, "eval_every": 3, **kw}))


@pytest.mark.parametrize("latent_kind", ["discrete", "continuous"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_short_training_run_on_cuda(tiny_run, tmp_path, precision, latent_kind):
    """device='auto' picks CUDA; a short run under each precision is finite, starts at the same
    step-0 evaluation as the CPU run (evaluation is fp32: 1e-5), and records device and precision."""
    import math

    from zfree.core.io import read_jsonl
    from zfree_lab.run.training import train_cvae

    data, base = tiny_run
    kw = dict(precision=precision, latent_kind=latent_kind, weighting="distribution", beta=0.3)
    gpu = train_cvae(_train_cfg(data, base, device="auto", **kw), tmp_path / "gpu", progress=False)
    cpu = train_cvae(_train_cfg(data, base, device="cpu", **{**kw, "precision": "fp32", "steps": 1, "eval_every": 1}),
                     tmp_path / "cpu", progress=False)
    assert gpu["device"] == "auto" and gpu["precision"] == precision
    key = "init/loss/val/baseline_normalized_reconstruction_loss"
    assert gpu[key] == pytest.approx(cpu[key], abs=1e-5)
    rows = read_jsonl(tmp_path / "gpu" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 3, 6]
    assert all(math.isfinite(r["loss/train/total"]) for r in rows[1:])


@pytest.mark.parametrize("name", ["discrete-token", "continuous-plain", "hard-em-example"])
def test_training_places_every_tensor_on_cuda(tiny_run, tmp_path, monkeypatch, name):
    """tests/test_device.py's placement check with the model on CUDA: every factory in a step names
    cuda and every op's output is on cuda (a host tensor would show here as an output on cpu)."""
    from test_device import STEP_CONFIGS, record_training

    data, base = tiny_run
    cfg = _train_cfg(data, base, device="cuda", steps=3, eval_every=3, eval_rows=8, decode_rows=4, batch_size=4,
                     **STEP_CONFIGS[name])
    step_bad, eval_bad = record_training(monkeypatch, cfg, tmp_path / "run", "cuda")
    assert not step_bad, step_bad[:5]
    assert not eval_bad, eval_bad[:5]


def test_training_step_has_no_explicit_host_read_on_cuda(tiny_run, tmp_path, monkeypatch):
    """tests/test_device.py's host-read check with the model on CUDA."""
    from test_device import record_host_reads

    data, base = tiny_run
    assert not record_host_reads(monkeypatch, _train_cfg(data, base, device="cuda"), tmp_path / "run", "cuda")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_lora_training_run_on_cuda(tiny_run, tmp_path, precision):
    """Issue 24: the LoRA decoder on CUDA under each precision: the step-0 evaluation equals the CPU
    full-weight run's (B = 0: the same function; evaluation is fp32 over an fp32 body, bf16 over the
    bf16-stored frozen body of a bf16 LoRA run (issue 56): within the step-0 rho check's low-precision
    tolerance there), the run is finite, only the adapters train in the backbone, and the checkpoint
    holds what trains (no frozen base weight)."""
    import math

    from safetensors.torch import load_file

    from zfree.core.io import read_jsonl
    from zfree_lab.run.training import train_cvae

    data, base = tiny_run
    kw = dict(precision=precision, weighting="distribution", beta=0.3, lora_rank=4)
    gpu = train_cvae(_train_cfg(data, base, device="cuda", **kw), tmp_path / "gpu", progress=False)
    cpu = train_cvae(_train_cfg(data, base, device="cpu", weighting="distribution", beta=0.3, steps=1, eval_every=1),
                     tmp_path / "cpu", progress=False)
    key = "init/loss/val/baseline_normalized_reconstruction_loss"
    assert gpu[key] == pytest.approx(cpu[key], abs=1e-5 if precision == "fp32" else RHO0_TOL_LOW_PRECISION)
    rows = read_jsonl(tmp_path / "gpu" / "metrics.jsonl")
    assert all(math.isfinite(r["loss/train/total"]) for r in rows[1:])
    tensors = {}
    for f in (tmp_path / "gpu" / "checkpoint").glob("*.safetensors"):
        tensors.update(load_file(f))
    backbone = [k for k in tensors if "backbone" in k]
    assert backbone and all("lora_" in k for k in backbone), backbone[:5]
