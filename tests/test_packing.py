"""Packed rows (issue 56, item 2): a training step's z-free x-prefix pass and its decoder passes over the
y-region run as one forward over the batch's rows concatenated without padding, with position ids
restarting per row and a block mask (``zfree.models.packing.packed_prefix_suffix``), attention per row
segment (``segment_attention``). Checked on tiny random models of the architectures of
tests/test_architectures.py, in float64: the hidden states equal the padded passes', the decoder's per-token
log-probs at a zero latent the model's own logits (one unpadded row), the gradients the padded passes';
a row's outputs do not depend on the other rows or on the pad id; the CVAE's control and K-way steps equal
their padded selves; and where packing is not taken (``packing_problem``).
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch

from tests.test_architectures import CONFIGS, build, make_pairs, oracle
from zfree.data.batching import collate, encode_pairs
from zfree.data.pairs import Pair
from zfree.models import injection
from zfree.models.discrete import DiscreteCVAE
from zfree.models import packing
from zfree.models.injection import decoder_hidden_suffix, suffix_target_logprobs, zfree_pass
from zfree.models.packing import (PACKED_MODEL_TYPES, pack_bins, packed_layout, packed_prefix_suffix, packing_problem,
                                  segment_allowed, set_packing)
from zfree.models.loading import load_causal_lm

TOL = dict(atol=1e-10, rtol=1e-10)  # float64: the two layouts differ only in the reductions' order
#: architectures that compute parts in float32 whatever the weights' dtype (Gemma's RMSNorm and Cohere's
#: LayerNorm cast to float32, eager attention's softmax runs in float32): a last-bit difference of the
#: float64 inputs can move a float32 rounding, so the layouts agree to float32's precision there
F32_INSIDE = {"gemma", "gemma2-softcap-sliding", "gemma3-softcap-sliding", "cohere-logit-scale"}
TOL32 = dict(atol=1e-6, rtol=1e-5)
GRAD_TOL = dict(atol=1e-9, rtol=1e-8)


def tol(arch, grad: bool = False) -> dict:
    return TOL32 if arch["name"] in F32_INSIDE else GRAD_TOL if grad else TOL
N = 3  # decoded values per row


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def arch(request, tmp_path_factory):
    """A tiny random model of each architecture in float64, rows short enough for every sliding window
    (8: a window that bites is ``packing_problem``'s fallback, tested below) and rows as long as
    test_architectures' (longer than the windows)."""
    folder = build(request.param, tmp_path_factory.mktemp(request.param))
    model, tok = load_causal_lm(folder, device="cpu")
    model = model.double().eval()
    long = encode_pairs(tok, make_pairs())
    short = encode_pairs(tok, [Pair("s0", "5 6", "7 8 9"), Pair("s1", "1", "2"), Pair("s2", "3 4", "5"),
                               Pair("s3", "9", "8 7")])
    assert max(len(e.prefix_ids) + len(e.target_ids) for e in short) <= 8
    assert len({len(e.prefix_ids) for e in short}) > 1 and len({len(e.target_ids) for e in short}) > 1
    windowed = injection.sliding_window_of(model.config) is not None
    return dict(name=request.param, model=model, tok=tok, enc=short if windowed else long, long=long,
                windowed=bool(windowed))


def _width(model) -> int:
    return model.get_input_embeddings().weight.shape[1]


def _latents(model, B: int, n: int = N, scale: float = 0.3, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(B, n, _width(model), generator=g, dtype=torch.float64))


def _padded(model, batch, lat):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        h0, cache = zfree_pass(model, batch, prefix_only=True)
        hz, valid = decoder_hidden_suffix(model, batch, cache, lat, shared_prefix="on")
    return h0, hz, valid


def _prefix_mask(batch, width):
    return torch.arange(width)[None, :] < batch.prefix_len[:, None]


@pytest.mark.parametrize("segments", [True, False], ids=["by-segment", "dense-mask"])
def test_packed_hidden_states_equal_the_padded_passes(arch, segments):
    """The packed forward's prefix states and decoder states (n = 3 latent vectors) equal the padded x-prefix
    pass and suffix pass (shared prefix) at every position they define; also split over several packed
    sequences (a capacity of two rows' segments)."""
    model = arch["model"]
    batch = collate(arch["enc"], pad_id=0)
    lat = _latents(model, len(batch))
    h0, hz, valid = _padded(model, batch, lat)
    seg = [p + N * s for p, s in zip(*batch.host_lengths())]
    for capacity in (None, 2 * max(seg)):
        p0, pz, pv = packed_prefix_suffix(model, batch, lat, capacity=capacity, segments=segments)
        assert torch.equal(pv, valid) and p0.shape == h0.shape and pz.shape == hz.shape
        pm = _prefix_mask(batch, h0.shape[1])
        torch.testing.assert_close(p0[pm], h0[pm], **tol(arch))
        assert not p0[~pm].any()  # zero past each row's prefix
        sel = valid[:, None].expand(-1, N, -1)
        torch.testing.assert_close(pz[sel], hz[sel], **tol(arch))
        assert not pz[~sel].any()


def test_the_packed_prefix_and_its_suffix_passes_equal_the_padded_passes(arch):
    """``packed_prefix`` then ``packed_suffix`` (the hard-EM step's packed passes: the suffix reads the prefix's
    recorded keys and values, not a cache) give the padded x-prefix pass's and suffix pass's hidden states, for
    n = 3 latent vectors and on S cut to its first 2 tokens (``Batch.first_targets``) from the same prefix; a
    batch of other prefixes is refused."""
    model = arch["model"]
    if model.config._attn_implementation != "sdpa":
        with pytest.raises(ValueError, match="SDPA"):
            packing.packed_prefix(model, collate(arch["enc"], pad_id=0))
        return
    batch = collate(arch["enc"], pad_id=0)
    lat = _latents(model, len(batch))
    p0, prefix = packing.packed_prefix(model, batch)
    assert len(prefix.kv) == model.config.get_text_config().num_hidden_layers
    for b in (batch, batch.first_targets(2)):
        h0, hz, valid = _padded(model, b, lat)
        pz, pv = packing.packed_suffix(model, b, prefix, lat)
        pm = _prefix_mask(b, h0.shape[1])
        torch.testing.assert_close(p0[pm], h0[pm], **tol(arch))
        assert not p0[~pm].any() and torch.equal(pv, valid) and pz.shape == hz.shape
        sel = valid[:, None].expand(-1, N, -1)
        torch.testing.assert_close(pz[sel], hz[sel], **tol(arch))
        assert not pz[~sel].any()
    assert packing._PREFIX is None and packing._SEGMENTS is None
    with pytest.raises(ValueError, match="prefix lengths"):
        packing.packed_suffix(model, collate(arch["enc"][1:], pad_id=0), prefix, lat[1:])


def test_packed_step0_logprobs_equal_the_models_own_logits(arch):
    """At a zero latent the packed decoder is the base model: its per-token log-probs equal the model's own
    logits on each row alone, unpadded (float64; the oracle of tests/test_architectures.py)."""
    model = arch["model"]
    batch = collate(arch["enc"], pad_id=0)
    _, hz, valid = packed_prefix_suffix(model, batch, torch.zeros(len(batch), 2, _width(model), dtype=torch.float64))
    tlp, _ = suffix_target_logprobs(model, batch, hz, valid)
    for r, e in enumerate(arch["enc"]):
        want = oracle(model, list(e.prefix_ids + e.target_ids), len(e.target_ids))
        for s in range(2):
            got = -tlp[r, s][batch.target_mask[r]].detach().numpy()
            np.testing.assert_allclose(got, want, atol=tol(arch)["atol"] * 10, rtol=0, err_msg=f"{arch['name']} row {r} value {s}")


def test_packed_gradients_equal_the_padded_passes(arch):
    """The gradient of a loss of the decoder's log-probs and the separator states (what a step reads) with
    respect to the latents and every parameter equals the padded passes' (float64)."""
    model = arch["model"]
    batch = collate(arch["enc"], pad_id=0)
    grads = []
    for packed in (False, True):
        m = copy.deepcopy(model)
        lat = _latents(m, len(batch)).requires_grad_()
        h0, hz, valid = (packed_prefix_suffix(m, batch, lat) if packed else _padded(m, batch, lat))
        tlp, _ = suffix_target_logprobs(m, batch, hz, valid)
        sep = h0[torch.arange(len(batch)), batch.prefix_len - 1]
        w = torch.linspace(0.5, 1.5, N, dtype=torch.float64)[None, :, None]
        loss = (tlp * w).sum() + (sep ** 2).sum() * 0.1
        loss.backward()
        grads.append({"latents": lat.grad, **{n: p.grad for n, p in m.named_parameters() if p.grad is not None}})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 5
    for k in grads[0]:
        t = dict(tol(arch, grad=True))
        if arch["name"] in F32_INSIDE:  # float32 rounding, relative to the gradient's own scale
            t["atol"] = 1e-6 * max(1.0, float(grads[0][k].abs().max()))
        torch.testing.assert_close(grads[1][k], grads[0][k], **t, msg=lambda s: f"{k}: {s}")


def test_a_rows_packed_outputs_do_not_depend_on_the_other_rows_or_the_padding(arch):
    """Padding invariance: each row decodes the same alone, in the batch, with another pad id and beside a
    row of another length (float64, to the last bits of the reductions)."""
    model = arch["model"]
    enc = arch["enc"]
    lat = _latents(model, len(enc))
    _, hz, valid = packed_prefix_suffix(model, collate(enc, pad_id=0), lat)
    _, hz7, _ = packed_prefix_suffix(model, collate(enc, pad_id=7), lat)
    torch.testing.assert_close(hz7, hz, atol=0, rtol=0)  # the pad id is never read
    other = [e for e in arch["long" if not arch["windowed"] else "enc"] if e not in enc][:1] or enc[:1]
    for r in range(len(enc)):
        alone = collate([enc[r]], pad_id=0)
        _, h1, v1 = packed_prefix_suffix(model, alone, lat[r:r + 1])
        S = int(valid[r].sum())
        torch.testing.assert_close(h1[0, :, :S], hz[r, :, :S], **tol(arch))
        beside = collate([*other, enc[r]], pad_id=0)
        _, h2, _ = packed_prefix_suffix(model, beside, torch.cat([lat[:1], lat[r:r + 1]]))
        torch.testing.assert_close(h2[1, :, :S], hz[r, :, :S], **tol(arch))


def test_packing_problem_says_where_the_padded_passes_serve(arch):
    """Packing is taken on the CPU under "auto" for a tested model type with SDPA attention where no sliding
    window bites (prefix + |S| <= window); else the padded passes, with the reason."""
    model = arch["model"]
    long = collate(arch["long"], pad_id=0)
    assert packing_problem(model, long, "off") == "off"
    assert packing_problem(model, long.to("meta"), "auto") == "not on the CPU"
    sdpa = model.config._attn_implementation == "sdpa"
    if not sdpa:
        assert "SDPA" in packing_problem(model, long, "on")
    elif arch["windowed"]:
        assert "sliding window" in packing_problem(model, long, "auto")
        assert packing_problem(model, collate(arch["enc"], pad_id=0), "auto") is None
    else:
        assert packing_problem(model, long, "auto") is None
    assert model.config.model_type in PACKED_MODEL_TYPES


def test_an_untested_model_type_or_an_eager_attention_is_not_packed(arch):
    model = copy.deepcopy(arch["model"])
    batch = collate(arch["enc"], pad_id=0)
    model.config.model_type = "someone_elses"
    assert "not tested packed" in packing_problem(model, batch, "on")
    model = copy.deepcopy(arch["model"])
    model.set_attn_implementation("eager")
    assert "SDPA" in packing_problem(model, batch, "on")
    model = copy.deepcopy(arch["model"])
    model.base_model.compile(dynamic=True, backend="eager")  # nothing compiles until called
    assert "compiled" in packing_problem(model, batch, "on")


def test_segment_attention_runs_per_row_and_restores_the_model(monkeypatch):
    """Under SDPA the packed forward's attention runs per row segment (each segment's SDPA call sees its own
    keys only), and the model's attention setting and the module's segments are restored after."""
    from tests.tiny import tiny_gpt2

    model, tok = tiny_gpt2()
    model = model.double()
    enc = encode_pairs(tok, make_pairs(4))
    batch = collate(enc, pad_id=0)
    calls = []
    inner = packing.segment_attention

    def spy(module, query, *a, **k):
        calls.append([b - a_ for a_, b, _ in packing._SEGMENTS[0]])
        return inner(module, query, *a, **k)

    from transformers import AttentionInterface
    monkeypatch.setitem(AttentionInterface._global_mapping, packing.SEGMENT_ATTENTION, spy)
    impl = model.config._attn_implementation
    assert impl == "sdpa"
    packed_prefix_suffix(model, batch, _latents(model, len(batch), n=2))
    seg = [p + 2 * s for p, s in zip(*batch.host_lengths())]
    assert len(calls) == model.config.n_layer and sorted(calls[0]) == sorted(seg)
    assert model.config._attn_implementation == impl and packing._SEGMENTS is None


def test_the_segment_mask_and_the_bins():
    """A block reads its row's prefix without the z-free separator and itself causally; a prefix position its
    prefix causally. First fit, longest first: every row once, no bin over capacity but a row alone."""
    a = segment_allowed(3, 2, 2)  # prefix 0..2 (2 = separator), block 0: 3..4, block 1: 5..6
    assert a[:3, :3].tolist() == np.tril(np.ones((3, 3), bool)).tolist() and not a[:3, 3:].any()
    assert a[3].tolist() == [1, 1, 0, 1, 0, 0, 0] and a[4].tolist() == [1, 1, 0, 1, 1, 0, 0]
    assert a[5].tolist() == [1, 1, 0, 0, 0, 1, 0] and a[6].tolist() == [1, 1, 0, 0, 0, 1, 1]
    lengths = [5, 9, 3, 7, 2, 8]
    bins = pack_bins(lengths, 10)
    assert sorted(b for rows in bins for b in rows) == list(range(6))
    assert all(sum(lengths[b] for b in rows) <= 10 for rows in bins) and len(bins) == 4
    assert pack_bins([12, 3], 10) == [[0], [1]]
    bins, starts, seg = packed_layout([3, 4], [2, 1], 2)
    assert bins == [[0, 1]] and seg == [7, 6] and starts == {0: (0, 0), 1: (0, 7)}


def test_host_lengths_follow_the_batch():
    from tests.tiny import tiny_gpt2

    _, tok = tiny_gpt2()
    batch = collate(encode_pairs(tok, make_pairs(5)), pad_id=0)
    assert batch.host_lens == (tuple(batch.prefix_len.tolist()), tuple(batch.target_len.tolist()))
    cut = batch.first_targets(2)
    assert cut.host_lengths() == (tuple(cut.prefix_len.tolist()), tuple(cut.target_len.tolist()))
    assert batch.to("cpu").host_lens == batch.host_lens


@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize("step", ["control", "soft-optimal"])
def test_the_cvae_steps_equal_their_padded_selves(name, step, tmp_path):
    """The control step (``forward_given``) and the K-way soft step (``forward``, optimal posterior) with
    ``zfree_metrics=False`` pack (``DiscreteCVAE.packs``) and equal the padded step: decoder log-probs,
    router logits and every gradient (float64); with ``zfree_metrics`` (evaluation) nothing packs."""
    model0, tok = load_causal_lm(build(name, tmp_path), device="cpu")
    batch = collate(encode_pairs(tok, make_pairs()), pad_id=0)
    outs = []
    for mode in ("off", "on"):
        torch.manual_seed(0)
        src = "control" if step == "control" else "posterior"
        model = DiscreteCVAE(copy.deepcopy(model0), 1 if step == "control" else 4, "optimal",
                             latent_source=src).double()
        model.packing_mode = mode
        if model.given:
            model.set_given({i: 0 for i in batch.ids})
        with torch.no_grad():
            model.latent_embedding.weight.normal_(std=0.3)
            model.router_head.weight.normal_(std=0.3)
        assert model.packs(batch, zfree_metrics=False) == (mode == "on")
        assert not model.packs(batch, zfree_metrics=True)
        if step == "control":
            out = model.forward_given(batch, zfree_metrics=False)
            lp, prior = out.selected_logprobs, out.prior_logits
        else:
            out = model(batch, zfree_metrics=False)
            lp, prior = out.target_logprobs, out.prior_logits
        (lp.sum() + torch.log_softmax(prior, -1).sum()).backward()
        outs.append((lp.detach(), prior.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (lp0, pr0, g0), (lp1, pr1, g1) = outs
    torch.testing.assert_close(lp1, lp0, **TOL)
    torch.testing.assert_close(pr1, pr0, **TOL)
    assert g0.keys() == g1.keys()
    for k in g0:
        torch.testing.assert_close(g1[k], g0[k], atol=1e-9, rtol=1e-8, msg=lambda s: f"{k}: {s}")


def test_set_packing_validates_and_returns_the_previous_mode():
    prev = set_packing("off")
    try:
        assert packing.PACKING == "off"
        with pytest.raises(ValueError, match="packing="):
            set_packing("sometimes")
    finally:
        assert set_packing(prev) == "off"


#: hard-EM variants (posterior head, decoded value): 'optimal' has no head (posterior_argmax would be value 0),
#: the separate 'encoder' posterior reads the tokens, not the z-free y-region, so both steps pack
HARD_VARIANTS = [("optimal", "best"), ("encoder", "best"), ("encoder", "posterior_argmax")]


def _hard_cvae(backbone, features: str, mode: str, K: int = 4) -> DiscreteCVAE:
    """A hard-EM CVAE on a copy of ``backbone`` in float64 with trained-looking heads and latents (so the
    values and k* differ per row), packing ``mode``; the same parameters for every mode."""
    torch.manual_seed(0)
    model = DiscreteCVAE(copy.deepcopy(backbone), K, features).double()
    model.packing_mode = mode
    with torch.no_grad():
        model.latent_embedding.weight.normal_(std=0.3)
        model.router_head.weight.normal_(std=0.3)
        if model.posterior_head is not None:
            model.posterior_head.weight.normal_(std=0.3)
    return model


def _hard_step(model, batch, choose: str, estep: int, detached: bool):
    """``forward_selected`` of the training step (``zfree_metrics=False``) and the gradients of a loss of
    everything it returns with gradient (the selected log-probs, the router's and the posterior's logits)."""
    sel = model.forward_selected(batch, choose, estep, router_detached=detached, zfree_metrics=False)
    w = torch.linspace(0.5, 1.5, sel.selected_logprobs.shape[1], dtype=torch.float64)
    loss = (sel.selected_logprobs * w).sum() + torch.log_softmax(sel.out.prior_logits, -1)[:, 0].sum()
    if sel.out.posterior_logits is not None:
        loss = loss + (torch.log_softmax(sel.out.posterior_logits, -1) * w[:model.n_latent]).sum()
    loss.backward()
    return sel, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def _assert_same_selected(arch, padded, packed):
    (s0, g0), (s1, g1) = padded, packed
    assert torch.equal(s1.z, s0.z) and torch.equal(s1.k_star, s0.k_star)
    assert not s1.out.target_logprobs.requires_grad and s1.out.target_logprobs.shape == s0.out.target_logprobs.shape
    torch.testing.assert_close(s1.out.target_logprobs, s0.out.target_logprobs, **tol(arch))
    torch.testing.assert_close(s1.selected_logprobs.detach(), s0.selected_logprobs.detach(), **tol(arch))
    torch.testing.assert_close(s1.out.prior_logits.detach(), s0.out.prior_logits.detach(), **tol(arch))
    for a, b in ((s0.out.posterior_logits, s1.out.posterior_logits), (s0.out.features, s1.out.features)):
        assert (a is None) == (b is None)  # features: the encoder's (the head's input), else none (no probe)
        if a is not None:
            torch.testing.assert_close(b.detach(), a.detach(), **tol(arch))
    assert s1.out.zfree_target_logprobs is None
    assert g0.keys() == g1.keys() and any(k.startswith("backbone.") for k in g0)
    for k in g0:
        t = dict(tol(arch, grad=True))
        if arch["name"] in F32_INSIDE:  # float32 rounding, relative to the gradient's own scale
            t["atol"] = 1e-6 * max(1.0, float(g0[k].abs().max()))
        torch.testing.assert_close(g1[k], g0[k], **t, msg=lambda s: f"{k}: {s}")


def test_the_hard_em_step_equals_its_padded_self(arch, monkeypatch):
    """The hard-EM step (``forward_selected``, ``zfree_metrics=False``) over packed rows (``packed_prefix``,
    then ``packed_suffix`` for the K no-grad E-step blocks and the decoded value's block) equals the padded
    passes (prefix cache): the K-way log-probs (detached), k*, the decoded value, its log-probs, the router's
    and the posterior's logits and the gradient of every parameter, for each decoded value, an E-step on all
    of S and on its first 3 tokens (a cut here), and the router on the separator state with and without
    gradient (float64); the packed passes are taken wherever attention is SDPA (every architecture here
    but an eager one)."""
    from zfree.models import discrete

    taken = []
    monkeypatch.setattr(discrete, "packed_prefix", lambda *a: taken.append(1) or packing.packed_prefix(*a))
    batch = collate(arch["enc"], pad_id=0)
    assert max(batch.host_lengths()[1]) > 3  # estep 3 cuts S
    sdpa = arch["model"].config._attn_implementation == "sdpa"
    for features, choose in HARD_VARIANTS:
        models = {mode: _hard_cvae(arch["model"], features, mode) for mode in ("off", "on")}
        assert models["on"].packs(batch, zfree_metrics=False) == sdpa and not models["off"].packs(batch, False)
        for estep in (0, 3):
            for detached in (False, True):
                res = {}
                for mode, model in models.items():
                    model.zero_grad(set_to_none=True)
                    res[mode] = _hard_step(model, batch, choose, estep, detached)
                _assert_same_selected(arch, res["off"], res["on"])
                if detached:  # the router's loss reaches its head alone
                    assert "router_head.weight" in res["on"][1]
        if features == "optimal":
            assert len(set(res["on"][0].z.tolist())) > 1  # the rows decode different values
    assert len(taken) == (len(HARD_VARIANTS) * 4 if sdpa else 0)  # one packed prefix a step


def test_a_refused_hard_em_step_takes_the_padded_passes_and_equals_them(monkeypatch, tmp_path):
    """Where ``packing_problem`` refuses (eager attention, a sliding window shorter than a row), the hard-EM
    step under ``packing_mode='on'`` takes the padded passes (the packed ones are never called) and equals
    the step under 'off'."""
    from zfree.models import discrete

    def refused(*a, **k):
        raise AssertionError("packed pass taken where packing_problem refuses")

    monkeypatch.setattr(discrete, "packed_prefix", refused)
    monkeypatch.setattr(discrete, "packed_suffix", refused)
    monkeypatch.setattr(injection, "_WARNED", set())
    cases = []
    gpt2, tok = load_causal_lm(build("gpt2", tmp_path / "gpt2"), device="cpu")
    eager = copy.deepcopy(gpt2).double()
    eager.set_attn_implementation("eager")
    cases.append((eager, collate(encode_pairs(tok, make_pairs()), pad_id=0), "SDPA"))
    mistral, tok = load_causal_lm(build("mistral-window8", tmp_path / "mistral"), device="cpu")
    cases.append((mistral.double(), collate(encode_pairs(tok, make_pairs()), pad_id=0), "sliding window"))
    for backbone, batch, reason in cases:
        assert reason in packing_problem(backbone, batch, "on")
        res = {}
        for mode in ("off", "on"):
            model = _hard_cvae(backbone, "optimal", mode)
            assert not model.packs(batch, zfree_metrics=False)
            with warnings.catch_warnings():  # Mistral's window: the padded suffix takes the full pass (warned)
                warnings.simplefilter("ignore")
                res[mode] = _hard_step(model, batch, "best", 3, True)
        _assert_same_selected(dict(name="refused"), res["off"], res["on"])


@pytest.mark.parametrize("estep", [0, 3])
def test_the_packed_hard_em_step_forwards_each_rows_tokens_once_per_pass(estep, tmp_path):
    """The hard-EM step's decoder-layer tokens (a hook on every layer, as tests/test_step_passes.py) over packed
    rows are sum_b P_b + K e_b + |S_b| (the prefix once, K E-step blocks of e_b = min(|S_b|, estep) tokens,
    the decoded value's y-region), the padded passes' B (P_max + K min(L_max, estep) + L_max), and the
    backward forwards nothing again."""
    from tests.test_step_passes import LayerTokens
    from zfree.models.head import verify_head

    backbone, tok = load_causal_lm(build("llama", tmp_path), device="cpu")
    batch = collate(encode_pairs(tok, make_pairs()), pad_id=0)
    (P, S), K = (np.array(v) for v in batch.host_lengths()), 4
    e = np.minimum(S, estep) if estep else S
    assert len(set(P)) > 1 and len(set(S)) > 1 and (e < S).any() == bool(estep)
    want = {"off": len(P) * (P.max() + K * e.max() + S.max()), "on": int((P + K * e + S).sum())}
    assert want["on"] < want["off"]
    for mode in ("off", "on"):
        model = _hard_cvae(backbone, "optimal", mode, K)
        verify_head(model.backbone)  # its probe row (once per model) is not the step's
        count = LayerTokens(model.backbone)
        sel = model.forward_selected(batch, "best", estep, router_detached=True, zfree_metrics=False)
        forward = count.tokens
        (sel.selected_logprobs.sum() + sel.out.prior_logits.sum()).backward()
        count.remove()
        assert forward == want[mode] and count.tokens == forward, (mode, forward, want)


def _oracle_trajectory(base, tok, mode: str, steps: int = 3) -> tuple[list[float], dict]:
    """A label oracle (K = 4, a given value per row, distribution weighting) trained ``steps`` AdamW steps
    through ``step_objective`` (the training step's objective) under packing ``mode``, float64, on rows of
    mixed x and y lengths with a row drawn twice (batches are drawn with replacement); the gradient clipped
    to norm 1 over all parameters (the loop clips the router on its own; a given z's router gets no gradient here
    that the decoder's depends on). Dropout off (``eval``: the tiny configs keep GPT-2's 0.1, which would draw
    different masks for the two layouts). Returns (the step losses, the parameters after)."""
    from zfree.config import TrainConfig
    from zfree.objective.objectives import GIVEN, step_objective
    from zfree_lab.run.run_setup import build_cvae
    pairs = make_pairs(9, seed=3)
    cfg = TrainConfig().replace(device="cpu", latent_source="label:strategy", n_latent=4, beta=0.0,
                                weighting="distribution")
    torch.manual_seed(0)
    model = build_cvae(cfg, copy.deepcopy(base)).double().eval()  # eval: the tiny configs' dropout off
    model.set_given({p.id: (3 * i + 1) % 4 for i, p in enumerate(pairs)})
    model.packing_mode = mode
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2)
    losses = []
    for s in range(steps):
        rows = [pairs[(s + j) % len(pairs)] for j in range(len(pairs))] + [pairs[s]]  # row s twice
        batch = collate(encode_pairs(tok, rows), pad_id=0)
        assert model.packs(batch, zfree_metrics=False) == (mode == "on")
        br = step_objective(GIVEN, model, batch, cfg, s + 1, 0.5, None, None)
        opt.zero_grad(set_to_none=True)
        br.total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(br.terms["reconstruction_loss"]))
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_a_label_oracle_trained_packed_follows_the_padded_trajectory(name, tmp_path):
    """Per-row given values on rows of mixed lengths (one drawn twice): three training steps packed and padded
    give the same losses and the same parameters after (float64), so a packed run is the padded run up to
    float rounding. Measured on the synthetic benchmark's embedding oracle (GPT-2, 4 layers, float32): the
    packed and padded losses of each of steps 1200-1800 on the step's own batch within 6e-8 nats/token and every
    parameter's gradient within 1e-4 relative (analysis/results/oracle-routes-synth/README.md)."""
    base, tok = load_causal_lm(build(name, tmp_path), device="cpu")
    (l0, p0), (l1, p1) = (_oracle_trajectory(base, tok, m) for m in ("off", "on"))
    assert l0[0] > 0 and l0[-1] < l0[0]  # it trains
    assert l1 == pytest.approx(l0, rel=1e-10, abs=1e-12)
    assert p0.keys() == p1.keys()
    for k in p0:
        torch.testing.assert_close(p1[k], p0[k], atol=1e-9, rtol=1e-8, msg=lambda s: f"{k}: {s}")
