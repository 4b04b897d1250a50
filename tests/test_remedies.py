"""The remedies for posterior collapse (``zfree.objective.remedies``), each against its paper's code or
formula: the cyclical schedules (Fu et al. 2019; Optimus's ``frange_cycle_zero_linear``), Optimus's KL
thresholding, free bits (Kingma et al. 2016), the named entries and their checks, the aggressive
encoder of He et al. 2019 (inner loop, what it trains, its end, resume), BN-VAE (Zhu et al. 2020) and
delta-VAE's committed rate (Razavi et al. 2019: sigma_u against its equation and Lambert's W, the KL of
every posterior >= delta against torch.distributions, resume)."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch
from torch.distributions import Categorical, Normal, kl_divergence

from tests.tiny import PAIRS, tiny_flat
from zfree.config import ObjectiveConfig, TrainConfig
from zfree.core.errors import ConfigError
from zfree.models.base import target_logprobs
from zfree.models.continuous import ContinuousCVAE
from zfree.models.precision import default_dtype
from zfree.objective.losses import beta_at_step, cyclical_fraction, gaussian_kl, kl_threshold
from zfree.objective.objectives import assemble
from zfree.objective.remedies import (FREE_BITS_TOTAL, REMEDIES, apply_remedy, check_remedy_fields, remedy_fields,
                                      remedy_parts)
from zfree.train import aids, plugins
from zfree_lab.run.run_folder import TIMING_KEYS, FiniteWatch
from zfree_lab.run.run_setup import build_optimizer, setup_run
from zfree_lab.run.training import _extra_update, _objective_of, _optimizer_step, _step_breakdown, train_cvae
from zfree_lab.experiment.spec import expand_grid


# ---------------------------------------------------------------------------- references (their published code)


def frange_cycle_zero_linear(n_iter, start=0.0, stop=1.0, n_cycle=4, ratio_increase=0.5, ratio_zero=0.3):
    """Optimus (Li et al. 2020), ``code/examples/big_ae/run_lm_vae_training.py``, in float as published:
    L[i] is the weight of iteration i, counted from 0."""
    L = np.ones(n_iter) * stop
    period = n_iter / n_cycle
    step = (stop - start) / (period * ratio_increase)  # linear schedule
    for c in range(n_cycle):
        v, i = start, 0
        while v <= stop and (int(i + c * period) < n_iter):
            if i < period * ratio_zero:
                L[int(i + c * period)] = start
            else:
                L[int(i + c * period)] = v
                v += step
            i += 1
    return L


def optimus_thresholded_kl(loss_kl, dim_target_kl):
    """Optimus's ``fb_mode == 1`` (``code/examples/big_ae/modules/vae.py``) on a per-dimension KL (B, d)."""
    kl_mask = (loss_kl > dim_target_kl).float().to(loss_kl.dtype)
    return (kl_mask * loss_kl).sum(dim=1)


def he_inner_loop(losses, max_inner, check):
    """He et al. 2019's inner loop (``vae-lagging-encoder/text.py``) on a scripted loss sequence, its
    ``sub_iter < 100`` bound written as ``sub_iter <= max_inner``; returns the encoder updates made."""
    sub_iter, burn_pre_loss, burn_cur_loss, updates = 1, 1e4, 0.0, 0
    while sub_iter <= max_inner:
        burn_cur_loss += losses[sub_iter - 1]
        updates += 1  # enc_optimizer.step()
        if sub_iter % check == 0:
            if burn_pre_loss - burn_cur_loss < 0:
                break
            burn_pre_loss, burn_cur_loss = burn_cur_loss, 0.0
        sub_iter += 1
    return updates


# ---------------------------------------------------------------------------- schedules


@pytest.mark.parametrize("period, n_cycle, ratio_zero, ratio_increase", [
    (8, 4, 0.0, 0.5),  # Fu et al. 2019: M = 4, R = 0.5
    (10, 1, 0.5, 0.25),  # Optimus, period * ratio_zero an integer
    (7, 2, 0.5, 0.25),  # 3.5: their ``i < period * ratio_zero`` zeroes i = 0..3, the ramp starts at 4 from 0
    (10, 3, 0.3, 0.5),  # 10 * 0.3 = 3.0000000000000004 in float: i = 3 is still zero
    (13, 2, 0.2, 0.8), (5, 3, 0.0, 1.0), (1, 3, 0.0, 0.5)])
def test_cyclical_fraction_is_optimus_frange_cycle_zero_linear(period, n_cycle, ratio_zero, ratio_increase):
    """Our step t (0: the evaluation before the first update) reads their L[t] (iteration t from 0),
    n_iter = n_cycle * period so that their float period is our integer one."""
    n_iter = n_cycle * period
    ref = frange_cycle_zero_linear(n_iter, 0.0, 1.0, n_cycle, ratio_increase, ratio_zero)
    ours = np.array([cyclical_fraction(t, period, ratio_zero, ratio_increase) for t in range(n_iter)])
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-12)


def test_fu_default_is_the_old_formula_and_the_remedies_follow_the_reference():
    for period in (1, 2, 5, 8, 25):
        for s in range(3 * period + 1):
            assert cyclical_fraction(s, period) == pytest.approx(min(1.0, 2 * (s % period) / period), abs=1e-15)
    steps = 40
    flat = TrainConfig().to_flat()
    # Fu et al.: 4 cycles of ceil(steps / 4); Optimus: one cycle of steps + 1 (ratio_zero 0.5, ratio_increase 0.25)
    # (the schedule is periodic: a step past their n_iter reads the next cycle, one cycle more of their L)
    for name, n_cycle, rz, ri in (("cyclical", 4, 0.0, 0.5), ("optimus", 1, 0.5, 0.25)):
        cfg = TrainConfig.from_flat(apply_remedy({**flat, "steps": steps, "beta": 0.6}, name)).objective
        period = cfg.beta_cycle_steps
        ref = frange_cycle_zero_linear((n_cycle + 1) * period, 0.0, 1.0, n_cycle + 1, ri, rz)
        got = [beta_at_step(cfg, t) for t in range(steps + 1)]
        np.testing.assert_allclose(got, 0.6 * ref[: steps + 1], rtol=0, atol=1e-12)
        assert n_cycle * period >= steps  # the run's updates (steps 1..steps) take n_cycle cycles, at most one step more
    assert beta_at_step(cfg, steps) == pytest.approx(0.6)  # optimus: the last step holds beta


# ---------------------------------------------------------------------------- KL thresholding, free bits


def test_kl_threshold_is_optimus_code_with_zero_gradient_where_masked():
    g = torch.Generator().manual_seed(0)
    mu = (0.8 * torch.randn(6, 5, generator=g, dtype=torch.float64)).requires_grad_()
    logvar = 0.5 * torch.randn(6, 5, generator=g, dtype=torch.float64)
    loss_kl = 0.5 * (mu.pow(2) + logvar.exp() - logvar - 1)  # their per-dimension KL (B, d)
    target = 0.1
    mask = loss_kl.detach() > target
    assert 0 < mask.sum() < mask.numel()  # some entries on each side
    got = kl_threshold(gaussian_kl(mu, logvar, per_dim=True), target)
    torch.testing.assert_close(got, optimus_thresholded_kl(loss_kl, target), rtol=0, atol=1e-14)
    (grad,) = torch.autograd.grad(got.sum(), mu)
    assert (grad[~mask] == 0).all() and (grad[mask] != 0).all()
    torch.testing.assert_close(grad, torch.where(mask, mu.detach(), torch.zeros_like(mu)))  # d/dmu of mu^2 / 2
    # (B,): one group per example (the categorical KL)
    kl = torch.tensor([0.05, 0.2, 0.0, 1.5], dtype=torch.float64, requires_grad=True)
    got = kl_threshold(kl, target)
    torch.testing.assert_close(got, optimus_thresholded_kl(kl.detach()[:, None], target))
    (grad,) = torch.autograd.grad(got.sum(), kl)
    torch.testing.assert_close(grad, torch.tensor([0.0, 1.0, 0.0, 1.0], dtype=torch.float64))
    # in the objective: beta * the batch mean of their loss
    cfg = TrainConfig.from_flat(apply_remedy({**TrainConfig().to_flat(), "steps": 10, "latent_kind": "continuous",
                                              "d_latent": 5, "prior": "standard", "beta": 0.3}, "kl_threshold"))
    br = assemble("continuous", cfg.objective, recon=torch.ones(6, 1, dtype=torch.float64),
                  target_len=torch.full((6,), 3), c_base=1.0, mu_q=mu.detach(), logvar_q=logvar, mu_p=None,
                  logvar_p=None)
    ref = 0.3 * optimus_thresholded_kl(0.5 * (mu.detach() ** 2 + logvar.exp() - logvar - 1), 0.5).mean()
    torch.testing.assert_close(br.contributions["kl_prior_loss"], ref, rtol=0, atol=1e-14)


def test_free_bits_remedy_is_kingma_max_of_lambda_and_the_batch_mean_kl():
    """Kingma et al. 2016, eq. 15: sum_j max(lambda, E_batch KL_j), with Li et al. 2019's 8 nats in all."""
    g = torch.Generator().manual_seed(1)
    d = 4
    flat = {**TrainConfig().to_flat(), "steps": 10, "beta": 0.7}
    cont = TrainConfig.from_flat(apply_remedy({**flat, "latent_kind": "continuous", "d_latent": d, "prior": "standard"},
                                              "free_bits")).objective
    lam = FREE_BITS_TOTAL / d
    mu = torch.cat([0.1 * torch.randn(8, 2, generator=g, dtype=torch.float64),  # KL well below lambda = 2
                    3.0 + torch.randn(8, 2, generator=g, dtype=torch.float64)], 1)  # KL well above
    logvar = 0.3 * torch.randn(8, d, generator=g, dtype=torch.float64)
    kl_dims = kl_divergence(Normal(mu, (0.5 * logvar).exp()), Normal(torch.zeros_like(mu), torch.ones_like(mu)))
    assert (kl_dims.mean(0)[:2] < lam).all() and (kl_dims.mean(0)[2:] > lam).all()
    br = assemble("continuous", cont, recon=torch.ones(8, 1, dtype=torch.float64), target_len=torch.full((8,), 3),
                  c_base=1.0, mu_q=mu, logvar_q=logvar, mu_p=None, logvar_p=None)
    ref = 0.7 * sum(max(lam, float(kl_dims[:, j].mean())) for j in range(d))
    assert float(br.contributions["kl_prior_loss"]) == pytest.approx(ref, rel=1e-14)
    # categorical: one group, lambda = 8 > log K, so the penalty is the constant beta * 8 (no gradient)
    disc = TrainConfig.from_flat(apply_remedy({**flat, "n_latent": 4}, "free_bits")).objective
    q = torch.randn(8, 4, generator=g, dtype=torch.float64, requires_grad=True)
    p = torch.randn(8, 4, generator=g, dtype=torch.float64)
    br = assemble("discrete", disc, recon=torch.ones(8, 4, dtype=torch.float64), target_len=torch.full((8,), 3),
                  c_base=1.0, q_logits=q, p_logits=p)
    kl = kl_divergence(Categorical(logits=q.detach()), Categorical(logits=p))
    penalty = float(br.contributions["kl_prior_loss"].detach())
    assert penalty == pytest.approx(0.7 * max(FREE_BITS_TOTAL, float(kl.mean())), rel=1e-14)
    (grad,) = torch.autograd.grad(br.contributions["kl_prior_loss"], q)
    assert grad.abs().max() < 1e-15  # lambda * mean K / mean K: zero up to rounding


# ---------------------------------------------------------------------------- the named entries


def test_remedy_composition_conflicts_and_unknown_names():
    ae = remedy_fields("ae", steps=100)
    fb = remedy_fields("free_bits", steps=100, latent_kind="continuous", d_latent=16)
    both = remedy_fields("ae+free_bits", steps=100, latent_kind="continuous", d_latent=16)
    assert both == {**{k: v for k, v in ae.items() if k != "remedy"}, **{k: v for k, v in fb.items() if k != "remedy"},
                    "remedy": "ae+free_bits"}
    assert both["ae_steps"] == 25 and both["free_bits"] == 0.5 and both["free_bits_mode"] == "per_dim"
    assert remedy_parts(" ae + free_bits ") == ["ae", "free_bits"]
    with pytest.raises(ConfigError, match=r"free_bits_mode"):  # both set it, differently
        remedy_fields("kl_threshold+free_bits", steps=100, latent_kind="continuous")
    with pytest.raises(ConfigError, match=r"'nope'.*'free_bits'"):  # names the bad entry, lists the valid ones
        remedy_fields("ae+nope", steps=100)
    with pytest.raises(ConfigError, match="remedy"):
        remedy_parts("")


def test_a_config_whose_fields_differ_from_its_remedy_is_refused_when_a_grid_expands():
    flat = {**TrainConfig().to_flat(), "steps": 100}
    good = expand_grid(apply_remedy(flat, "ae"), {"beta": [0.3]})
    assert good[0].params["ae_steps"] == 25 and good[0].params["remedy"] == "ae"
    with pytest.raises(ValueError, match=r"ae_steps"):
        expand_grid({**apply_remedy(flat, "ae"), "ae_steps": 10}, {"beta": [0.3]})
    with pytest.raises(ValueError, match=r"free_bits"):
        expand_grid({**flat, "remedy": "free_bits"}, {"beta": [0.3]})  # the name without its fields
    with pytest.raises(ValueError, match=r"'bogus'"):
        expand_grid({**flat, "remedy": "bogus"}, {"beta": [0.3]})


@pytest.mark.parametrize("latent_kind", ["discrete", "continuous"])
@pytest.mark.parametrize("name", REMEDIES)
def test_every_entry_makes_a_valid_config_that_holds_its_fields(name, latent_kind):
    from zfree.config import AIDS

    aid = remedy_fields(name, steps=300).get("aid", "none")
    if latent_kind not in AIDS[aid].kinds:
        pytest.skip(f"aid={aid!r} is defined for latent_kind {AIDS[aid].kinds} only")
    flat = {**TrainConfig().to_flat(), "steps": 300, "latent_kind": latent_kind, "d_latent": 8}
    if latent_kind == "continuous":
        flat["prior"] = "standard"
    cfg = TrainConfig.from_flat(apply_remedy(flat, name))
    check_remedy_fields(cfg)
    assert cfg.aid.remedy == name
    want = remedy_fields(name, steps=300, latent_kind=latent_kind, d_latent=8)
    assert {k: cfg.to_flat()[k] for k in want} == want


# ---------------------------------------------------------------------------- the aggressive encoder


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("max_inner, check", [(100, 15), (7, 2), (9, 3), (4, 5)])
def test_aggressive_inner_loop_stops_as_he_et_al_code(seed, max_inner, check):
    rng = np.random.default_rng(seed)
    losses = list(rng.normal(10.0, 1.0, size=max_inner) - np.linspace(0, 3 * seed / 5, max_inner))
    cfg = TrainConfig().replace(aid="aggressive_encoder", aggressive_max_inner=max_inner, aggressive_inner_check=check)
    seen = []
    n = aids.aggressive_inner_steps(cfg, lambda i: seen.append(i) or torch.tensor(losses[i - 1], dtype=torch.float64))
    assert n == he_inner_loop(losses, max_inner, check) and seen == list(range(1, n + 1))


@pytest.fixture(scope="module")
def tiny(tiny_run):
    return tiny_run


#: a few-step aggressive run: inner windows of 2, at most 6 inner steps, the MI checked every 2 steps
AGGRESSIVE = {"steps": 6, "eval_every": 3, "device": "cpu", "aid": "aggressive_encoder", "aggressive_max_inner": 6,
              "aggressive_inner_check": 2, "aggressive_mi_every": 2, "weighting": "distribution", "beta": 0.3}
CONTINUOUS = {"latent_kind": "continuous", "d_latent": 4, "n_samples": 1}


def _aggressive_cfg(data, base, **kw):
    return TrainConfig.from_flat(tiny_flat(data, base, **{**AGGRESSIVE, **kw}))


def _snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("kind", ["discrete", "continuous"])
def test_inner_steps_train_only_the_posterior_and_the_outer_step_only_the_rest(tiny, tmp_path, kind):
    data, base = tiny
    cfg = _aggressive_cfg(data, base, **(CONTINUOUS if kind == "continuous" else {}), aggressive_max_inner=1, lr_new=0.05)
    run = setup_run(cfg, tmp_path / "run", progress=False)
    model, dev = run.model, next(run.model.parameters()).device
    mask, watch = aids.FrozenDecoderMask(model), FiniteWatch(tmp_path / "run", dev)
    rows = [run.data.train[i] for i in range(cfg.optim.batch_size)]
    objective = _objective_of(run, cfg, cfg.model.latent_kind, 1, dev, torch.float32)
    before = _snapshot(model)
    assert [type(p) for p in run.plugins] == [plugins.AggressiveEncoder]  # the loop's plug-in, through its hook
    run.plugins[0].before_update(plugins.StepContext(run, cfg, 1, objective, mask, watch, (), _extra_update), rows)
    assert run.state.aggressive_inner_steps == 1
    after = _snapshot(model)
    posterior = {n for n in before if n.split(".")[0] in aids.POSTERIOR_SIDE}
    assert posterior and any(not torch.equal(before[n], after[n]) for n in posterior)
    for n in set(before) - posterior:  # backbone, router / prior head, latent embeddings or projection
        assert torch.equal(before[n], after[n]), n
        assert not run.opt.state.get(dict(model.named_parameters())[n]), n  # AdamW skipped it: no moments
    # the joint step of the aggressive phase: the decoder side only (He et al. 2019, Alg. 1)
    assert plugins.trained_side(run.plugins, cfg, run.state, 1) == "decoder"
    br, _ = _step_breakdown(run, cfg, objective, rows)
    _optimizer_step(run, br, cfg, 1, mask, plugins.trained_side(run.plugins, cfg, run.state, 1))
    joint = _snapshot(model)
    for n in posterior:
        assert torch.equal(after[n], joint[n]), n
    assert any(not torch.equal(after[n], joint[n]) for n in set(before) - posterior)
    run.state.aggressive_end_step = 1
    assert plugins.trained_side(run.plugins, cfg, run.state, 2) == "all" and not aids.aggressive_phase(cfg, run.state)


@pytest.mark.parametrize("kind", ["discrete", "continuous"])
def test_aggressive_run_records_its_phase_and_resumes_exactly(tiny, tmp_path, kind):
    data, base = tiny
    cfg = _aggressive_cfg(data, base, **(CONTINUOUS if kind == "continuous" else {}))
    s = train_cvae(cfg, tmp_path / "run", progress=False)
    mi, end, total = s["aid/aggressive_mi"], s["aid/aggressive_end_step"], s["aid/aggressive_inner_steps"]
    # the phase's end by He et al.'s rule on the recorded checks (the first against 0)
    prev = [0.0] + [r["mutual_information"] for r in mi[:-1]]
    first_drop = next((r["step"] for r, p in zip(mi, prev) if r["mutual_information"] - p < 0), None)
    assert end == first_drop
    assert [r["step"] for r in mi] == list(range(2, (end or cfg.optim.steps) + 1, 2))  # checks stop with the phase
    # windows of 2 against +inf first: 4 or 6 (aggressive_max_inner) inner steps per outer step (he_inner_loop)
    phase_steps = end or cfg.optim.steps
    assert 4 * phase_steps <= total <= 6 * phase_steps
    assert total == mi[-1]["inner_steps"]  # the last check is the phase's end or the last step: none after it
    per_check = np.diff([0] + [r["inner_steps"] for r in mi])
    assert ((per_check >= 2 * 4) & (per_check <= 2 * 6)).all()  # 2 outer steps between checks
    # stopped in the aggressive phase (after step 1) and resumed: the same summary
    assert train_cvae(cfg, tmp_path / "resumed", progress=False, stop_after=1) == {"stopped_at": 1}
    r = train_cvae(cfg, tmp_path / "resumed", progress=False)
    drop = lambda d: {k: v for k, v in d.items() if k not in TIMING_KEYS}  # noqa: E731
    assert json.dumps(drop(r), sort_keys=True) == json.dumps(drop(s), sort_keys=True)


def test_the_aggressive_phase_ends_and_the_run_trains_jointly_after(tiny, tmp_path):
    """Continuous latent at init: the MI's Monte Carlo estimate is ~0 and falls at an early check, so the
    phase ends well inside the run; the steps after it make no inner steps."""
    data, base = tiny
    cfg = _aggressive_cfg(data, base, **CONTINUOUS, steps=8, eval_every=4)
    s = train_cvae(cfg, tmp_path / "run", progress=False)
    end = s["aid/aggressive_end_step"]
    assert end is not None and end < cfg.optim.steps
    assert s["aid/aggressive_inner_steps"] == s["aid/aggressive_mi"][-1]["inner_steps"]
    assert (tmp_path / "run" / "summary.json").exists()


def test_posterior_mutual_information_is_the_evaluation_s(tiny, tmp_path):
    """On the same rows: the discrete evaluation's exact latent/mutual_information (and the Gaussian's
    Monte Carlo one, same seed), from the heads alone."""
    from zfree_lab.run.metrics import evaluate

    data, base = tiny
    for kw in ({}, CONTINUOUS):
        cfg = _aggressive_cfg(data, base, **kw)
        run = setup_run(cfg, tmp_path / f"mi{len(kw)}", progress=False)
        with torch.no_grad():  # a posterior that is not uniform
            run.model.posterior_head.weight.normal_(std=0.5)
        ev = evaluate(run.model, run.data.val, run.data.val_pairs, step=0, **run.data.eval_kw)
        mi = aids.posterior_mutual_information(run.model, run.data.val, run.data.pad_id, seed=cfg.optim.seed)
        assert mi > 0.01
        assert mi == pytest.approx(ev.metrics["latent/mutual_information"], rel=1e-5, abs=1e-9)  # (float32 there)


# ---------------------------------------------------------------------------- BN-VAE


@pytest.fixture(scope="module")
def bn_setup(tiny_lm):
    base, tok, batch = tiny_lm(n_layer=2, seed=1)
    return copy.deepcopy(base).double(), batch  # a copy: the session's model stays float32


def _bn_model(base, gamma=0.7, d=4):
    with default_dtype(torch.float64):  # as build_cvae does: gamma = 0.7 in float64, not 0.7 rounded to float32
        model = ContinuousCVAE(copy.deepcopy(base), d_latent=d, prior="standard", bn_gamma=gamma).train()
    with torch.no_grad():  # raw means of variance >> eps (eps only shifts the std by a factor sqrt(v / (v + eps)))
        model.posterior_head.weight.normal_(std=2.0, generator=torch.Generator().manual_seed(0))
        model.posterior_bn.bias.copy_(torch.tensor([0.1, -0.2, 0.3, 0.0], dtype=torch.float64)[:d])
    return model


def _raw_mean(model, batch):
    h, _ = model._zfree_pass(batch, use_cache=False)
    from zfree.models.encoder import pool_posterior_features

    return model.posterior_head(pool_posterior_features(model, model.posterior_features, h, batch)).chunk(2, -1)[0]


def test_bn_vae_normalizes_the_batch_of_posterior_means(bn_setup):
    base, batch = bn_setup
    model, gamma = _bn_model(base), 0.7
    out = model(batch)
    mu, beta = out.posterior_mean, model.posterior_bn.bias.detach()
    raw = _raw_mean(model, batch).detach()
    v = raw.var(0, unbiased=False)
    assert (v > 1.0).all()
    torch.testing.assert_close(mu, gamma * (raw - raw.mean(0)) / torch.sqrt(v + 1e-5) + beta, rtol=0, atol=1e-12)
    torch.testing.assert_close(mu.mean(0), beta, rtol=0, atol=1e-12)  # per-dim mean = the shift
    torch.testing.assert_close(mu.std(0, unbiased=False), torch.full_like(beta, gamma), rtol=0, atol=1e-5)
    # the scale is fixed: no gradient reaches it, and the optimizer does not hold it
    out.posterior_mean.pow(2).sum().backward()
    assert model.posterior_bn.weight.grad is None and not model.posterior_bn.weight.requires_grad
    assert model.posterior_bn.bias.grad is not None and model.posterior_bn.bias.grad.abs().sum() > 0
    assert torch.equal(model.posterior_bn.weight.detach(), torch.full((4,), gamma, dtype=torch.float64))
    opt = build_optimizer(model, TrainConfig().optim, log=None)
    held = {id(p) for g in opt.param_groups for p in g["params"]}
    assert id(model.posterior_bn.weight) not in held and id(model.posterior_bn.bias) in held


def test_bn_vae_evaluation_uses_the_running_statistics(bn_setup):
    base, batch = bn_setup
    model = _bn_model(base)
    model(batch)  # one training-mode pass: running stats move from (0, 1) by momentum 0.1
    raw = _raw_mean(model, batch).detach()
    run_mean, run_var = 0.1 * raw.mean(0), 0.9 + 0.1 * raw.var(0, unbiased=True)
    torch.testing.assert_close(model.posterior_bn.running_mean, run_mean, rtol=1e-12, atol=1e-12)
    model.eval()
    mu = model(batch).posterior_mean
    ref = 0.7 * (raw - run_mean) / torch.sqrt(run_var + 1e-5) + model.posterior_bn.bias.detach()
    torch.testing.assert_close(mu, ref, rtol=0, atol=1e-12)


def test_bn_vae_keeps_the_decoder_exact_at_step_0_and_bounds_the_kl(bn_setup):
    base, batch = bn_setup
    model = _bn_model(base)
    out = model(batch)
    ref = target_logprobs(base, batch)
    torch.testing.assert_close(out.target_logprobs[:, 0], ref, rtol=0, atol=1e-12)  # W = 0: z changes nothing
    # Zhu et al.'s bound at the batch statistics: mean_B KL = 1/2 sum_d mean_B mu^2 + 1/2 mean_B sum_d
    # (sigma^2 - log sigma^2 - 1), the second part >= 0, and mean_B mu_d^2 = gamma^2 v / (v + eps) + beta_d^2
    mu, logvar = out.posterior_mean.detach(), out.posterior_logvar.detach()
    beta, raw = model.posterior_bn.bias.detach(), _raw_mean(model, batch).detach()
    v = raw.var(0, unbiased=False)
    kl = gaussian_kl(mu, logvar).mean()
    bound = 0.5 * (0.49 * v / (v + 1e-5) + beta ** 2).sum()
    sigma_part = 0.5 * (logvar.exp() - logvar - 1).sum(-1).mean()
    torch.testing.assert_close(kl, bound + sigma_part, rtol=0, atol=1e-12)
    assert sigma_part >= 0 and kl >= bound >= 4 * 0.49 / 2 * float((v / (v + 1e-5)).min())
    with pytest.raises(ValueError, match="prior"):
        ContinuousCVAE(base, d_latent=2, prior="learned", bn_gamma=0.7)
    with pytest.raises(ValueError, match="bn_gamma"):
        ContinuousCVAE(base, d_latent=2, prior="standard", bn_gamma=-1.0)


def test_bn_vae_run_is_exact_at_step_0_and_resumes_exactly(tiny, tmp_path):
    """The bn_vae remedy on the tiny run: rho_recon = 1 at step 0 (the injection is zero), and a resumed
    run (running statistics from the checkpoint) equals an uninterrupted one."""
    import pandas as pd

    from zfree.core.io import read_jsonl

    data, base = tiny
    flat = tiny_flat(data, base, steps=4, eval_every=2, device="cpu", d_latent=4, n_samples=1, beta=0.3,
                     weighting="distribution")
    cfg = TrainConfig.from_flat(apply_remedy(flat, "bn_vae"))
    assert cfg.model.bn_gamma == 0.7 and cfg.model.prior == "standard"
    s = train_cvae(cfg, tmp_path / "run", progress=False)
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    b = pd.read_parquet(base / "reference" / "per_example.parquet").set_index("id")["b"]
    evaluated = pd.read_parquet(tmp_path / "run" / "per_example.parquet")["id"]
    assert rows[0]["loss/val/reconstruction_loss"] == pytest.approx(b.loc[evaluated].mean(), abs=1e-6)
    assert rows[0]["loss/val/baseline_normalized_reconstruction_loss"] == pytest.approx(1.0, abs=2e-6)
    assert train_cvae(cfg, tmp_path / "resumed", progress=False, stop_after=3) == {"stopped_at": 3}
    r = train_cvae(cfg, tmp_path / "resumed", progress=False)
    drop = lambda d: {k: v for k, v in d.items() if k not in TIMING_KEYS}  # noqa: E731
    assert json.dumps(drop(r), sort_keys=True) == json.dumps(drop(s), sort_keys=True)


def test_bn_vae_refuses_chunked_gradients_and_one_row_batches():
    flat = apply_remedy({**TrainConfig().to_flat(), "steps": 10, "d_latent": 4}, "bn_vae")
    with pytest.raises(ValueError, match="batch_size"):
        TrainConfig.from_flat({**flat, "batch_size": 1})
    from zfree.train.accumulate import check_accumulation

    with pytest.raises(ConfigError, match="bn_gamma"):
        check_accumulation(TrainConfig.from_flat({**flat, "batch_size": 8, "micro_batch": 4}))


def test_a_lora_checkpoint_keeps_the_bn_running_statistics(bn_setup):
    from zfree.models.lora import apply_lora, load_trainable, trainable_tensors

    base, batch = bn_setup
    model = _bn_model(base)
    model(batch)  # running statistics moved off (0, 1)
    apply_lora(model.backbone, 2, 4.0)
    saved = trainable_tensors(model)
    assert {"posterior_bn.running_mean", "posterior_bn.running_var", "posterior_bn.bias"} <= set(saved)
    fresh = _bn_model(base)
    apply_lora(fresh.backbone, 2, 4.0)
    load_trainable(fresh, saved)
    torch.testing.assert_close(fresh.posterior_bn.running_var, model.posterior_bn.running_var, rtol=0, atol=0)
    assert math.isclose(float(fresh.posterior_bn.weight[0]), 0.7)


# ---------------------------------------------------------------------------- delta-VAE


def test_sigma_u_solves_the_committed_rate_equation():
    """ln sigma_u^2 = u < 0 with d/2 (e^u - 1 - u) = delta, in float64 to 1e-12, and against the closed
    form sigma_u^2 = -W_0(-e^-(1 + 2 delta / d)) (Lambert's W, principal branch: the root below 1)."""
    from scipy.special import lambertw

    from zfree.models.continuous import committed_rate, max_posterior_logvar

    for d in (1, 4, 16, 64):
        for delta in (1e-6, 0.1, 1.0, 8.0, 50.0):
            u = max_posterior_logvar(delta, d)
            assert u < 0
            assert abs(0.5 * d * (np.exp(u) - 1.0 - u) - delta) <= 1e-12 * max(1.0, delta), (d, delta)
            assert abs(committed_rate(u, d) - delta) <= 1e-12 * max(1.0, delta)
            s2 = -lambertw(-np.exp(-(1.0 + 2.0 * delta / d)), 0).real
            assert np.exp(u) == pytest.approx(s2, rel=1e-9, abs=1e-300), (d, delta)
    # the remedy's default at the leaderboard's d_latent: 0.5 nats per dimension
    assert math.exp(0.5 * max_posterior_logvar(8.0, 16)) == pytest.approx(0.398239, abs=1e-6)
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="delta_rate"):
            max_posterior_logvar(bad, 4)
    with pytest.raises(ValueError, match="max_logvar"):
        committed_rate(0.1, 4)


def _delta_model(base, delta, d=4, dtype=torch.float64):
    with default_dtype(dtype):
        return ContinuousCVAE(copy.deepcopy(base).to(dtype), d_latent=d, prior="standard", delta_rate=delta).train()


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-6)])
def test_delta_vae_kl_of_every_posterior_is_at_least_delta_and_is_torch_distributions(bn_setup, tmp_path, dtype, tol):
    """Random heads (raw log-variances of both signs, far past the bound) through the training loss
    path (``continuous_objective``): sigma_q <= sigma_u, the per-example KL >= delta, equal to
    torch.distributions' KL of N(mu, sigma) from N(0, 1) summed over dimensions."""
    from zfree.objective.objectives import continuous_objective

    base, batch = bn_setup
    delta, d = 2.0, 4
    cfg = TrainConfig.from_flat({**TrainConfig().to_flat(), "latent_kind": "continuous", "prior": "standard",
                                 "d_latent": d, "delta_rate": delta, "beta": 0.5, "device": "cpu",
                                 "precision": "fp64" if dtype == torch.float64 else "fp32"})
    g = torch.Generator().manual_seed(0)
    kls = []
    for trial in range(12):
        model = _delta_model(base, delta, d, dtype)
        with torch.no_grad():  # means near 0 and raw log-variances spread over [-10, 10] or so
            scale = torch.tensor([0.02] * d + [1.0] * d)[:, None]
            model.posterior_head.weight.copy_(torch.randn(model.posterior_head.weight.shape, generator=g) * scale)
            model.posterior_head.bias.copy_(torch.randn(2 * d, generator=g) * torch.tensor([0.1] * d + [5.0] * d))
        out = model(batch)
        mu, logvar = out.posterior_mean.double(), out.posterior_logvar.double()
        assert (out.posterior_logvar <= model.max_logvar).all()  # sigma_q <= sigma_u, not one rounding above
        assert np.float32(model._max_logvar32) == model._max_logvar32 <= model.max_logvar  # float32, rounded down
        big = model.bounded_logvar(torch.tensor([[1e3, 40.0, 0.0, -1e3]], dtype=dtype))  # at the limit, and far below
        assert big.dtype == dtype and (big <= model.max_logvar).all() and big[0, 0] == big[0, 1]
        br = continuous_objective(model, batch, cfg, step=1, c_base=1.0, b=None, base_tok=None)
        kl = br.per_example["kl"].double()
        ref = kl_divergence(Normal(mu, (0.5 * logvar).exp()), Normal(torch.zeros_like(mu), torch.ones_like(mu))).sum(-1)
        torch.testing.assert_close(kl, ref, rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=tol)
        assert (kl >= delta - tol).all(), (trial, kl.min())
        kls.append(kl)
    kls = torch.cat(kls)
    assert kls.max() > delta + 1.0 and kls.min() < delta + 0.5  # the draws reach both far from and near the bound
    # bfloat16 autocast (the bf16 precision's forward): the bound is applied in float32, not bf16
    model = _delta_model(base, delta, d, torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lv = model.bounded_logvar(torch.tensor([[1e3, 40.0, 0.0, -1e3]], dtype=torch.bfloat16))
    assert lv.dtype == torch.float32 and (lv <= model.max_logvar).all()
    kl = gaussian_kl(torch.zeros(1, d), lv[:, :1].expand(1, d))
    assert float(kl) >= delta - 1e-6


def test_delta_vae_kl_is_delta_at_mu_0_and_sigma_u(bn_setup):
    """The committed rate is the family's minimum: at mu = 0, sigma = sigma_u the KL equals delta (float64),
    by the KL formula and through the model with its head at the limit (logsigmoid(40) = -4e-18)."""
    from zfree.models.continuous import max_posterior_logvar

    base, batch = bn_setup
    for delta, d in ((8.0, 16), (2.0, 4), (0.05, 4)):
        u = max_posterior_logvar(delta, d)
        kl = gaussian_kl(torch.zeros(3, d, dtype=torch.float64), torch.full((3, d), u, dtype=torch.float64))
        torch.testing.assert_close(kl, torch.full((3,), delta, dtype=torch.float64), rtol=0, atol=1e-13)
    model = _delta_model(base, 2.0, 4)
    with torch.no_grad():
        model.posterior_head.weight.zero_()
        model.posterior_head.bias.copy_(torch.tensor([0.0] * 4 + [40.0] * 4, dtype=torch.float64))
    out = model(batch)
    assert out.posterior_mean.abs().max() == 0
    kl = gaussian_kl(out.posterior_mean, out.posterior_logvar)
    torch.testing.assert_close(kl, torch.full_like(kl, 2.0), rtol=0, atol=1e-13)
    # at the zero-initialized bias sigma_q^2 = sigma_u^2 / 2
    fresh = _delta_model(base, 2.0, 4)
    with torch.no_grad():
        fresh.posterior_head.weight.zero_()
    half = torch.full((len(PAIRS), 4), model.max_logvar - math.log(2), dtype=torch.float64)
    torch.testing.assert_close(fresh(batch).posterior_logvar, half, rtol=0, atol=1e-14)


def test_delta_rate_0_leaves_the_model_bit_identical(bn_setup):
    """delta_rate = 0 (the default) is today's model: the same parameters and buffers (checkpoints keep
    their keys, delta > 0 too: sigma_u is recomputed from the config), the same outputs to the bit."""
    base, batch = bn_setup
    with default_dtype(torch.float64):
        torch.manual_seed(3)
        old = ContinuousCVAE(copy.deepcopy(base), d_latent=4, prior="standard", n_samples=2)
        torch.manual_seed(3)
        new = ContinuousCVAE(copy.deepcopy(base), d_latent=4, prior="standard", n_samples=2, delta_rate=0.0)
    assert new.max_logvar is None
    sd_old, sd_new = old.state_dict(), new.state_dict()
    assert list(sd_old) == list(sd_new) and all(torch.equal(sd_old[k], sd_new[k]) for k in sd_old)
    with torch.no_grad():
        for m in (old, new):
            w = m.latent_proj.weight
            w.copy_(torch.linspace(-1, 1, w.numel(), dtype=w.dtype).view_as(w))
    a = old(batch, generator=torch.Generator().manual_seed(5))
    b = new(batch, generator=torch.Generator().manual_seed(5))
    for f in ("posterior_mean", "posterior_logvar", "z", "target_logprobs", "features"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    assert list(_delta_model(base, 2.0, 4).state_dict()) == list(sd_old)
    assert TrainConfig().model.delta_rate == 0.0


def test_delta_vae_run_keeps_the_kl_above_delta_and_resumes_exactly(tiny, tmp_path):
    """The delta_vae remedy on the tiny run: rho_recon = 1 at step 0, every logged KL (train and val,
    per example) >= delta, and a resumed run equals an uninterrupted one."""
    import pandas as pd

    from zfree.core.io import read_jsonl

    data, base = tiny
    flat = tiny_flat(data, base, steps=4, eval_every=2, device="cpu", d_latent=4, n_samples=1, beta=0.3,
                     weighting="distribution")
    cfg = TrainConfig.from_flat(apply_remedy(flat, "delta_vae"))
    assert cfg.model.delta_rate == 8.0 and cfg.model.prior == "standard" and cfg.aid.remedy == "delta_vae"
    s = train_cvae(cfg, tmp_path / "run", progress=False)
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert rows[0]["loss/val/baseline_normalized_reconstruction_loss"] == pytest.approx(1.0, abs=2e-6)
    kls = [r[k] for r in rows for k in ("loss/val/kl_prior_loss", "loss/train/kl_prior_loss") if k in r]
    assert len(kls) >= 3 and min(kls) >= 8.0 - 1e-5
    per_example = pd.read_parquet(tmp_path / "run" / "per_example.parquet")
    assert (per_example["kl"] >= 8.0 - 1e-5).all()
    assert train_cvae(cfg, tmp_path / "resumed", progress=False, stop_after=3) == {"stopped_at": 3}
    r = train_cvae(cfg, tmp_path / "resumed", progress=False)
    drop = lambda d: {k: v for k, v in d.items() if k not in TIMING_KEYS}  # noqa: E731
    assert json.dumps(drop(r), sort_keys=True) == json.dumps(drop(s), sort_keys=True)


def test_delta_vae_entry_expands_composes_and_refuses_bad_combinations():
    from zfree.config import ModelConfig
    from zfree.objective.remedies import DELTA_VAE_RATE

    assert DELTA_VAE_RATE == FREE_BITS_TOTAL == 8.0
    assert remedy_fields("delta_vae", steps=100) == {"latent_kind": "continuous", "prior": "standard",
                                                      "delta_rate": 8.0, "remedy": "delta_vae"}
    both = remedy_fields("bn_vae+delta_vae", steps=100)  # both set the latent and prior alike: no conflict
    assert both["bn_gamma"] == 0.7 and both["delta_rate"] == 8.0
    fb = remedy_fields("delta_vae+free_bits", steps=100, d_latent=16)  # the Gaussian kind for free bits
    assert fb["free_bits_mode"] == "per_dim" and fb["free_bits"] == 0.5
    flat = {**TrainConfig().to_flat(), "steps": 100}
    cfg = TrainConfig.from_flat(apply_remedy(flat, "ae+delta_vae"))
    check_remedy_fields(cfg)
    assert cfg.optim.steps == 100 and cfg.objective.ae_steps == 25 and cfg.model.delta_rate == 8.0
    # the field alone, on the wrong latent or prior, or out of range: ConfigError naming it
    for kw in ({"delta_rate": 1.0}, {"delta_rate": 1.0, "latent_kind": "continuous"},
               {"delta_rate": -1.0, "latent_kind": "continuous", "prior": "standard"},
               {"delta_rate": float("inf"), "latent_kind": "continuous", "prior": "standard"}):
        with pytest.raises(ConfigError, match="delta_rate"):
            ModelConfig(**kw)
        with pytest.raises(ConfigError, match="delta_rate"):
            TrainConfig.from_flat({**flat, **kw})
    # a config named delta_vae must hold its committed rate
    cont = {**flat, "latent_kind": "continuous", "prior": "standard"}
    with pytest.raises(ValueError, match="delta_rate"):
        expand_grid({**cont, "remedy": "delta_vae"}, {"beta": [0.3]})
    with pytest.raises(ValueError, match="delta_rate"):
        expand_grid({**apply_remedy(flat, "delta_vae"), "delta_rate": 4.0}, {"beta": [0.3]})
    base = torch.nn.Module()
    with pytest.raises(ValueError, match="prior"):
        ContinuousCVAE(base, d_latent=2, prior="learned", delta_rate=1.0)
    with pytest.raises(ValueError, match="delta_rate"):
        ContinuousCVAE(base, d_latent=2, prior="standard", delta_rate=-1.0)


def test_every_remedy_entry_carries_its_source_its_docs_line_and_a_style_of_its_own():
    """The registry is the one list of remedies: each entry names its paper and its line of the docs' table,
    and the report draws it in a (colour, marker) no other entry or composed remedy has."""
    from zfree.objective.remedies import COMPOSED_STYLES, OTHER_STYLE, REMEDY_ENTRIES, remedy_parts, remedy_style

    assert REMEDIES == tuple(REMEDY_ENTRIES)
    styles = [remedy_style(n) for n in (*REMEDIES, *COMPOSED_STYLES)]
    assert len(set(styles)) == len(styles) and OTHER_STYLE not in styles
    for name, r in REMEDY_ENTRIES.items():
        assert r.name == name and r.source and r.what and r.kind in (None, "discrete", "continuous")
    for name in COMPOSED_STYLES:
        remedy_parts(name)  # a composition of entries
    assert remedy_style("not-a-remedy") == OTHER_STYLE
