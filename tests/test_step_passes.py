"""One pass where one is needed (issue 56, item 2): the body tokens a training step forwards, counted by
a hook on the body's decoder layers, and the lean step (``zfree_metrics=False``: the z-free pass over the
x-prefix alone where no posterior head reads y, no z-free head on y) equal to the full forward.

Rows of equal lengths, so padding adds nothing: P = |[bos] x sep| = 5, |S| = |y eos| = 4, T = P + |S| = 9.
The ideal step forwards P + n |S| tokens per row: the x-prefix once, then the y-region (from the separator)
once per decoded value, n = 1 for a given z, K for the soft step; the hard-EM step adds the decoded value's
pass (K no-grad passes plus one with gradient). A posterior head that pools the z-free y-region
(``mean_y``) needs the z-free pass over (x, y): T + K |S|.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.tiny import tiny_gpt2
from zfree.config import TrainConfig
from zfree.data.batching import collate, encode_pair
from zfree.data.pairs import Pair
from zfree.models.discrete import DiscreteCVAE
from zfree.models.head import verify_head
from zfree.models.routes import decoder_layers
from zfree.objective.objectives import GIVEN, Phase, step_objective
from zfree_lab.run.run_setup import build_cvae

EQUAL = [Pair("a", "1 2 3", "3 2 1"), Pair("b", "4 5 6", "6 5 4"), Pair("c", "7 8 9", "9 8 7"),
         Pair("d", "1 1 2", "2 1 1")]
B, P, S, K = 4, 5, 4, 4
T = P + S


@pytest.fixture(scope="module")
def lm():
    base, tok = tiny_gpt2()
    batch = collate([encode_pair(tok, p) for p in EQUAL], pad_id=tok.pad_token_id)
    assert batch.input_ids.shape == (B, T) and batch.prefix_len.tolist() == [P] * B
    assert batch.target_len.tolist() == [S] * B
    return base, batch


class LayerTokens:
    """Token positions through the body per step: every decoder layer's input (batch x positions),
    summed, divided by the number of layers."""

    def __init__(self, backbone):
        self.layers = decoder_layers(backbone)
        self.n = 0

        def pre(module, args, kwargs):
            h = args[0] if args else kwargs["hidden_states"]
            self.n += h.shape[0] * h.shape[1]

        self.handles = [layer.register_forward_pre_hook(pre, with_kwargs=True) for layer in self.layers]

    @property
    def tokens(self) -> float:
        return self.n / len(self.layers)

    def remove(self):
        for h in self.handles:
            h.remove()


#: step -> (phase, config fields, body tokens per row of the step, forward only)
STEPS = {
    "control": (GIVEN, {"latent_source": "control", "n_latent": 1, "beta": 0.0}, P + S),
    "soft-optimal": ("discrete", {"n_latent": K, "posterior_features": "optimal"}, P + K * S),
    "soft-mean_y": ("discrete", {"n_latent": K, "posterior_features": "mean_y"}, T + K * S),
    "hard-optimal": (Phase.HARD, {"n_latent": K, "posterior_features": "optimal", "aid": "hard_em_then_soft"},
                     P + K * S + S),
    "oracle": (GIVEN, {"latent_source": "label:strategy", "n_latent": K, "beta": 0.0}, P + S),
    "continuous-encoder": ("continuous", {"latent_kind": "continuous", "n_samples": 2,
                                          "posterior_features": "encoder"}, P + 2 * S),
    "continuous-mean_y": ("continuous", {"latent_kind": "continuous", "n_samples": 2}, T + 2 * S),
}


def _model(base, fields):
    cfg = TrainConfig().replace(device="cpu", weighting="plain", **fields)
    torch.manual_seed(0)
    model = build_cvae(cfg, copy.deepcopy(base))
    if cfg.model.latent_source != "posterior":
        model.set_given({p.id: i % model.n_latent for i, p in enumerate(EQUAL)})
    return model, cfg


@pytest.mark.parametrize("name", sorted(STEPS))
def test_a_training_step_forwards_the_prefix_once_and_y_once_per_decoded_value(lm, name):
    """The control's step is one pass over (x, y): |x| + |y| tokens a row, not the z-free pass over (x, y)
    and y again with z (T + |S| = 13 here); the K-way soft step |x| + K |y|."""
    base, batch = lm
    phase, fields, per_row = STEPS[name]
    model, cfg = _model(base, fields)
    verify_head(model.backbone)  # its probe row (once per model) is not the step's
    count = LayerTokens(model.backbone)
    br = step_objective(phase, model, batch, cfg, 1, 2.0, None, None)
    forward = count.tokens
    br.total.backward()
    count.remove()
    assert forward == B * per_row, (name, forward / B, per_row)
    assert count.tokens == forward  # backward re-runs no forward (no checkpointing of the body)


@pytest.mark.parametrize("name", sorted(STEPS))
def test_the_lean_step_equals_the_full_forward(lm, name):
    """``zfree_metrics=False`` changes what is computed, not the values the step reads: the decoder's
    log-probs, the posterior and router logits equal the full forward's (float64: the prefix-only pass
    differs from the full pass only in the last bits of the reductions over its shorter rows)."""
    base, batch = lm
    phase, fields, _ = STEPS[name]
    model, _ = _model(copy.deepcopy(base).double(), fields)  # heads built in the backbone's float64
    with torch.no_grad():  # a trained latent, so the values differ
        for p in model.parameters():
            if p.dim() == 2 and not any(p is q for q in model.backbone.parameters()):
                p.normal_(std=0.3)
    if phase == GIVEN:
        full, lean = model.forward_given(batch), model.forward_given(batch, zfree_metrics=False)
        pairs = [(full.selected_logprobs, lean.selected_logprobs), (full.prior_logits, lean.prior_logits)]
        assert lean.zfree_target_logprobs is None and lean.features is None and full.features is not None
    elif phase == Phase.HARD:
        full, lean = model.forward_selected(batch), model.forward_selected(batch, zfree_metrics=False)
        pairs = [(full.selected_logprobs, lean.selected_logprobs), (full.out.prior_logits, lean.out.prior_logits),
                 (full.out.target_logprobs, lean.out.target_logprobs)]
        assert torch.equal(full.z, lean.z) and lean.out.zfree_target_logprobs is None
    elif phase == "continuous":
        z = torch.randn(B, 2, model.d_latent, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        full, lean = model(batch, z=z), model(batch, z=z, zfree_metrics=False)
        pairs = [(full.target_logprobs, lean.target_logprobs), (full.posterior_mean, lean.posterior_mean),
                 (full.prior_mean, lean.prior_mean)]
        assert lean.zfree_target_logprobs is None
    else:
        full, lean = model(batch), model(batch, zfree_metrics=False)
        pairs = [(full.target_logprobs, lean.target_logprobs), (full.prior_logits, lean.prior_logits)]
        if model.posterior_kind == "amortized":
            pairs.append((full.posterior_logits, lean.posterior_logits))
        assert lean.zfree_target_logprobs is None
    for a, b in pairs:
        torch.testing.assert_close(b, a, atol=1e-12, rtol=0)


@pytest.mark.parametrize("injection", ["embedding", "mid", "memory", "prefix"])
@pytest.mark.parametrize("name", ["control", "soft-optimal"])
def test_every_injection_route_decodes_the_same_from_the_prefix_only_pass(lm, name, injection):
    """The routes read the x-prefix's cache slots only (``zfree.models.injection.prefix_cache``), so the
    prefix-only z-free pass serves each (float64, as above); the step forwards P + n (|S| + the route's
    extra positions: prefix's soft token) tokens a row."""
    base, batch = lm
    phase, fields, per_row = STEPS[name]
    model, cfg = _model(copy.deepcopy(base).double(), fields)
    torch.manual_seed(0)  # the route on a model of its own (training refuses 'prefix' for now: its reference)
    model = DiscreteCVAE(copy.deepcopy(base).double(), cfg.model.n_latent, cfg.model.posterior_features,
                         latent_source=cfg.model.latent_source, injection=injection).double()
    if model.given:
        model.set_given({p.id: i % model.n_latent for i, p in enumerate(EQUAL)})
    with torch.no_grad():
        model.latent_embedding.weight.normal_(std=0.3)
        if phase == GIVEN:
            a, b = model.forward_given(batch).selected_logprobs, model.forward_given(batch, zfree_metrics=False).selected_logprobs
        else:
            a, b = model(batch).target_logprobs, model(batch, zfree_metrics=False).target_logprobs
    torch.testing.assert_close(b, a, atol=1e-12, rtol=0)
    verify_head(model.backbone)
    count = LayerTokens(model.backbone)
    step_objective(phase, model, batch, cfg, 1, 2.0, None, None).total.backward()
    count.remove()
    n = 1 if phase == GIVEN else K
    assert count.tokens == B * (per_row + (n if injection == "prefix" else 0)), (injection, count.tokens / B)
