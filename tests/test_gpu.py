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
from zfree.scoring import score_pairs

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
