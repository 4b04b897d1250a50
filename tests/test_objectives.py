"""zfree.objective.objectives: one assembler for every latent kind and phase, its dispatch errors, and the
typed model outputs it reads (issue 12). References: hand-computed closed forms, float64."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from tests.tiny import SHORT_PAIRS as PAIRS
from zfree.config import ObjectiveConfig, TrainConfig
from zfree.data.synth import strategy_prior
from zfree.models.nll import masked_mean_token_nll
from zfree.models.discrete import DiscreteCVAE
from zfree.models.encoder import pool_posterior_features
from zfree.objective.objectives import KINDS, STEP_OBJECTIVES, assemble, hard_em_objective, step_objective

F64 = torch.float64


@pytest.fixture(scope="module")
def setup(tiny_lm):
    base, _, batch = tiny_lm(n_layer=1, seed=1, saved=True, pairs=PAIRS)
    return base, batch


def _cfg(**kw) -> TrainConfig:
    return TrainConfig.from_flat({**TrainConfig().to_flat(), **kw})


def test_unknown_kind_phase_and_pooling_name_the_valid_keys(setup):
    base, batch = setup
    cfg = ObjectiveConfig()
    with pytest.raises(KeyError, match=r"\[.continuous., .discrete., .given., .hard_em.\]"):
        assemble("vq", cfg, recon=torch.zeros(2, 3), target_len=torch.ones(2, dtype=torch.long))
    with pytest.raises(KeyError, match="continuous.*discrete.*hard"):
        step_objective("warm", None, batch, _cfg(), 1, 1.0, None, None)
    h = torch.zeros(len(PAIRS), batch.input_ids.shape[1], 32)
    with pytest.raises(KeyError, match="attention.*mean_y"):
        pool_posterior_features(torch.nn.Module(), "max", h, batch)
    with pytest.raises(ValueError, match="uniform.*x_dependent"):
        strategy_prior((1, 2), ["copy", "reverse"], "zipf", 3.0)
    assert set(KINDS) == {"discrete", "continuous", "hard_em", "given"}
    assert set(STEP_OBJECTIVES) == {"hard", "discrete", "continuous", "given"}


def test_discrete_assembly_equals_the_closed_form():
    """J = mean(w * sum_k q_k r_k) + beta * mean KL(q || p), with w = 1/c_base (float64, by hand)."""
    g = torch.Generator().manual_seed(0)
    r, q, p = (torch.rand(5, 3, generator=g, dtype=F64) for _ in range(3))
    c_base, beta = 0.7, 0.3
    br = assemble("discrete", ObjectiveConfig(weighting="distribution", beta=beta), recon=r,
                  target_len=torch.full((5,), 4), c_base=c_base, q_logits=q, p_logits=p)
    qs, ps = torch.softmax(q, -1), torch.softmax(p, -1)
    kl = (qs * (qs.log() - ps.log())).sum(-1)
    want = ((qs * r).sum(-1) / c_base).mean() + beta * kl.mean()
    torch.testing.assert_close(br.total, want)
    torch.testing.assert_close(sum(br.contributions.values()), br.total)
    torch.testing.assert_close(br.beta_eff, torch.full((5,), beta * 4 * c_base, dtype=F64))


def test_hard_em_uses_the_scheduled_beta_and_the_one_assembler(setup):
    """hard EM: contributions hard_reconstruction + posterior_ce + router_ce sum to the total; beta_eff
    comes from beta_at_step (0 during an AE phase), not from the unscheduled beta."""
    base, batch = setup
    torch.manual_seed(0)
    model = DiscreteCVAE(copy.deepcopy(base), 3)
    cfg = _cfg(weighting="distribution", beta=0.5, ae_steps=4, aid="hard_em_then_soft", hard_em_decoder="best")
    br = hard_em_objective(model, batch, cfg, 2, 0.8, None)
    assert list(br.contributions) == ["hard_reconstruction", "posterior_ce", "router_ce"]
    torch.testing.assert_close(sum(br.contributions.values()), br.total)
    assert torch.equal(br.beta_eff, torch.zeros_like(br.beta_eff))  # step 2 <= ae_steps: beta = 0
    later = hard_em_objective(model, batch, cfg, 9, 0.8, None)
    torch.testing.assert_close(later.beta_eff, 0.5 * batch.target_len.float() / later.recon_weight)


def test_forward_selected_returns_k_star_and_optimal_has_no_posterior_logits(setup):
    base, batch = setup
    torch.manual_seed(0)
    model = DiscreteCVAE(copy.deepcopy(base), 3).double()
    with torch.no_grad():
        model.latent_embedding.weight.normal_(std=0.5)
    sel = model.forward_selected(batch, "best")
    nll = masked_mean_token_nll(-model(batch).target_logprobs, batch.target_mask)
    assert torch.equal(sel.k_star, nll.argmin(-1)) and torch.equal(sel.z, sel.k_star)
    arg = model.forward_selected(batch, "posterior_argmax")
    assert torch.equal(arg.z, torch.softmax(arg.out.posterior_logits, -1).argmax(-1))
    with pytest.raises(KeyError, match="best.*posterior_argmax"):
        model.forward_selected(batch, "worst")
    opt = DiscreteCVAE(copy.deepcopy(base), 3, "optimal")
    assert opt.posterior_kind == "optimal" and model.posterior_kind == "amortized"
    assert opt(batch).posterior_logits is None
    br = hard_em_objective(opt, batch, _cfg(aid="hard_em_then_soft", posterior_features="optimal", n_latent=3), 1, 1.0,
                           None)
    assert br.terms["posterior_ce"].item() == 0.0  # one-hot on k*: nothing to learn
    assert math.isfinite(br.total.item())


def test_nonnegative_terms_are_reported_clipped_at_zero_and_the_objective_is_not():
    """A KL or JSD that rounding put below 0 is logged as 0 (both logging paths agree); the total
    and the contributions, which training differentiates, keep the raw values."""
    from zfree.objective.objectives import NONNEGATIVE_TERMS, ObjectiveBreakdown

    neg = torch.tensor(-4e-10, dtype=torch.float64)
    br = ObjectiveBreakdown(total=torch.tensor(1.5) + neg, terms={"reconstruction_loss": torch.tensor(-0.25),
                                                                    "kl_prior_loss": neg, "decoder_jsd": neg},
                            contributions={"reconstruction_loss": torch.tensor(1.5), "kl_prior_loss": neg},
                            recon_weight=torch.ones(2), beta_eff=torch.ones(2))
    assert {"kl_prior_loss", "decoder_jsd"} <= NONNEGATIVE_TERMS
    logged, tensors = br.log_dict(), br.log_tensors()
    for k in ("kl_prior_loss", "decoder_jsd"):
        assert logged[f"loss/train/{k}"] == 0.0 and float(tensors[f"loss/train/{k}"]) == 0.0
    assert logged["loss/train/reconstruction_loss"] == -0.25  # not a non-negative term: as is
    assert float(br.contributions["kl_prior_loss"]) < 0  # what training uses is untouched


def test_hard_em_in_chunks_with_the_step_weight_mean_is_the_full_batch_gradient(tiny_lm):
    """Gradient accumulation of the hard phase under example weights (w_i = 1/(b_i + eps), rescaled
    to mean 1/c_base over the batch: ``hard_em_recon_scale='c_base'``): chunks given the whole batch's
    mean w (``zfree.train.accumulate.batch_weight_mean``) sum to the full batch's gradient in float64;
    with each chunk's own mean they do not (the refusal this replaced)."""
    from zfree.data.batching import collate, encode_pair
    from zfree.train.accumulate import batch_weight_mean

    base, tok, _ = tiny_lm(n_layer=1, seed=1, saved=True, pairs=PAIRS)
    enc = [encode_pair(tok, p) for p in PAIRS]
    torch.manual_seed(0)
    model = DiscreteCVAE(copy.deepcopy(base), 3).double()
    cfg = _cfg(weighting="example", epsilon=0.05, aid="hard_em_then_soft", hard_em_recon_scale="c_base")
    n, c_base = len(enc), 0.8
    b = torch.linspace(0.3, 2.5, n, dtype=F64)  # spread base surprisals: the chunks' means differ

    def grads(chunks, w_mean):
        model.zero_grad(set_to_none=True)
        for idx in chunks:
            br = hard_em_objective(model, collate([enc[i] for i in idx], pad_id=0), cfg, 1, c_base, b[idx], w_mean=w_mean)
            (len(idx) / n * br.total).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    full = grads([list(range(n))], None)
    halves = [list(range(0, n // 2)), list(range(n // 2, n))]
    m = batch_weight_mean(cfg, c_base, b, n)
    torch.testing.assert_close(grads(halves, m), full, rtol=1e-9, atol=1e-12)
    assert not torch.allclose(grads(halves, None), full, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("c_base", [0.17, 0.8, 1.0, 2.97])
def test_hard_phase_reconstruction_weight_never_falls_below_plains(c_base):
    """Issue 55: the default ``hard_em_recon_scale`` (``at_least_plain``) gives the hard phase's
    reconstruction weight the batch mean max(1, 1/c_base): 1/c_base (the distribution scale) for the
    synthetic c_base 0.17, plain's 1 for SmolLM2's 2.97 (1/c_base would be 0.34); ``c_base`` keeps
    1/c_base. Each example's weight relative to the batch mean is the weighting's (example: 1/(b + eps))."""
    from zfree.objective.objectives import HARD_EM

    b = torch.tensor([0.2, 1.0, 3.0, 5.5], dtype=F64)
    w_rel = (1 / (b + 0.05)) / (1 / (b + 0.05)).mean()
    cfg = _cfg(weighting="example", epsilon=0.05, aid="hard_em_then_soft")
    for scale, want in ((cfg.aid.hard_em_recon_scale, max(1.0, 1 / c_base)), ("c_base", 1 / c_base)):
        br = assemble(HARD_EM, cfg.objective, recon=torch.ones(4, dtype=F64), target_len=torch.full((4,), 5),
                      c_base=c_base, b=b, q_logits=None, p_logits=torch.zeros(4, 3, dtype=F64),
                      k_star=torch.tensor([0, 1, 2, 0]), recon_scale=scale)
        torch.testing.assert_close(br.recon_weight.mean(), torch.tensor(want, dtype=F64), rtol=1e-14, atol=0)
        torch.testing.assert_close(br.recon_weight, want * w_rel, rtol=1e-14, atol=0)
    from zfree.objective.objectives import hard_em_recon_factor

    assert hard_em_recon_factor("weighting", c_base) is None
    with pytest.raises(KeyError, match="at_least_plain.*c_base.*weighting"):
        hard_em_recon_factor("mean", c_base)


def test_hard_phase_router_cross_entropy_reaches_the_router_head_only(setup):
    """Issue 55: under the optimal posterior the hard phase's router cross-entropy (weight 1) trains
    the router's head alone by default (``hard_em_router_features='detached'``); ``attached`` lets it
    reach the body through the separator state, as before."""
    base, batch = setup
    for features in ("detached", "attached"):
        torch.manual_seed(0)
        model = DiscreteCVAE(copy.deepcopy(base), 3, posterior_features="optimal").double()
        torch.nn.init.normal_(model.router_head.weight)  # a trained router (zero at init passes no gradient back)
        cfg = _cfg(aid="hard_em_then_soft", posterior_features="optimal", hard_em_decoder="best",
                   **({} if features == "detached" else {"hard_em_router_features": features}))  # the default
        br = hard_em_objective(model, batch, cfg, 1, 0.8, None)
        br.contributions["router_ce"].backward()
        body = [p.grad for n, p in model.named_parameters() if n.startswith("backbone.")]
        assert model.router_head.weight.grad.abs().sum() > 0
        if features == "detached":
            assert all(g is None or not g.any() for g in body)
        else:
            assert any(g is not None and g.abs().sum() > 0 for g in body)
