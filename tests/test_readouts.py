"""Within-model readouts (zfree.evaluate.readouts): the exact marginal against a brute-force sum over
K, the IWAE bound against the marginal by enumeration, D_shuffled = D_q for a constant posterior."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from tests.tiny import PAIRS
from zfree.config import ObjectiveConfig
from zfree.data.batching import encode_pair
from zfree.evaluate.readouts import (READOUT_COLUMNS, discrete_readouts, gaussian_log_density, iwae_nll,
                                     shuffle_permutation)


def _evaluate(model, tok, pairs, **kw):
    from zfree_lab.run.metrics import evaluate

    enc = [encode_pair(tok, p) for p in pairs]
    return evaluate(model, enc, pairs, b=np.ones(len(pairs)), c_base=1.0, step=0, pad_id=tok.pad_token_id,
                    objective=kw.pop("objective", ObjectiveConfig(beta=0.1)), **kw)


def _brute_force_marginal(model, tok, pairs) -> np.ndarray:
    """-log sum_k p(k | x) p(y | x, k) in float64 Python arithmetic, each value decoded by its own
    given-z pass (``forward_given``, not the K-way path the evaluation uses)."""
    from tests.tiny import pairs_batch

    batch = pairs_batch(tok, pairs)
    K = model.n_latent
    seq = np.zeros((len(pairs), K))
    with torch.no_grad():
        for k in range(K):
            m = copy.deepcopy(model)
            m.given, m.given_index = True, {p.id: k for p in pairs}
            sel = m.forward_given(batch)
            seq[:, k] = (-sel.selected_logprobs * batch.target_mask).sum(-1).numpy()
        p = torch.softmax(model.encode(batch).prior_logits, -1).numpy()
    return np.array([-math.log(sum(p[i, k] * math.exp(-seq[i, k]) for k in range(K))) for i in range(len(pairs))])


@pytest.fixture
def distinct_cvae(tiny_lm):
    """A float64 K = 3 discrete CVAE whose decoders and router differ (random latent embeddings and router)."""
    from zfree.models.discrete import DiscreteCVAE

    model, tok, _ = tiny_lm()
    torch.manual_seed(0)
    m = DiscreteCVAE(copy.deepcopy(model), 3, "optimal").double().eval()
    with torch.no_grad():
        m.latent_embedding.weight.normal_(std=1.0)
        for p in m.router_head.parameters():
            p.normal_(std=0.5)
    return m, tok


def test_exact_marginal_equals_a_brute_force_sum_over_the_values(distinct_cvae):
    m, tok = distinct_cvae
    ev = _evaluate(m, tok, PAIRS)
    want = _brute_force_marginal(m, tok, PAIRS)
    assert np.ptp(want) > 0.1  # rows differ: not a constant that any formula could hit
    np.testing.assert_allclose(ev.per_example["marginal_nll"].to_numpy(), want, rtol=0, atol=1e-9)
    # the marginal is below the negative ELBO (Jensen), and D_q is today's D = |S| lbar
    pe = ev.per_example
    assert (pe["marginal_nll"] <= pe["d_q"] + pe["kl"] + 1e-9).all()
    np.testing.assert_allclose(pe["d_q"], pe["n_tokens"] * pe["lbar"], rtol=1e-12)
    assert ev.metrics["readout/marginal_nll"] == pytest.approx(want.mean(), abs=1e-9)


def test_readouts_against_closed_forms_on_a_hand_table():
    d = np.array([[1.0, 3.0], [4.0, 2.0], [0.5, 0.5]])
    q = np.array([[0.9, 0.1], [0.2, 0.8], [0.5, 0.5]])
    p = np.array([[0.5, 0.5], [0.25, 0.75], [1.0, 0.0]])
    perm = np.array([1, 2, 0])
    r = discrete_readouts(d, q, p, perm)
    np.testing.assert_allclose(r["d_q"], [0.9 + 0.3, 0.8 + 1.6, 0.5])
    np.testing.assert_allclose(r["d_prior"], [2.0, 1.0 + 1.5, 0.5])
    np.testing.assert_allclose(r["d_shuffled"], [0.2 + 2.4, 2.0 + 1.0, 0.45 + 0.05])
    qbar = q.mean(0)
    np.testing.assert_allclose(r["d_aggregate"], d @ qbar)
    np.testing.assert_allclose(r["marginal_nll"], [-math.log(0.5 * math.exp(-1) + 0.5 * math.exp(-3)),
                                                   -math.log(0.25 * math.exp(-4) + 0.75 * math.exp(-2)), 0.5])


def test_shuffled_equals_posterior_when_the_posterior_is_the_same_for_every_row():
    rng = np.random.default_rng(1)
    d = rng.gamma(2.0, 3.0, size=(50, 4))
    q = np.tile(rng.dirichlet(np.ones(4)), (50, 1))
    r = discrete_readouts(d, q, q, shuffle_permutation(50, 3))
    np.testing.assert_allclose(r["d_shuffled"], r["d_q"], rtol=1e-13)
    np.testing.assert_allclose(r["d_aggregate"], r["d_q"], rtol=1e-13)


def test_shuffle_permutation_moves_every_row_and_is_seeded():
    for n in (2, 3, 17):
        pi = shuffle_permutation(n, 5)
        assert sorted(pi) == list(range(n)) and (pi != np.arange(n)).all()
        assert (shuffle_permutation(n, 5) == pi).all()
    assert shuffle_permutation(1, 0).tolist() == [0]


def test_collapsed_cvae_reads_no_use_and_its_marginal_is_its_reconstruction(tiny_lm):
    """At step 0 (zero latent embeddings) every value decodes alike: use is exactly 0 and the marginal
    is D_q for any posterior and router."""
    from zfree.models.discrete import DiscreteCVAE

    model, tok, _ = tiny_lm()
    m = DiscreteCVAE(copy.deepcopy(model), 4, "mean_y").double().eval()
    pe = _evaluate(m, tok, PAIRS).per_example
    for k in ("d_prior", "d_shuffled", "d_aggregate", "marginal_nll"):
        np.testing.assert_allclose(pe[k], pe["d_q"], rtol=0, atol=1e-9)


def test_readouts_of_a_given_z_decode_every_value(distinct_cvae):
    """A label oracle: D_q is the given value's NLL and the marginal is the router's mixture over all values."""
    m, tok = distinct_cvae
    given = copy.deepcopy(m)
    given.given, given.given_index = True, {"a": 0, "b": 2, "c": 1, "d": 2}
    given.posterior_head = None
    pe = _evaluate(given, tok, PAIRS).per_example
    np.testing.assert_allclose(pe["marginal_nll"], _brute_force_marginal(m, tok, PAIRS), rtol=0, atol=1e-9)
    np.testing.assert_allclose(pe["d_q"], pe["n_tokens"] * pe["lbar"], rtol=1e-12)


# ---------------------------------------------------------------------------- the Gaussian latent's IWAE bound


def _k_point_toy():
    """A 1-d toy whose marginal is known by enumeration: p(z) = N(0, 1); the decoder's -log p(y | z) is a
    quadratic in z, so p(y) = int p(z) p(y | z) dz has a closed form (a Gaussian integral)."""
    a, c, z0 = 0.7, 1.3, 0.8  # -log p(y | z) = c + a (z - z0)^2 / 2

    def nll(z):
        return c + 0.5 * a * (z - z0) ** 2

    # int N(z; 0, 1) exp(-c - a (z - z0)^2 / 2) dz = exp(-c) / sqrt(1 + a) exp(-a z0^2 / (2 (1 + a)))
    exact = c + 0.5 * math.log(1 + a) + a * z0**2 / (2 * (1 + a))
    return nll, exact


def test_iwae_bound_is_above_the_marginal_and_tightens_with_k():
    """Burda et al. 2016, theorem 1: E[bound_k] >= -log p(y) and falls with k; the mean over 4000
    replicas against the closed-form marginal, each k within 4 standard errors of the bound side."""
    nll, exact = _k_point_toy()
    g = torch.Generator().manual_seed(0)
    reps = 4000
    mu_q, lv_q = torch.full((reps, 1), 0.2, dtype=torch.float64), torch.full((reps, 1), math.log(0.5), dtype=torch.float64)
    zeros = torch.zeros_like(mu_q)
    gaps = {}
    for k in (1, 8, 64, 512):
        z = mu_q[:, None] + torch.exp(0.5 * lv_q)[:, None] * torch.randn((reps, k, 1), generator=g, dtype=torch.float64)
        bound = iwae_nll(nll(z[..., 0]), gaussian_log_density(z, mu_q, lv_q), gaussian_log_density(z, zeros, zeros))
        mean, se = float(bound.mean()), float(bound.std() / math.sqrt(reps))
        assert mean > exact - 4 * se, k  # an upper bound in expectation
        gaps[k] = (mean - exact, se)
    assert gaps[1][0] > gaps[8][0] > gaps[64][0] > gaps[512][0]
    # at k = 1 the gap is KL(q || the exact posterior), a Gaussian: precision 1 + a, mean a z0 / (1 + a)
    a, z0, mq, vq = 0.7, 0.8, 0.2, 0.5
    vp, mp = 1 / (1 + a), a * z0 / (1 + a)
    kl = 0.5 * (math.log(vp / vq) + vq / vp + (mq - mp) ** 2 / vp - 1)
    assert gaps[1][0] == pytest.approx(kl, abs=4 * gaps[1][1])
    assert abs(gaps[512][0]) < 4 * gaps[512][1] + 1e-3  # tight with many samples


def test_gaussian_log_density_matches_torch_distributions():
    g = torch.Generator().manual_seed(2)
    mu, lv = torch.randn((3, 4), generator=g, dtype=torch.float64), torch.randn((3, 4), generator=g, dtype=torch.float64)
    z = torch.randn((3, 5, 4), generator=g, dtype=torch.float64)
    want = torch.distributions.Normal(mu[:, None], torch.exp(0.5 * lv)[:, None]).log_prob(z).sum(-1)
    torch.testing.assert_close(gaussian_log_density(z, mu, lv), want)


def test_gaussian_cvae_writes_every_readout(tiny_lm):
    from zfree.models.continuous import ContinuousCVAE

    model, tok, _ = tiny_lm()
    torch.manual_seed(0)
    m = ContinuousCVAE(copy.deepcopy(model), d_latent=2).double().eval()
    ev = _evaluate(m, tok, PAIRS)
    pe = ev.per_example
    for k in READOUT_COLUMNS:
        assert k in pe
    # at step 0 the latent projection is zero: every z decodes alike, so D_prior = D_shuffled = D_q and
    # every importance weight is p(z)/q(z): the bound is D_q minus a log-mean of density ratios
    np.testing.assert_allclose(pe["d_prior"], pe["d_q"], atol=1e-9)
    np.testing.assert_allclose(pe["d_shuffled"], pe["d_q"], atol=1e-9)
    assert pe["d_aggregate"].isna().all()
    assert ev.metrics["readout/iw_samples"] == 64
