"""Chunked head log-probs (zfree.models.head_chunks): exact against the unchunked path and float64,
in both CVAEs, the hard-EM E-step and scoring; memory bounded by the chunk (live tensor bytes, a
deterministic measure: zfree.core.memory.LiveTensorBytes), not by K or the vocabulary."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from zfree.core.memory import LiveTensorBytes
from zfree.data.batching import EncodedPair, collate
from zfree.models import head_chunks
from zfree.models.base import build_synthetic_gpt2, target_logprobs
from zfree.models.continuous import ContinuousCVAE
from zfree.models.discrete import DiscreteCVAE
from zfree.models.head_chunks import head_chunk_rows, head_token_logprobs, set_head_chunk
from zfree.models.nll import masked_mean_token_nll
from zfree.reference.scoring import score_encoded


def _pairs(V: int, n: int = 6, seed: int = 0, lo: int = 2, hi: int = 9) -> list[EncodedPair]:
    rng = np.random.default_rng(seed)
    return [EncodedPair(f"r{i}", tuple(rng.integers(5, V, int(rng.integers(lo, hi))).tolist()),
                        tuple(rng.integers(5, V, int(rng.integers(1, hi))).tolist())) for i in range(n)]


def _model(V: int = 97, d: int = 16, dtype=torch.float32):
    return build_synthetic_gpt2(V, n_layer=1, n_embd=d, n_head=2, seed=3, dtype=dtype)


@pytest.fixture
def chunk3():
    """Chunks of 3 rows for the 97-token vocabulary (every batch here spans many chunks)."""
    prev = set_head_chunk(3 * 97)
    yield
    set_head_chunk(prev)


def _grads(module, loss):
    module.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


def test_chunk_rows_and_settings():
    assert head_chunk_rows(50_257, 1 << 22) == 83 and head_chunk_rows(10**9, 8) == 1
    assert head_chunk_rows(100, None) == head_chunks.HEAD_CHUNK_ELEMENTS // 100  # the module default
    prev = set_head_chunk(None)
    try:
        assert head_chunk_rows(100) is None
    finally:
        set_head_chunk(prev)
    with pytest.raises(ValueError, match="head chunk elements=0"):
        set_head_chunk(0)


def test_head_token_logprobs_equal_the_whole_head_and_float64():
    model = _model()
    g = torch.Generator().manual_seed(0)
    h = torch.randn(40, 16, generator=g, requires_grad=True)
    tok = torch.randint(0, 97, (40,), generator=g)
    w = torch.rand(40, generator=g)  # a row-weighted loss: the gradient differs per row
    whole = torch.log_softmax(model.lm_head(h), -1).gather(-1, tok[:, None]).squeeze(-1)  # today's path
    gw = torch.autograd.grad((w * whole).sum(), [h, model.lm_head.weight])
    got = head_token_logprobs(model, h, tok, elements=7 * 97)  # 6 chunks, the last one short
    gg = torch.autograd.grad((w * got).sum(), [h, model.lm_head.weight])
    torch.testing.assert_close(got, whole, atol=1e-6, rtol=0)
    for a, b in zip(gg, gw):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    m64 = copy.deepcopy(model).double()
    got64 = head_token_logprobs(m64, h.detach().double(), tok, elements=7 * 97)
    assert got64.dtype == torch.float64
    torch.testing.assert_close(got.detach().double(), got64, atol=1e-5, rtol=0)
    with torch.no_grad():  # no gradient: the plain chunk loop, same values
        torch.testing.assert_close(head_token_logprobs(model, h, tok, elements=5 * 97), got.detach(), atol=1e-6, rtol=0)


def test_step0_equals_the_models_own_logits_chunked(chunk3):
    model = _model()
    batch = collate(_pairs(97), pad_id=0)
    cvae = DiscreteCVAE(copy.deepcopy(model), n_latent=3)
    with torch.no_grad():
        out = cvae(batch)
        lp = torch.log_softmax(model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits, -1)
    want = torch.zeros_like(out.zfree_target_logprobs)
    want[:, 1:] = lp[:, :-1].gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1) * batch.target_mask[:, 1:]
    for k in range(3):
        torch.testing.assert_close(out.target_logprobs[:, k], want, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.zfree_target_logprobs, want, atol=1e-5, rtol=0)


def _soft_loss(out, batch):
    q = torch.softmax(out.posterior_logits, -1)
    return (q * masked_mean_token_nll(-out.target_logprobs, batch.target_mask)).sum()


@pytest.mark.parametrize("shared_prefix", [True, False])
def test_discrete_soft_step_chunked_equals_unchunked(shared_prefix):
    """Forward log-probs and every parameter gradient of a posterior-weighted K-way loss, with a
    trained-looking (random) latent embedding so the K values differ."""
    batch = collate(_pairs(97, n=8), pad_id=0)
    cvae = DiscreteCVAE(_model(), n_latent=4)
    cvae.shared_prefix = shared_prefix
    torch.nn.init.normal_(cvae.latent_embedding.weight, std=0.5)
    res = {}
    for elements in (None, 3 * 97):
        prev = set_head_chunk(elements)
        try:
            out = cvae(batch)
            res[elements] = (out.target_logprobs.detach(), _grads(cvae, _soft_loss(out, batch)))
        finally:
            set_head_chunk(prev)
    (t0, g0), (t1, g1) = res[None], res[3 * 97]
    torch.testing.assert_close(t1, t0, atol=1e-6, rtol=0)
    assert g0.keys() == g1.keys() and "backbone.transformer.wte.weight" in g0  # the tied head's weight
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], atol=1e-6, rtol=1e-5, msg=n)


def test_hard_em_estep_and_continuous_chunked_equal_unchunked():
    batch = collate(_pairs(97, n=8), pad_id=0)
    disc = DiscreteCVAE(_model(), n_latent=4)
    torch.nn.init.normal_(disc.latent_embedding.weight, std=0.5)
    cont = ContinuousCVAE(_model(), d_latent=3, n_samples=2)
    torch.nn.init.normal_(cont.latent_proj.weight, std=0.5)
    z = torch.randn(8, 2, 3, generator=torch.Generator().manual_seed(1))
    res = {}
    for elements in (None, 3 * 97):
        prev = set_head_chunk(elements)
        try:
            sel = disc.forward_selected(batch, "best")
            gd = _grads(disc, masked_mean_token_nll(-sel.selected_logprobs, batch.target_mask).sum())
            oc = cont(batch, z=z)
            gc = _grads(cont, masked_mean_token_nll(-oc.target_logprobs, batch.target_mask).sum())
            res[elements] = (sel.out.target_logprobs, sel.z, gd, oc.target_logprobs.detach(), gc)
        finally:
            set_head_chunk(prev)
    a, b = res[None], res[3 * 97]
    torch.testing.assert_close(b[0], a[0], atol=1e-6, rtol=0)  # the E-step's K-way log-probs (no grad)
    assert torch.equal(b[1], a[1])
    torch.testing.assert_close(b[3], a[3], atol=1e-6, rtol=0)
    for ga, gb in ((a[2], b[2]), (a[4], b[4])):
        for n in ga:
            torch.testing.assert_close(gb[n], ga[n], atol=1e-6, rtol=1e-5, msg=n)


def test_chunked_decoder_equals_scoring_and_float64(chunk3):
    enc = _pairs(97, n=7)
    model = _model()
    batch = collate(enc, pad_id=0)
    scored = score_encoded(model, enc, pad_id=0).per_token["surprisal"].to_numpy()
    m64 = copy.deepcopy(model).double()
    with torch.no_grad():
        got = -target_logprobs(model, batch)[batch.target_mask].double().numpy()
        got64 = -target_logprobs(m64, batch)[batch.target_mask].numpy()
    np.testing.assert_allclose(got, scored, atol=1e-5, rtol=0)  # same row order: row-major over S
    np.testing.assert_allclose(got, got64, atol=1e-5, rtol=0)


def _step_peak(cvae, batch) -> int:
    with LiveTensorBytes() as m:
        out = cvae(batch)
        _soft_loss(out, batch).backward()
        del out
    cvae.zero_grad(set_to_none=True)
    return m.peak


def test_peak_memory_is_bounded_by_the_chunk_not_by_k():
    """Vocabulary 4096, width 8: the (rows x vocab) logits dominate everything else. Unchunked, the
    K-way step's peak grows by several (N x V) tensors; chunked, its excess over the one-row-chunk
    floor (everything that is not the head's logits) stays within three chunks, whatever K, and
    shrinks with the chunk."""
    V, d = 4096, 8
    batch = collate(_pairs(V, n=8, lo=6, hi=12), pad_id=0)
    chunk = 16 * V  # 16 rows: 256 KiB of float32 logits
    peaks = {}
    for K in (2, 8):
        cvae = DiscreteCVAE(build_synthetic_gpt2(V, n_layer=1, n_embd=d, n_head=2, seed=0), n_latent=K)
        for elements in (None, chunk, chunk // 4, V):
            prev = set_head_chunk(elements)
            try:
                peaks[K, elements] = _step_peak(cvae, batch)
            finally:
                set_head_chunk(prev)
    n_rows = int(batch.target_len.sum()) * 8  # rows through the head in the K = 8 pass
    assert peaks[8, None] - peaks[8, V] >= 2 * n_rows * V * 4  # unchunked: the measure sees the logits
    for K in (2, 8):
        floor = peaks[K, V]
        assert floor < 2 << 20  # everything else: 2 MiB at most
        assert peaks[K, chunk] - floor <= 3 * chunk * 4, (K, peaks[K, chunk] - floor)
        assert peaks[K, chunk // 4] - floor <= 3 * chunk, (K, peaks[K, chunk // 4] - floor)
