"""Chunked head log-probs (zfree.models.head_chunks): exact against the unchunked path and float64,
in both CVAEs, the hard-EM E-step and scoring; memory bounded by the chunk (live tensor bytes, a
deterministic measure: zfree.core.memory.LiveTensorBytes), not by K or the vocabulary. The gradient
Function (_HeadLogprobs): values and gradients against the whole head on tied, biased, soft-capped
and scaled heads of tiny transformers models, float64 gradcheck, LoRA, bf16, and a K-way CVAE step
against the checkpointed chunks it replaced."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import transformers as T

from zfree.core.memory import LiveTensorBytes
from zfree.data.batching import EncodedPair, collate
from zfree.models import head_chunks
from zfree.models.base import build_synthetic_gpt2, target_logprobs
from zfree.models.continuous import ContinuousCVAE
from zfree.models.discrete import DiscreteCVAE
from zfree.models.head_chunks import _grad_scheme, _whole_logprobs, head_chunk_rows, head_token_logprobs, set_head_chunk
from zfree.models.lora import apply_lora
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


# ------------------------------------------------- the gradient Function (_HeadLogprobs) vs the whole head

_V = 23
_LLAMA = dict(vocab_size=_V, num_hidden_layers=1, hidden_size=8, num_attention_heads=2, num_key_value_heads=1,
              intermediate_size=16, max_position_embeddings=32, bos_token_id=1, eos_token_id=2, pad_token_id=0)
#: head paths: tied / untied, bias, soft-capping, logit scaling (multiplied, divided);
#: name -> (config, std of the head weight: logits of a few nats after the cap or the scale)
HEADS = {
    "gpt2-tied": (lambda: T.GPT2Config(vocab_size=_V, n_layer=1, n_embd=8, n_head=2, n_positions=32), 1.0),
    "phi-bias": (lambda: T.PhiConfig(vocab_size=_V, num_hidden_layers=1, hidden_size=8, num_attention_heads=2,
                                     intermediate_size=16, max_position_embeddings=32), 1.0),
    "gemma2-softcap": (lambda: T.Gemma2Config(head_dim=4, final_logit_softcapping=2.0, **_LLAMA), 1.0),
    "cohere-scale-tied": (lambda: T.CohereConfig(logit_scale=0.25, **_LLAMA), 4.0),
    "granite-scaling": (lambda: T.GraniteConfig(logits_scaling=4.0, **_LLAMA), 4.0),
}


def _hf(name: str, dtype=torch.float32):
    """A tiny random model of ``name`` with a peaked head (the soft cap and the scale matter) and,
    where it has one, a random head bias."""
    make, std = HEADS[name]
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(make()).to(dtype)
    with torch.no_grad():
        out = model.get_output_embeddings()
        out.weight.normal_(std=std)
        if getattr(out, "bias", None) is not None:
            out.bias.normal_(std=1.0)
    return model


def test_in_place_softmaxes_equal_the_out_of_place_ops():
    """The Function overwrites each chunk in place (out= the input): bit for bit the new-tensor op,
    also with -inf logits (a masked vocabulary entry)."""
    g = torch.Generator().manual_seed(6)
    z = 5 * torch.randn(7, 301, generator=g)
    z[:, 3] = float("-inf")
    tok = torch.randint(4, 301, (7,), generator=g)
    buf = z.clone()
    got = head_chunks._log_softmax_(buf, tok)
    assert torch.equal(buf, torch.log_softmax(z, -1)) and torch.equal(got, buf[torch.arange(7), tok])
    buf = z.clone()
    torch.softmax(buf, -1, out=buf)
    assert torch.equal(buf, torch.softmax(z, -1))


def _logprob_grads(model, h, tok, w, fn):
    """(log-probs, d(w . log-probs)/d(hidden), {name: d/d param}) of ``fn(model, h, tok)``."""
    model.zero_grad(set_to_none=True)
    h = h.detach().requires_grad_(True)
    lp = fn(model, h, tok)
    (w * lp).sum().backward()
    return lp.detach(), h.grad, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", sorted(HEADS))
def test_function_values_and_gradients_equal_the_whole_head(name):
    """Hidden, head weight (the tied input embedding included), bias: 4-row chunks of 23 rows (the
    last one short), against log_softmax + gather over the whole head, float32."""
    model = _hf(name)
    D = model.get_output_embeddings().weight.shape[1]
    g = torch.Generator().manual_seed(1)
    h, tok, w = torch.randn(23, D, generator=g), torch.randint(0, _V, (23,), generator=g), torch.randn(23, generator=g)
    want = _logprob_grads(model, h, tok, w, _whole_logprobs)
    got = _logprob_grads(model, h, tok, w, lambda m, h, t: head_token_logprobs(m, h, t, elements=4 * _V))
    assert float(want[0].max() - want[0].min()) > 2.0  # peaked: a wrong cap or scale would show
    torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=1e-5)
    assert got[2].keys() == want[2].keys() and len(want[2]) in (1, 2)  # head weight (+ bias)
    for n in want[2]:
        torch.testing.assert_close(got[2][n], want[2][n], atol=1e-5, rtol=1e-5, msg=n)


@pytest.mark.parametrize("name", sorted(HEADS))
def test_function_gradcheck_float64(name):
    """torch.autograd.gradcheck in float64 over the hidden states and the head's own parameters
    (perturbed in place, so the model's head path sees them), 2-row chunks of 5 rows."""
    model = _hf(name, torch.float64)
    out = model.get_output_embeddings()
    params = [p for p in (out.weight, getattr(out, "bias", None)) if p is not None]
    D = out.weight.shape[1]
    g = torch.Generator().manual_seed(2)
    h = torch.randn(5, D, generator=g, dtype=torch.float64, requires_grad=True)
    tok = torch.randint(0, _V, (5,), generator=g)
    for p in model.parameters():
        p.requires_grad_(any(p is q for q in params))
    fn = lambda h, *ps: head_token_logprobs(model, h, tok, elements=2 * _V)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (h, *params), eps=1e-6, atol=1e-7)


def test_function_without_hidden_grad_and_with_a_frozen_head():
    """Only the head trains (hidden without grad), only the hidden does (head frozen), neither."""
    model = _hf("phi-bias")
    g = torch.Generator().manual_seed(3)
    h, tok = torch.randn(9, 8, generator=g), torch.randint(0, _V, (9,), generator=g)
    ref = _whole_logprobs(model, h, tok)
    ref.sum().backward()
    want_w = model.lm_head.weight.grad.clone()
    model.zero_grad(set_to_none=True)
    head_token_logprobs(model, h, tok, elements=2 * _V).sum().backward()  # h needs no grad
    torch.testing.assert_close(model.lm_head.weight.grad, want_w, atol=1e-5, rtol=1e-5)
    model.requires_grad_(False)
    hg = h.clone().requires_grad_(True)
    _whole_logprobs(model, hg, tok).sum().backward()
    hf = h.clone().requires_grad_(True)
    head_token_logprobs(model, hf, tok, elements=2 * _V).sum().backward()
    torch.testing.assert_close(hf.grad, hg.grad, atol=1e-5, rtol=1e-5)
    assert not head_token_logprobs(model, h, tok, elements=2 * _V).requires_grad  # nothing needs grad: no Function


def test_function_second_backward_with_retain_graph_recomputes():
    model = _hf("gpt2-tied")
    g = torch.Generator().manual_seed(7)
    h = torch.randn(10, 8, generator=g, requires_grad=True)
    tok = torch.randint(0, _V, (10,), generator=g)
    lp = head_token_logprobs(model, h, tok, elements=3 * _V)
    first = torch.autograd.grad(lp.sum(), h, retain_graph=True)[0]
    torch.testing.assert_close(torch.autograd.grad(lp.sum(), h)[0], first, atol=1e-6, rtol=0)


class _TanhHeadLlama(T.LlamaForCausalLM):
    """A head path ending in tanh: autograd saves the logits themselves (tanh's backward reads its
    output), so the Function must not overwrite them in place."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        out.logits = torch.tanh(out.logits)
        return out


def test_function_copies_logits_that_the_head_graph_saved():
    torch.manual_seed(0)
    model = _TanhHeadLlama(T.LlamaConfig(**_LLAMA))
    g = torch.Generator().manual_seed(4)
    h, tok, w = torch.randn(11, 8, generator=g), torch.randint(0, _V, (11,), generator=g), torch.randn(11, generator=g)
    want = _logprob_grads(model, h, tok, w, _whole_logprobs)
    got = _logprob_grads(model, h, tok, w, lambda m, h, t: head_token_logprobs(m, h, t, elements=3 * _V))
    for a, b in zip(got[:2], want[:2]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got[2]["lm_head.weight"], want[2]["lm_head.weight"], atol=1e-6, rtol=1e-5)


def test_function_under_bf16_autocast_and_with_bf16_weights():
    """bf16 autocast (CPU here; the Function replays the autocast state of forward in backward, on
    any device): equal to the checkpointed chunks under the same autocast, the head in float32.
    bf16 weights: float32 log-probs, gradients in bf16 equal to the whole head's to bf16 rounding."""
    batch = collate(_pairs(97, n=6), pad_id=0)
    res = {}
    for scheme in ("function", "checkpoint"):
        model = _model()
        with _grad_scheme(scheme), torch.autocast("cpu", dtype=torch.bfloat16):
            lp = target_logprobs(model, batch)
        res[scheme] = (lp.detach(), _grads(model, masked_mean_token_nll(-lp, batch.target_mask).sum()))
    assert res["function"][0].dtype == torch.float32
    torch.testing.assert_close(res["function"][0], res["checkpoint"][0], atol=1e-6, rtol=0)
    for n, gr in res["checkpoint"][1].items():
        torch.testing.assert_close(res["function"][1][n], gr, atol=1e-6, rtol=1e-4, msg=n)
    model = _model().to(torch.bfloat16)
    g = torch.Generator().manual_seed(5)
    h, tok = torch.randn(20, 16, generator=g).to(torch.bfloat16), torch.randint(0, 97, (20,), generator=g)
    w = torch.rand(20, generator=g)
    want = _logprob_grads(model, h, tok, w, _whole_logprobs)
    got = _logprob_grads(model, h, tok, w, lambda m, h, t: head_token_logprobs(m, h, t, elements=3 * 97))
    assert got[0].dtype == torch.float32 and got[1].dtype == torch.bfloat16
    torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(got[1], want[1], atol=1e-2, rtol=1e-2)
    wte = "transformer.wte.weight"
    torch.testing.assert_close(got[2][wte], want[2][wte], atol=1e-2, rtol=1e-2)


def test_lora_step_gradients_equal_the_whole_head():
    """LoRA (zfree.models.lora): the head frozen, gradients reach the adapters through the hidden
    states only."""
    batch = collate(_pairs(97, n=6), pad_id=0)
    res = {}
    for elements in (None, 3 * 97):
        model = _model()
        apply_lora(model, rank=2, alpha=4.0)
        for n, p in model.named_parameters():
            if "lora_B" in n:  # B = 0 at init: a random B makes the adapters' gradients all nonzero
                torch.nn.init.normal_(p, std=0.3)
        prev = set_head_chunk(elements)
        try:
            lp = target_logprobs(model, batch)
            res[elements] = _grads(model, masked_mean_token_nll(-lp, batch.target_mask).sum())
        finally:
            set_head_chunk(prev)
    assert res[None].keys() == res[3 * 97].keys() and all("lora_" in n for n in res[None]) and res[None]
    for n, gr in res[None].items():
        torch.testing.assert_close(res[3 * 97][n], gr, atol=1e-6, rtol=1e-5, msg=n)


@pytest.mark.parametrize("shared_prefix", [True, False])
def test_kway_step_gradients_equal_the_checkpoint_scheme(chunk3, shared_prefix):
    """The discrete CVAE's posterior-weighted K = 4 step (tied embedding, latent embedding, encoder):
    every parameter gradient through the Function equals the one through the checkpointed chunks
    (the scheme before it) and the whole head's."""
    batch = collate(_pairs(97, n=8), pad_id=0)
    res = {}
    for scheme in ("function", "checkpoint", "whole"):
        cvae = DiscreteCVAE(_model(), n_latent=4)
        cvae.shared_prefix = shared_prefix
        torch.nn.init.normal_(cvae.latent_embedding.weight, std=0.5)
        prev = set_head_chunk(None) if scheme == "whole" else None
        try:
            with _grad_scheme("checkpoint" if scheme == "checkpoint" else "function"):
                out = cvae(batch)
                res[scheme] = (out.target_logprobs.detach(), _grads(cvae, _soft_loss(out, batch)))
        finally:
            if scheme == "whole":
                set_head_chunk(prev)
    (t0, g0) = res["checkpoint"]
    for scheme in ("function", "whole"):
        t1, g1 = res[scheme]
        torch.testing.assert_close(t1, t0, atol=1e-6, rtol=0)
        assert g1.keys() == g0.keys() and "backbone.transformer.wte.weight" in g0
        for n in g0:
            torch.testing.assert_close(g1[n], g0[n], atol=1e-6, rtol=1e-5, msg=f"{scheme} {n}")
    with pytest.raises(KeyError, match="checkpoint"):
        with _grad_scheme("fused"):
            pass
