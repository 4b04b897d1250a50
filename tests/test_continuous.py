"""Continuous CVAE: the step-0 contract, shared-prefix vs naive, the Gaussian objective against
references, a tiny training run with resume, and bad input."""

from __future__ import annotations

import copy
import json

import numpy as np
import pandas as pd
import pytest
import torch
from torch.distributions import Independent, Normal, kl_divergence

from tests.tiny import PAIRS, tiny_flat
from zfree.config import ModelConfig, ObjectiveConfig, TrainConfig
from zfree.core.io import read_json, read_jsonl
from zfree.objective.losses import free_bits_per_dim, gaussian_kl
from zfree.evaluate.latent_stats import active_units, gaussian_mutual_information
from zfree.models.base import target_logprobs
from zfree.objective.objectives import assemble
from zfree.models.continuous import ContinuousCVAE
from zfree.models.injection import injection_mask
from zfree_lab.run.run_folder import TIMING_KEYS
from zfree_lab.run.training import train_cvae


@pytest.fixture(scope="module")
def setup(tiny_lm):
    return tiny_lm(n_layer=2, seed=1)  # (base in eval mode, tok, batch of PAIRS)


@pytest.mark.parametrize("shared_prefix", [True, False])
@pytest.mark.parametrize("prior", ["learned", "standard"])
def test_decoder_equals_base_model_at_init_for_every_sample(setup, shared_prefix, prior):
    base, tok, batch = setup
    model = ContinuousCVAE(copy.deepcopy(base), d_latent=6, prior=prior, n_samples=3)
    model.shared_prefix = shared_prefix
    ref = target_logprobs(base, batch)
    sampled = model(batch)  # z ~ q
    forced = model(batch, z=5 * torch.randn(len(PAIRS), 2, 6))  # any z at all
    assert sampled.target_logprobs.shape == (len(PAIRS), 3, batch.input_ids.shape[1])
    for out in (sampled, forced):
        for s in range(out.z.shape[1]):
            torch.testing.assert_close(out.target_logprobs[:, s], ref, atol=1e-6, rtol=0)
    torch.testing.assert_close(sampled.zfree_target_logprobs, ref, atol=1e-6, rtol=0)
    if prior == "learned":  # zero-initialized prior head: N(0, I) at step 0
        assert sampled.prior_mean.abs().max() == 0 and sampled.prior_logvar.abs().max() == 0
    assert not torch.allclose(sampled.posterior_mean[0], sampled.posterior_mean[1])  # symmetry breaks


def test_shared_prefix_equals_naive_full_pass_per_sample(setup):
    base, tok, batch = setup
    model = ContinuousCVAE(copy.deepcopy(base), d_latent=4, n_samples=3)
    with torch.no_grad():
        model.latent_proj.weight.normal_(std=0.5)
    z = torch.randn(len(PAIRS), 3, 4)
    shared = model(batch, z=z)
    model.shared_prefix = False
    batched = model(batch, z=z)
    torch.testing.assert_close(shared.target_logprobs, batched.target_logprobs, atol=1e-5, rtol=0)
    emb_layer = model.backbone.get_input_embeddings()
    for s in range(3):
        emb = emb_layer(batch.input_ids) + injection_mask(batch)[..., None] * model.latent_proj(z[:, s])[:, None]
        naive = target_logprobs(model.backbone, batch, inputs_embeds=emb)
        torch.testing.assert_close(shared.target_logprobs[:, s], naive, atol=1e-5, rtol=0)
    assert not torch.allclose(shared.target_logprobs[:, 0], shared.target_logprobs[:, 1])


def test_reparameterized_samples_carry_gradient_and_follow_q(setup):
    base, tok, batch = setup
    model = ContinuousCVAE(copy.deepcopy(base), d_latent=3)
    mu = torch.tensor([[0.5, -1.0, 2.0]])
    logvar = torch.tensor([[0.0, -2.0, 1.0]])
    z = model.sample_posterior(mu, logvar, 20_000, torch.Generator().manual_seed(0))[0]  # (S, d)
    se = logvar.exp().sqrt()[0] / 20_000 ** 0.5
    assert ((z.mean(0) - mu[0]).abs() < 4 * se).all()  # 4-sigma interval of the sample mean
    model.latent_proj.weight.data.normal_()
    model(batch).target_logprobs.sum().backward()
    assert model.posterior_head.weight.grad.abs().sum() > 0  # through z = mu + sigma * eps


def test_gaussian_kl_matches_torch_distributions():
    g = torch.Generator().manual_seed(0)
    mq, lq, mp, lp = (torch.randn(5, 4, generator=g, dtype=torch.float64) for _ in range(4))
    q = Independent(Normal(mq, (0.5 * lq).exp()), 1)
    ref = kl_divergence(q, Independent(Normal(mp, (0.5 * lp).exp()), 1))
    torch.testing.assert_close(gaussian_kl(mq, lq, mp, lp), ref)
    ref0 = kl_divergence(q, Independent(Normal(torch.zeros_like(mq), torch.ones_like(mq)), 1))
    torch.testing.assert_close(gaussian_kl(mq, lq), ref0)
    torch.testing.assert_close(gaussian_kl(mq, lq, per_dim=True).sum(-1), ref0)


def test_free_bits_per_dim_value_and_gradient():
    kl = torch.tensor([[0.1, 2.0], [0.3, 4.0]], requires_grad=True)  # dim 0 mean 0.2 < 1, dim 1 mean 3 > 1
    out = free_bits_per_dim(kl, 1.0)
    torch.testing.assert_close(out.mean(), torch.tensor(1.0 + 3.0))
    out.mean().backward()
    torch.testing.assert_close(kl.grad, torch.tensor([[0.0, 0.5], [0.0, 0.5]]))
    torch.testing.assert_close(free_bits_per_dim(kl.detach(), 0.0), kl.detach().sum(-1))


def test_gaussian_objective_breakdown():
    g = torch.Generator().manual_seed(1)
    recon = torch.rand(3, 4, generator=g) + 1
    mq, lq = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    cfg = ObjectiveConfig(weighting="distribution", beta=0.5)
    br = assemble("continuous", cfg, recon=recon, mu_q=mq, logvar_q=lq, mu_p=None, logvar_p=None,
                  target_len=torch.tensor([3, 4, 5]), c_base=2.0)
    torch.testing.assert_close(br.per_example["lbar"], recon.mean(-1))
    torch.testing.assert_close(br.terms["kl_prior_loss"], gaussian_kl(mq, lq).mean())
    torch.testing.assert_close(br.total, recon.mean() / 2.0 + 0.5 * gaussian_kl(mq, lq).mean())
    torch.testing.assert_close(br.total, sum(br.contributions.values()))
    assert set(br.terms) == {"reconstruction_loss", "kl_prior_loss"}


def test_active_units_and_mutual_information():
    rng = np.random.default_rng(0)
    mu = np.concatenate([rng.normal(size=(200, 2)), np.full((200, 3), 0.3) + 1e-3 * rng.normal(size=(200, 3))], 1)
    assert active_units(mu) == 2
    collapsed = gaussian_mutual_information(np.zeros((100, 2)), np.zeros((100, 2)))
    separated = gaussian_mutual_information(np.repeat([[0.0], [20.0]], 50, 0), np.full((100, 1), -2.0))
    assert abs(collapsed) < 1e-9 and abs(separated - np.log(2)) < 1e-6


# ---------------------------------------------------------------------------- training


@pytest.fixture(scope="module")
def tiny(tiny_run):
    return tiny_run


def _cfg(data, base, **kw):
    return TrainConfig.from_flat(tiny_flat(data, base, **{"steps": 6, "eval_every": 3, "latent_kind": "continuous",
                                                          "d_latent": 4, "n_samples": 2, "device": "cpu", **kw}))


def test_continuous_run_folder_and_resume(tiny, tmp_path):
    data, base = tiny
    cfg = _cfg(data, base, weighting="distribution", beta=0.3, free_bits=0.05, free_bits_mode="per_dim")
    s = train_cvae(cfg, tmp_path / "run", progress=False)
    run = tmp_path / "run"
    for f in ("config.json", "metrics.jsonl", "summary.json", "per_example.parquet", "checkpoint/model.safetensors"):
        assert (run / f).exists(), f
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 3, 6]
    b = pd.read_parquet(base / "reference" / "per_example.parquet").set_index("id")["b"]
    evaluated = pd.read_parquet(run / "per_example.parquet")["id"]  # the seeded spread sample
    assert rows[0]["loss/val/reconstruction_loss"] == pytest.approx(b.loc[evaluated].mean(), abs=1e-6)  # W = 0 at step 0
    for key in ("loss/val/baseline_normalized_reconstruction_loss", "loss/val/kl_prior_loss",
                "loss_contrib/fraction_abs/reconstruction_loss", "loss_contrib/fraction_abs/kl_prior_loss",
                "structure/alignment_nmi", "structure/probe_accuracy", "structure/z_control_accuracy",
                "task/correctness", "latent/active_units", "latent/mutual_information", "objective/beta_eff_median"):
        assert key in s and s[key] == s[key], key  # present and not NaN
    assert np.isnan(s["latent/oracle_rho"])  # undefined for a Gaussian latent, not faked
    pe = pd.read_parquet(run / "per_example.parquet")
    for col in ("id", "strategy", "n_tokens", "b", "lbar", "rho_i", "kl", "beta_eff", "weight", "posterior_argmax"):
        assert col in pe, col
    assert read_json(run / "config.json")["latent_kind"] == "continuous"

    # stopped after 4 steps and resumed: the same summary as the uninterrupted run
    assert train_cvae(cfg, tmp_path / "resumed", progress=False, stop_after=4) == {"stopped_at": 4}
    r = train_cvae(cfg, tmp_path / "resumed", progress=False)
    drop = lambda d: {k: v for k, v in d.items() if k not in TIMING_KEYS}  # noqa: E731
    assert json.dumps(drop(r), sort_keys=True) == json.dumps(drop(s), sort_keys=True)  # exact, NaN == NaN


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("kw, field", [({"d_latent": 0}, "d_latent"), ({"d_latent": -3}, "d_latent"),
                                       ({"n_samples": 0}, "n_samples"), ({"prior": "laplace"}, "prior"),
                                       ({"latent_kind": "gaussian"}, "latent_kind")])
def test_bad_model_config_names_the_field(kw, field):
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        ModelConfig(**kw)


@pytest.mark.parametrize("kw, field", [
    ({"latent_kind": "continuous", "aid": "hard_em_then_soft"}, "aid"),
    ({"latent_kind": "continuous", "aid": "random_init_jsd"}, "aid"),
    ({"latent_kind": "continuous", "lambda_jsd": 0.1}, "lambda_jsd"),
    ({"latent_kind": "discrete", "free_bits_mode": "per_dim", "free_bits": 0.1}, "free_bits_mode"),
])
def test_discrete_only_options_with_continuous_latent_name_the_field(kw, field):
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        TrainConfig().replace(**kw)


def test_bad_model_arguments(setup):
    base, tok, batch = setup
    with pytest.raises(ValueError, match="d_latent"):
        ContinuousCVAE(base, d_latent=0)
    with pytest.raises(ValueError, match="n_samples"):
        ContinuousCVAE(base, d_latent=2, n_samples=0)
