"""zfree.objective.losses against references: torch.distributions for the KLs, cross-entropy for the NLL,
naive loops for the JSD, closed forms for the weights, schedules and effective beta, and
torch.autograd.gradcheck (float64) for every differentiable term."""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch.distributions import Categorical, Independent, Normal, kl_divergence
from torch.testing import assert_close

from zfree.config import ObjectiveConfig
from zfree.models.nll import masked_mean_token_nll
from zfree.objective.losses import (apply_free_bits, penalized_kl_dims, optimal_posterior_logits, beta_at_step, categorical_kl,
                                    effective_beta, gaussian_kl, inter_latent_jsd, reconstruction_weight,
                                    token_surprisal_shares, token_weights, weighted_mean_token_nll)

from zfree.objective.objectives import ObjectiveBreakdown, assemble_objective  # moved from zfree.objective.losses (issue 12)

F64 = torch.float64
seeds = st.integers(0, 2**31 - 1)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_mask(g: torch.Generator, batch: int, seq: int) -> torch.Tensor:
    """(batch, seq) bool mask with at least one True per row (a contiguous y-region, like batching)."""
    start = torch.randint(0, seq, (batch,), generator=g)
    length = torch.stack([torch.randint(1, seq - int(s) + 1, (1,), generator=g)[0] for s in start])
    pos = torch.arange(seq)[None, :]
    return (pos >= start[:, None]) & (pos < (start + length)[:, None])


def fake_batch(seed: int, B: int = 3, K: int = 4, T: int = 6, V: int = 5, dtype=F64):
    """Everything assemble_objective and the token terms need, from one seed."""
    g = gen(seed)
    mask = random_mask(g, B, T)
    return {
        "mask": mask,
        "tok_nll": torch.rand(B, K, T, generator=g, dtype=dtype) * 3,
        "base_tok": torch.rand(B, T, generator=g, dtype=dtype) * 2,
        "q_logits": torch.randn(B, K, generator=g, dtype=dtype),
        "p_logits": torch.randn(B, K, generator=g, dtype=dtype),
        "b": torch.rand(B, generator=g, dtype=dtype) + 0.1,
        "target_len": mask.sum(-1),
        "logp": torch.log_softmax(torch.randn(B, K, T, V, generator=g, dtype=dtype) * 2, -1),
    }


# ----------------------------------------------------------------------------- token NLL


@given(seed=seeds, B=st.integers(1, 4), T=st.integers(1, 7), V=st.integers(2, 6))
def test_masked_mean_token_nll_equals_cross_entropy_reference(seed, B, T, V):
    g = gen(seed)
    logits = torch.randn(B, T, V, generator=g, dtype=F64) * 3
    labels = torch.randint(0, V, (B, T), generator=g)
    mask = random_mask(g, B, T)
    token_nll = -torch.log_softmax(logits, -1).gather(-1, labels[..., None])[..., 0]
    got = masked_mean_token_nll(token_nll, mask)
    ignore = labels.masked_fill(~mask, -100)  # transformers' convention: -100 is not supervised
    ref = torch.stack([F.cross_entropy(logits[i], ignore[i], ignore_index=-100) for i in range(B)])
    assert_close(got, ref)


@given(seed=seeds, K=st.integers(1, 4))
def test_masked_mean_token_nll_latent_axis_matches_per_latent_calls(seed, K):
    d = fake_batch(seed, K=K)
    got = masked_mean_token_nll(d["tok_nll"], d["mask"])
    ref = torch.stack([masked_mean_token_nll(d["tok_nll"][:, k], d["mask"]) for k in range(K)], 1)
    assert_close(got, ref)


@pytest.mark.parametrize("garbage", [float("nan"), float("inf"), -1e30, 123.0])
def test_padding_garbage_changes_neither_value_nor_gradient(garbage):
    d = fake_batch(0)
    tok = d["tok_nll"].clone().requires_grad_(True)
    ref = masked_mean_token_nll(tok, d["mask"]).sum()
    (g_ref,) = torch.autograd.grad(ref, tok)
    # Append padded positions full of garbage (outside S) and also overwrite the existing ones.
    B, K, T = tok.shape
    pad = torch.full((B, K, 3), garbage, dtype=F64)
    tok2 = torch.cat([torch.where(d["mask"][:, None], d["tok_nll"], garbage), pad], -1).requires_grad_(True)
    mask2 = torch.cat([d["mask"], torch.zeros(B, 3, dtype=torch.bool)], -1)
    got = masked_mean_token_nll(tok2, mask2).sum()
    (g_got,) = torch.autograd.grad(got, tok2)
    assert_close(got, ref)
    assert_close(g_got[..., :T], torch.where(d["mask"][:, None], g_ref, 0.0))
    assert torch.all(g_got[..., T:] == 0)
    # weighted version and token weights too (base surprisal garbage outside S)
    base2 = torch.cat([torch.where(d["mask"], d["base_tok"], garbage), torch.full((B, 3), garbage, dtype=F64)], -1)
    w_ref = token_weights(d["base_tok"], d["mask"], 0.7)
    w_got = token_weights(base2, mask2, 0.7)
    assert_close(w_got[:, :T], w_ref)
    assert_close(weighted_mean_token_nll(tok2, mask2, w_got), weighted_mean_token_nll(d["tok_nll"], d["mask"], w_ref))


def test_empty_supervised_region_raises():
    mask = torch.tensor([[True, False], [False, False]])
    with pytest.raises(ValueError, match=r"rows \[1\]"):
        masked_mean_token_nll(torch.ones(2, 2), mask)


# ----------------------------------------------------------------------------- token weights


@given(seed=seeds, alpha=st.floats(0.0, 1.0))
def test_token_weights_sum_to_region_size_and_shares_to_one(seed, alpha):
    d = fake_batch(seed)
    w = token_weights(d["base_tok"], d["mask"], alpha)
    assert_close(w.sum(-1), d["mask"].sum(-1).to(F64))
    assert torch.all(w[~d["mask"]] == 0) and torch.all(w >= 0)
    s = token_surprisal_shares(d["base_tok"], d["mask"])
    assert_close(s.sum(-1), torch.ones(s.shape[0], dtype=F64))
    # closed form omega_t = (1 - alpha) + alpha |S| b_t / sum_S b
    bS = d["base_tok"] * d["mask"]
    ref = ((1 - alpha) + alpha * d["mask"].sum(-1, keepdim=True) * bS / bS.sum(-1, keepdim=True)) * d["mask"]
    assert_close(w, ref)


@given(seed=seeds)
def test_alpha_zero_reproduces_plain_nll_exactly(seed):
    d = fake_batch(seed)
    w = token_weights(d["base_tok"], d["mask"], 0.0)
    assert torch.equal(weighted_mean_token_nll(d["tok_nll"], d["mask"], w), masked_mean_token_nll(d["tok_nll"], d["mask"]))


def test_zero_base_surprisal_row_gets_uniform_weights():
    mask = torch.tensor([[True, True, False]])
    w = token_weights(torch.zeros(1, 3), mask, 1.0)
    assert_close(w, torch.tensor([[1.0, 1.0, 0.0]]))


@pytest.mark.parametrize("alpha", [-0.1, 1.5, float("nan")])
def test_token_alpha_outside_unit_interval_raises(alpha):
    with pytest.raises(ValueError, match="token_alpha"):
        token_weights(torch.ones(1, 2), torch.ones(1, 2, dtype=torch.bool), alpha)


# ----------------------------------------------------------------------------- KLs


@given(seed=seeds, B=st.integers(1, 5), K=st.integers(2, 8), scale=st.floats(0.01, 10.0))
def test_categorical_kl_equals_torch_distributions(seed, B, K, scale):
    g = gen(seed)
    q, p = (torch.randn(B, K, generator=g, dtype=F64) * scale for _ in range(2))
    ref = kl_divergence(Categorical(logits=q), Categorical(logits=p))
    got = categorical_kl(q, p)
    assert_close(got, ref)
    assert torch.all(got >= -1e-12)
    assert_close(categorical_kl(q, q + 3.0), torch.zeros(B, dtype=F64))  # logits are shift-invariant


@given(seed=seeds, B=st.integers(1, 4), D=st.integers(1, 6), scale=st.floats(0.01, 3.0))
def test_gaussian_kl_equals_torch_distributions(seed, B, D, scale):
    g = gen(seed)
    mu_q, lv_q, mu_p, lv_p = (torch.randn(B, D, generator=g, dtype=F64) * scale for _ in range(4))

    def normal(mu, lv):
        return Normal(mu, (0.5 * lv).exp())

    ref_learned = kl_divergence(Independent(normal(mu_q, lv_q), 1), Independent(normal(mu_p, lv_p), 1))
    assert_close(gaussian_kl(mu_q, lv_q, mu_p, lv_p), ref_learned)
    assert_close(gaussian_kl(mu_q, lv_q, mu_p, lv_p, per_dim=True), kl_divergence(normal(mu_q, lv_q), normal(mu_p, lv_p)))
    zeros = torch.zeros(B, D, dtype=F64)
    ref_std = kl_divergence(Independent(normal(mu_q, lv_q), 1), Independent(Normal(zeros, zeros + 1), 1))
    assert_close(gaussian_kl(mu_q, lv_q), ref_std)
    assert torch.all(gaussian_kl(mu_q, lv_q, mu_p, lv_p) >= -1e-12)
    assert_close(gaussian_kl(mu_q, lv_q, mu_q, lv_q), torch.zeros(B, dtype=F64))  # 0 at the prior


def test_gaussian_kl_matches_monte_carlo_within_three_standard_errors():
    g = gen(1)
    B, D, n = 4, 3, 20_000
    mu_q, lv_q, mu_p, lv_p = (torch.randn(B, D, generator=g, dtype=F64) * 0.7 for _ in range(4))
    q = Independent(Normal(mu_q, (0.5 * lv_q).exp()), 1)
    p = Independent(Normal(mu_p, (0.5 * lv_p).exp()), 1)
    z = mu_q + (0.5 * lv_q).exp() * torch.randn(n, B, D, generator=g, dtype=F64)
    samples = q.log_prob(z) - p.log_prob(z)  # (n, B): unbiased for KL(q || p)
    est, se = samples.mean(0), samples.std(0) / math.sqrt(n)
    exact = gaussian_kl(mu_q, lv_q, mu_p, lv_p)
    assert torch.all((est - exact).abs() <= 3 * se), (est, exact, se)


def test_gaussian_kl_needs_both_prior_parameters():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="mu_p and logvar_p"):
        gaussian_kl(x, x, mu_p=x)
    with pytest.raises(ValueError, match="mu_p and logvar_p"):
        gaussian_kl(x, x, logvar_p=x)


# ----------------------------------------------------------------------------- inter-latent JSD


def jsd_reference(logp: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Naive loops over examples and positions with torch.distributions entropies."""
    out = []
    for i in range(logp.shape[0]):
        pi = weights[i] / weights[i].sum()
        vals = []
        for t in range(logp.shape[2]):
            if not mask[i, t]:
                continue
            comps = [Categorical(probs=logp[i, k, t].exp()) for k in range(logp.shape[1])]
            mix = Categorical(probs=sum(pi[k] * comps[k].probs for k in range(len(comps))))
            vals.append(mix.entropy() - sum(pi[k] * comps[k].entropy() for k in range(len(comps))))
        out.append(torch.stack(vals).mean())
    return torch.stack(out)


@given(seed=seeds, K=st.integers(1, 4), V=st.integers(2, 5), sharp=st.floats(0.1, 5.0))
def test_inter_latent_jsd_matches_reference_and_bounds(seed, K, V, sharp):
    g = gen(seed)
    B, P = 3, 4
    logp = torch.log_softmax(torch.randn(B, K, P, V, generator=g, dtype=F64) * sharp, -1)
    w = torch.rand(B, K, generator=g, dtype=F64) + 0.05
    mask = random_mask(g, B, P)
    got = inter_latent_jsd(logp, w, mask)
    assert_close(got, jsd_reference(logp, w, mask))
    pi = w / w.sum(-1, keepdim=True)
    h_pi = -(pi * pi.log()).sum(-1)
    assert torch.all(got >= -1e-12)
    assert torch.all(got <= h_pi + 1e-12)
    assert torch.all(h_pi <= math.log(K) + 1e-12)


@given(seed=seeds, K=st.integers(1, 5))
def test_inter_latent_jsd_is_zero_when_all_latents_agree(seed, K):
    g = gen(seed)
    one = torch.log_softmax(torch.randn(2, 1, 3, 4, generator=g, dtype=F64), -1)
    got = inter_latent_jsd(one.expand(2, K, 3, 4), torch.rand(2, K, generator=g, dtype=F64) + 0.1,
                           torch.ones(2, 3, dtype=torch.bool))
    assert_close(got, torch.zeros(2, dtype=F64))


def test_inter_latent_jsd_reaches_log_k_for_disjoint_deterministic_latents():
    K = 3
    logp = torch.full((1, K, 2, K), -torch.inf, dtype=F64)
    for k in range(K):
        logp[0, k, :, k] = 0.0  # latent k puts all mass on token k (-inf elsewhere is allowed)
    got = inter_latent_jsd(logp, torch.ones(1, K, dtype=F64), torch.ones(1, 2, dtype=torch.bool))
    assert_close(got, torch.tensor([math.log(K)], dtype=F64))


@pytest.mark.parametrize("garbage", [float("nan"), float("inf"), -float("inf")])
def test_inter_latent_jsd_ignores_padded_positions(garbage):
    d = fake_batch(3)
    logp, w = d["logp"], torch.softmax(d["p_logits"], -1)
    ref = inter_latent_jsd(logp, w, d["mask"])
    bad = torch.where(d["mask"][:, None, :, None], logp, garbage).requires_grad_(True)
    got = inter_latent_jsd(bad, w, d["mask"])
    assert_close(got, ref)
    (grad,) = torch.autograd.grad(got.sum(), bad)
    assert torch.isfinite(grad).all()


def test_inter_latent_jsd_row_without_positions_raises():
    with pytest.raises(ValueError, match="no supervised position"):
        inter_latent_jsd(torch.zeros(1, 2, 3, 4), torch.ones(1, 2), torch.zeros(1, 3, dtype=torch.bool))


# ----------------------------------------------------------------------------- reconstruction weights


def test_reconstruction_weight_closed_forms_and_errors():
    b = torch.tensor([0.5, 2.0], dtype=F64)
    assert_close(reconstruction_weight("plain", batch_size=2), torch.ones(2))
    assert_close(reconstruction_weight("distribution", batch_size=2, c_base=0.25, dtype=F64), torch.full((2,), 4.0, dtype=F64))
    assert_close(reconstruction_weight("example", batch_size=2, b=b, epsilon=0.5), 1 / (b + 0.5))
    with pytest.raises(ValueError, match=r"'plain', 'distribution', 'example'"):
        reconstruction_weight("bogus", batch_size=2)
    for bad in (None, 0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="c_base"):
            reconstruction_weight("distribution", batch_size=2, c_base=bad)
    with pytest.raises(ValueError, match="epsilon"):
        reconstruction_weight("example", batch_size=2, b=b, epsilon=0.0)
    with pytest.raises(ValueError, match="needs the per-example base surprisal b"):
        reconstruction_weight("example", batch_size=2, epsilon=0.1)
    with pytest.raises(ValueError, match="shape"):
        reconstruction_weight("example", batch_size=3, b=b, epsilon=0.1)


def test_distribution_weight_is_exact_in_float64():
    """1/c_base used to be built in float32 and then cast, losing ~1e-8 relative in float64 runs."""
    c = 0.3
    br = assemble_objective(ObjectiveConfig(weighting="distribution"), c_base=c, **_assemble_args(fake_batch(0)))
    assert torch.equal(br.recon_weight, torch.full((3,), 1 / c, dtype=F64))


# ----------------------------------------------------------------------------- assemble_objective


def _assemble_args(d, recon=None):
    return {"recon_per_latent": masked_mean_token_nll(d["tok_nll"], d["mask"]) if recon is None else recon,
            "q_logits": d["q_logits"], "p_logits": d["p_logits"], "target_len": d["target_len"]}


def _grads_wrt_recon(cfg, d, **kw):
    recon = masked_mean_token_nll(d["tok_nll"], d["mask"]).clone().requires_grad_(True)
    args = {**_assemble_args(d, recon), **kw}
    br = assemble_objective(cfg, **args)
    (g,) = torch.autograd.grad(br.contributions["reconstruction_loss"], recon)
    return g, br


@given(seed=seeds, c_base=st.floats(0.01, 5.0))
def test_distribution_weighting_keeps_relative_example_weights(seed, c_base):
    """Seed 000: a global rescaling, not a reweighting. Gradient ratios between examples are those
    of plain; the whole gradient is plain's divided by c_base."""
    d = fake_batch(seed)
    g_plain, _ = _grads_wrt_recon(ObjectiveConfig(weighting="plain"), d)
    g_dist, _ = _grads_wrt_recon(ObjectiveConfig(weighting="distribution"), d, c_base=c_base)
    assert_close(g_dist, g_plain / c_base)
    assert_close(g_dist[0] / g_dist[1], g_plain[0] / g_plain[1])


@given(seed=seeds, eps=st.floats(1e-3, 1.0))
def test_example_weighting_gradient_is_grad_lbar_over_b_plus_eps(seed, eps):
    """Seed 002: grad(lbar / (b + eps)) = grad(lbar) / (b + eps), b frozen (even if it requires grad)."""
    d = fake_batch(seed)
    theta = d["tok_nll"].clone().requires_grad_(True)
    b = d["b"].clone().requires_grad_(True)
    br = assemble_objective(ObjectiveConfig(weighting="example", epsilon=eps), b=b,
                            **_assemble_args(d, masked_mean_token_nll(theta, d["mask"])))
    (g_got,) = torch.autograd.grad(br.contributions["reconstruction_loss"], theta, retain_graph=True)
    B = theta.shape[0]
    per_example = [torch.autograd.grad(br.per_example["lbar"][i], theta, retain_graph=True)[0] for i in range(B)]
    g_ref = sum(per_example[i] / (d["b"][i] + eps) for i in range(B)) / B
    assert_close(g_got, g_ref)
    assert b.grad is None


def test_ratio_of_means_differs_from_mean_of_ratios():
    """Seed 002, 'Relation to dataset-level normalization': E[l]/E[b] != E[l/(b+eps)]."""
    recon = torch.tensor([[1.0, 1.0], [1.0, 1.0]], dtype=F64)  # lbar = (1, 1) whatever q is
    b = torch.tensor([1.0, 4.0], dtype=F64)
    d = {"q_logits": torch.zeros(2, 2, dtype=F64), "p_logits": torch.zeros(2, 2, dtype=F64),
         "target_len": torch.tensor([3, 3])}
    dist = assemble_objective(ObjectiveConfig(weighting="distribution"), recon_per_latent=recon, c_base=float(b.mean()), **d)
    eps = 1e-9
    ex = assemble_objective(ObjectiveConfig(weighting="example", epsilon=eps), recon_per_latent=recon, b=b, **d)
    assert_close(dist.contributions["reconstruction_loss"], torch.tensor(1 / 2.5, dtype=F64))  # ratio of means
    assert_close(ex.contributions["reconstruction_loss"], torch.tensor((1 / (1 + eps) + 1 / (4 + eps)) / 2, dtype=F64))
    assert abs(float(ex.contributions["reconstruction_loss"]) - float(dist.contributions["reconstruction_loss"])) > 0.2


def _all_configs():
    return [
        (ObjectiveConfig(weighting="plain", beta=0.3), {}),
        (ObjectiveConfig(weighting="distribution", beta=0.7, lambda_jsd=0.2), {"c_base": 0.4}),
        (ObjectiveConfig(weighting="example", beta=1.3, epsilon=0.05, free_bits=0.2, free_bits_mode="per_example"),
         {"b": True}),
        (ObjectiveConfig(weighting="token", token_outer="distribution", beta=0.5), {"c_base": 0.4}),
        (ObjectiveConfig(weighting="token", token_outer="example", epsilon=0.1, beta=0.5,
                         free_bits=5.0, free_bits_mode="batch_mean"), {"b": True}),
    ]


def _kw(extra, d):
    kw = dict(extra)
    if kw.pop("b", False):
        kw["b"] = d["b"]
    return kw


@pytest.mark.parametrize("cfg,extra", _all_configs())
def test_contributions_sum_to_total_and_fractions_to_one(cfg, extra):
    d = fake_batch(5)
    jsd = inter_latent_jsd(d["logp"], torch.softmax(d["p_logits"], -1), d["mask"])
    br = assemble_objective(cfg, jsd=jsd, **_kw(extra, d), **_assemble_args(d))
    assert isinstance(br, ObjectiveBreakdown)
    assert_close(br.total, sum(br.contributions.values()))
    assert math.isclose(sum(br.fractions_abs().values()), 1.0, rel_tol=1e-12)
    assert set(br.terms) == {"reconstruction_loss", "kl_prior_loss", "decoder_jsd"}
    assert ("decoder_jsd" in br.contributions) == (cfg.lambda_jsd > 0)
    if cfg.lambda_jsd > 0:
        assert_close(br.contributions["decoder_jsd"], -cfg.lambda_jsd * jsd.mean())
    log = br.log_dict("loss/val")
    assert log["loss/val/total"] == float(br.total)
    assert {f"loss_contrib/fraction_abs/{k}" for k in br.contributions} <= set(log)
    assert {"objective/recon_weight_mean", "objective/beta_eff_median", "loss/val/kl_prior_loss"} <= set(log)
    # the raw terms are the unweighted batch means
    q = torch.softmax(d["q_logits"], -1)
    assert_close(br.terms["reconstruction_loss"], (q * _assemble_args(d)["recon_per_latent"]).sum(-1).mean())
    assert_close(br.terms["kl_prior_loss"], categorical_kl(d["q_logits"], d["p_logits"]).mean())


@pytest.mark.parametrize("cfg,extra", _all_configs())
def test_batch_permutation_changes_nothing(cfg, extra):
    d = fake_batch(6, B=5)
    jsd = inter_latent_jsd(d["logp"], torch.softmax(d["p_logits"], -1), d["mask"])
    br = assemble_objective(cfg, jsd=jsd, **_kw(extra, d), **_assemble_args(d))
    perm = torch.randperm(5, generator=gen(0))
    dp = {k: v[perm] for k, v in d.items()}
    brp = assemble_objective(cfg, jsd=jsd[perm], **_kw(extra, dp), **_assemble_args(dp))
    assert_close(brp.total, br.total)
    assert_close(brp.beta_eff, br.beta_eff[perm])
    for k in br.per_example:
        assert_close(brp.per_example[k], br.per_example[k][perm])


def test_lambda_jsd_without_jsd_raises():
    d = fake_batch(0)
    with pytest.raises(ValueError, match="lambda_jsd"):
        assemble_objective(ObjectiveConfig(lambda_jsd=0.1), **_assemble_args(d))


def test_token_weighting_outer_weight_follows_token_outer():
    d = fake_batch(2)
    none = assemble_objective(ObjectiveConfig(weighting="token"), **_assemble_args(d))
    assert_close(none.recon_weight, torch.ones(3, dtype=F64))
    dist = assemble_objective(ObjectiveConfig(weighting="token", token_outer="distribution"), c_base=0.5,
                              **_assemble_args(d))
    assert_close(dist.recon_weight, torch.full((3,), 2.0, dtype=F64))


# ----------------------------------------------------------------------------- effective beta


@given(seed=seeds, beta=st.floats(0.0, 10.0), c_base=st.floats(0.01, 5.0), eps=st.floats(1e-3, 1.0))
def test_effective_beta_closed_forms(seed, beta, c_base, eps):
    """docs/concepts/theory.md: beta_eff = beta |S| / w: plain beta|S|, distribution beta|S|c_base, example beta|S|(b+eps)."""
    d = fake_batch(seed)
    n = d["target_len"].to(F64)
    args = _assemble_args(d)
    plain = assemble_objective(ObjectiveConfig(beta=beta), **args)
    dist = assemble_objective(ObjectiveConfig(weighting="distribution", beta=beta), c_base=c_base, **args)
    ex = assemble_objective(ObjectiveConfig(weighting="example", beta=beta, epsilon=eps), b=d["b"], **args)
    assert_close(plain.beta_eff, beta * n)
    assert_close(dist.beta_eff, beta * n * c_base)
    assert_close(ex.beta_eff, beta * n * (d["b"] + eps))
    assert_close(effective_beta(beta, d["target_len"], ex.recon_weight), ex.beta_eff)


@given(seed=seeds, beta=st.floats(0.01, 10.0), c_base=st.floats(0.01, 5.0))
def test_sequence_objective_identity(seed, beta, c_base):
    """Multiplying one example's J = w lbar + beta K by |S|/w gives |S| lbar + beta_eff K."""
    d = fake_batch(seed)
    br = assemble_objective(ObjectiveConfig(weighting="distribution", beta=beta), c_base=c_base, **_assemble_args(d))
    n = d["target_len"].to(F64)
    lbar, kl = br.per_example["lbar"], br.per_example["kl"]
    J_i = br.recon_weight * lbar + beta * kl
    assert_close(J_i * n / br.recon_weight, n * lbar + br.beta_eff * kl)


# ----------------------------------------------------------------------------- schedules and free bits


def test_beta_schedules_closed_form():
    const = ObjectiveConfig(beta=0.8)
    assert [beta_at_step(const, s) for s in (0, 5, 10_000)] == [0.8, 0.8, 0.8]
    lin = ObjectiveConfig(beta=2.0, beta_schedule="linear", beta_warmup_steps=100)
    assert_close([beta_at_step(lin, s) for s in (0, 25, 50, 100, 1000)], [0.0, 0.5, 1.0, 2.0, 2.0])
    cyc = ObjectiveConfig(beta=1.0, beta_schedule="cyclical", beta_cycle_steps=10)
    # Fu et al. 2019 with R = 0.5: ramp over the first half of each period, then hold.
    expect = {0: 0.0, 1: 0.2, 2: 0.4, 4: 0.8, 5: 1.0, 9: 1.0, 10: 0.0, 13: 0.6, 25: 1.0}
    assert_close([beta_at_step(cyc, s) for s in expect], list(expect.values()))
    with pytest.raises(ValueError, match="step"):
        beta_at_step(lin, -1)
    ae = ObjectiveConfig(beta=2.0, beta_schedule="linear", beta_warmup_steps=100, ae_steps=30)  # AE phase first
    assert_close([beta_at_step(ae, s) for s in (0, 30, 55, 130, 1000)], [0.0, 0.0, 0.5, 2.0, 2.0])
    assert [beta_at_step(ObjectiveConfig(beta=0.8, ae_steps=3), s) for s in (3, 4)] == [0.0, 0.8]
    with pytest.raises(ValueError, match="ae_steps"):
        ObjectiveConfig(ae_steps=-1)


def test_free_bits_modes():
    kl = torch.tensor([0.1, 0.5, 2.0], dtype=F64, requires_grad=True)
    assert apply_free_bits(kl, 0.3, "none") is kl
    assert apply_free_bits(kl, 0.0, "per_example") is kl
    assert_close(apply_free_bits(kl, 0.3, "per_example"), torch.tensor([0.3, 0.5, 2.0], dtype=F64))
    (g,) = torch.autograd.grad(apply_free_bits(kl, 0.3, "per_example").sum(), kl)
    assert_close(g, torch.tensor([0.0, 1.0, 1.0], dtype=F64))
    # batch mean above the threshold: unchanged; below: mean clamped to lambda, no gradient
    assert_close(apply_free_bits(kl, 0.5, "batch_mean"), kl.detach())
    low = apply_free_bits(kl, 2.0, "batch_mean")
    assert_close(low.mean(), torch.tensor(2.0, dtype=F64))
    (g,) = torch.autograd.grad(low.mean(), kl)
    assert_close(g, torch.zeros(3, dtype=F64))
    zero = torch.zeros(3, dtype=F64, requires_grad=True)
    out = apply_free_bits(zero, 0.5, "batch_mean")
    assert_close(out.mean(), torch.tensor(0.5, dtype=F64))
    (g,) = torch.autograd.grad(out.mean(), zero)
    assert_close(g, torch.zeros(3, dtype=F64))
    with pytest.raises(ValueError, match=r"'none', 'per_example', 'batch_mean'"):
        apply_free_bits(kl, 0.0, "bogus")


# ----------------------------------------------------------------------------- gradcheck (float64)


def test_gradcheck_every_term():
    g = gen(7)
    B, K, T, V, D = 2, 3, 4, 5, 3
    mask = random_mask(g, B, T)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=F64, requires_grad=True)

    assert torch.autograd.gradcheck(categorical_kl, (r(B, K), r(B, K)))
    assert torch.autograd.gradcheck(lambda a, b, c, e: gaussian_kl(a, b, c, e), (r(B, D), r(B, D), r(B, D), r(B, D)))
    assert torch.autograd.gradcheck(lambda a, b: gaussian_kl(a, b), (r(B, D), r(B, D)))
    assert torch.autograd.gradcheck(lambda lg, w: inter_latent_jsd(torch.log_softmax(lg, -1), w.exp(), mask),
                                    (r(B, K, T, V), r(B, K)))
    assert torch.autograd.gradcheck(lambda x: masked_mean_token_nll(x, mask), (r(B, K, T),))
    base = torch.rand(B, T, generator=g, dtype=F64)
    assert torch.autograd.gradcheck(lambda x: weighted_mean_token_nll(x, mask, token_weights(base, mask, 0.6)),
                                    (r(B, K, T),))
    target_len = mask.sum(-1)
    b = torch.rand(B, generator=g, dtype=F64) + 0.2
    for cfg, extra in _all_configs():
        kw = {"b": b} if extra.get("b") else {k: v for k, v in extra.items() if k != "b"}

        def total(recon, q, p, jsd, cfg=cfg, kw=kw):  # jsd's own gradient is checked above
            return assemble_objective(cfg, recon_per_latent=recon, q_logits=q, p_logits=p, target_len=target_len,
                                      jsd=jsd, **kw).total

        assert torch.autograd.gradcheck(total, (r(B, K).abs(), r(B, K), r(B, K), r(B).abs()))


# ----------------------------------------------------------------------------- runtime shape checks


@pytest.mark.skipif(os.environ.get("ZFREE_TYPECHECK", "1") == "0", reason="runtime checks disabled")
def test_runtime_shape_checks_are_active():
    """conftest.py installs jaxtyping + beartype: a mask of another batch size is a type error."""
    import jaxtyping

    with pytest.raises(jaxtyping.TypeCheckError):
        masked_mean_token_nll(torch.rand(2, 3), torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(jaxtyping.TypeCheckError):
        categorical_kl(torch.rand(2, 3), torch.rand(2, 4))


# ---------------------------------------------------------------------------- optimal posterior


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("beta", [0.05, 0.3, 1.0])
def test_optimal_posterior_minimizes_the_objective_in_closed_form(seed, beta):
    """At q* = softmax(log p - w r / beta), J_i = -beta log sum_k p_k exp(-w_i r_ik / beta) (float64),
    and no other q (random logits) gives a lower J_i."""
    g = torch.Generator().manual_seed(seed)
    B, K = 7, 5
    r = torch.rand(B, K, generator=g, dtype=torch.float64) * 2
    p_logits = torch.randn(B, K, generator=g, dtype=torch.float64)
    b = torch.rand(B, generator=g, dtype=torch.float64) + 0.2
    cfg = ObjectiveConfig(weighting="example", epsilon=0.05, beta=beta)
    br = assemble_objective(cfg, recon_per_latent=r, q_logits=None, p_logits=p_logits,
                            target_len=torch.full((B,), 6), b=b)
    w = 1 / (b + 0.05)
    closed = -beta * torch.logsumexp(torch.log_softmax(p_logits, -1) - w[:, None] * r / beta, -1)
    assert_close(br.per_example["weighted_recon"] + beta * br.per_example["kl"], closed)
    assert_close(br.per_example["q_logits"], optimal_posterior_logits(r, p_logits, w, beta))
    for _ in range(20):
        other = assemble_objective(cfg, recon_per_latent=r, q_logits=torch.randn(B, K, generator=g, dtype=torch.float64),
                                   p_logits=p_logits, target_len=torch.full((B,), 6), b=b)
        j_other = other.per_example["weighted_recon"] + beta * other.per_example["kl"]
        assert (j_other >= closed - 1e-12).all()


def test_optimal_posterior_detached_gradient_equals_total_gradient():
    """Envelope theorem: holding the optimal q fixed gives the same gradient (decoders and router)
    as differentiating through q*(r, p) (float64 autograd)."""
    g = torch.Generator().manual_seed(3)
    B, K, beta = 6, 4, 0.3
    r0 = torch.rand(B, K, generator=g, dtype=torch.float64)
    p0 = torch.randn(B, K, generator=g, dtype=torch.float64)
    cfg = ObjectiveConfig(weighting="distribution", beta=beta)
    grads = []
    for detached in (True, False):
        r, p = r0.clone().requires_grad_(), p0.clone().requires_grad_()
        if detached:
            q_logits = None
        else:  # the same q*, differentiable in r and p
            q_logits = torch.log_softmax(p, -1) - (1 / 0.5) * r / beta
        br = assemble_objective(cfg, recon_per_latent=r, q_logits=q_logits, p_logits=p,
                                target_len=torch.full((B,), 5), c_base=0.5)
        grads.append(torch.autograd.grad(br.total, (r, p)))
    assert_close(grads[0][0], grads[1][0])
    assert_close(grads[0][1], grads[1][1])


def test_optimal_posterior_at_beta_zero_is_the_argmin_and_negative_beta_raises():
    r = torch.tensor([[0.5, 0.2, 0.9], [0.1, 0.3, 0.2]])
    q = torch.softmax(optimal_posterior_logits(r, torch.zeros(2, 3), torch.ones(2), 0.0), -1)
    assert q.argmax(-1).tolist() == [1, 0] and (q.max(-1).values > 0.999).all()
    with pytest.raises(ValueError, match="beta"):
        optimal_posterior_logits(r, torch.zeros(2, 3), torch.ones(2), -0.1)


def test_every_beta_schedule_the_config_accepts_has_a_formula_and_no_other():
    """config.BetaSchedule (what validation accepts) is the registry's names (what beta_at_step computes):
    a name in only one would pass validation and fail at the first step."""
    from typing import get_args

    from zfree.config import BetaSchedule
    from zfree.core.schedules import SCHEDULE_NAMES, SCHEDULES

    assert get_args(BetaSchedule) == SCHEDULE_NAMES == tuple(SCHEDULES)


@pytest.mark.parametrize("name", __import__("zfree.core.schedules", fromlist=["SCHEDULES"]).SCHEDULES)
def test_every_beta_schedule_runs_from_its_fields_and_refuses_without_them(name):
    """Each registry entry: with its fields at 10 steps (a period of 10, ratios at their defaults) beta stays in
    [0, beta] over two periods and is computed by beta_at_step; with its fields at 0 a schedule that reads a
    step count is refused by the config, naming the field."""
    from zfree.core.schedules import SCHEDULES

    entry = SCHEDULES[name]
    assert entry.source and entry.formula
    counts = {f: 10 for f in entry.fields if f.endswith("_steps")}
    cfg = ObjectiveConfig(beta=0.5, beta_schedule=name, **counts)
    betas = [beta_at_step(cfg, t) for t in range(21)]
    assert all(0.0 <= b <= 0.5 for b in betas) and betas == [entry.beta(cfg, t) for t in range(21)]
    for f in counts:
        with pytest.raises(ValueError, match=f):
            ObjectiveConfig(beta=0.5, beta_schedule=name, **{**counts, f: 0})


@pytest.mark.parametrize("name", __import__("zfree.core.free_bits", fromlist=["FREE_BITS_MODES"]).FREE_BITS_MODES)
def test_every_free_bits_mode_is_a_config_choice_with_a_penalty_on_its_latent_kinds(name):
    """Each registry entry is a choice of the config (``FreeBitsMode``), accepted on the latent kinds it names and
    refused on the others (naming ``free_bits_mode``); on each of them its penalized KL has one value per example
    and equals K where K is far above lambda (5 nats a dimension, lambda 0.5)."""
    from typing import get_args

    from zfree.config import FreeBitsMode, TrainConfig
    from zfree.core.free_bits import FREE_BITS_MODES

    entry = FREE_BITS_MODES[name]
    assert name in get_args(FreeBitsMode) and entry.source and entry.formula and entry.kinds
    fb = 0.0 if name == "none" else 0.5
    for kind in ("discrete", "continuous"):
        flat = {"free_bits_mode": name, "free_bits": fb, "latent_kind": kind}
        if kind not in entry.kinds:
            with pytest.raises(ValueError, match="free_bits_mode"):
                TrainConfig().replace(**flat)
            continue
        cfg = TrainConfig().replace(**flat).objective
        kl_dims = torch.full((3, 4), 5.0, dtype=torch.float64)
        pen = (penalized_kl_dims(kl_dims, cfg.free_bits, name) if kind == "continuous"
               else apply_free_bits(kl_dims.sum(-1), cfg.free_bits, name))
        assert pen.shape == (3,)
        assert_close(pen, kl_dims.sum(-1))  # K = 5 a dimension, far above lambda: nothing is waived
