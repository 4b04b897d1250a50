"""Within-model readouts: what z does inside one trained CVAE, and what it is worth as a model of y given x.

All quantities are per evaluated row, in nats per example (sequence: |S| times the per-token mean).
For a discrete latent with K values, per-value sequence NLLs d_k = -log p(y | x, z=k), the
posterior q(k | x, y) and the prior/router p(k | x):

  D_q          sum_k q_k d_k                         reconstruction under the posterior
  D_prior      sum_k p_k d_k                         z drawn from the prior/router: no look at y
  D_shuffled   sum_k q_{pi(i),k} d_k                 another row's posterior (a seeded permutation pi)
  D_aggregate  sum_k qbar_k d_k                      z from the aggregate posterior qbar = mean_i q_i
  marginal     -log sum_k p_k exp(-d_k)              the exact marginal NLL -log p(y | x)

Within-model use is D_shuffled - D_q (and D_prior - D_q): the nats of y the decoder reads from z
on this row beyond what a z unrelated to it would give; both are 0 when q is the same for every row.
The marginal NLL is what the CVAE pays as a model of y given x, rate included, and satisfies
marginal <= D_q + KL(q || p) (the negative ELBO; equality when q is the exact posterior).

For a Gaussian latent the marginal is not available in closed form; ``iwae_nll`` gives the
importance-weighted bound of Burda, Grosse & Salakhutdinov (2016, "Importance Weighted
Autoencoders", eq. 8) with k samples from q, an upper bound on the marginal NLL that tightens as
k grows and equals the negative ELBO at k = 1 in expectation.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

from zfree.models.nll import masked_mean_token_nll

#: importance samples per row for the Gaussian latent's marginal bound (``iwae_nll``)
IW_SAMPLES = 64
#: the columns ``discrete_readouts`` returns (per_example.parquet keeps them under these names)
READOUT_COLUMNS = ("d_q", "d_prior", "d_shuffled", "d_aggregate", "marginal_nll")


def shuffle_permutation(n: int, seed: int) -> np.ndarray:
    """A seeded permutation of range(n) that moves every row when n >= 2 (a random cyclic shift of a
    random order: pi(order[j]) = order[(j + 1) mod n]), so no row reads its own posterior. (n,) int64."""
    if n < 2:
        return np.arange(n)
    order = np.random.default_rng(seed).permutation(n)
    pi = np.empty(n, dtype=np.int64)
    pi[order] = np.roll(order, -1)
    return pi


def discrete_readouts(seq_nll: np.ndarray, q: np.ndarray, p: np.ndarray, perm: np.ndarray) -> dict[str, np.ndarray]:
    """The module's five readouts for a K-valued latent. ``seq_nll`` (N, K): -log p(y | x, z=k) in
    nats per example; ``q`` (N, K) the posterior and ``p`` (N, K) the prior/router, rows summing to 1;
    ``perm`` (N,) the row permutation for D_shuffled (``shuffle_permutation``). Computed in float64.
    Returns READOUT_COLUMNS -> (N,) arrays. Raises ValueError on mismatched shapes."""
    d = np.asarray(seq_nll, np.float64)
    q, p = np.asarray(q, np.float64), np.asarray(p, np.float64)
    if d.ndim != 2 or q.shape != d.shape or p.shape != d.shape or np.shape(perm) != (d.shape[0],):
        raise ValueError(f"seq_nll {d.shape}, q {q.shape}, p {p.shape} and perm {np.shape(perm)} must be "
                         "(N, K), (N, K), (N, K) and (N,)")
    logp = np.log(np.clip(p, 1e-300, None))
    a = logp - d
    amax = a.max(-1, keepdims=True)
    marginal = -(amax[:, 0] + np.log(np.exp(a - amax).sum(-1)))
    return {"d_q": (q * d).sum(-1), "d_prior": (p * d).sum(-1), "d_shuffled": (q[perm] * d).sum(-1),
            "d_aggregate": d @ q.mean(0), "marginal_nll": marginal}


def gaussian_log_density(z: torch.Tensor, mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """log N(z; mu, diag(exp(logvar))) summed over the last axis (nats). ``z`` (..., n, D), ``mu`` and
    ``logvar`` (..., D), broadcast over n; returns (..., n)."""
    mu, logvar = mu.unsqueeze(-2), logvar.unsqueeze(-2)
    return -0.5 * (((z - mu) ** 2) * torch.exp(-logvar) + logvar + math.log(2 * math.pi)).sum(-1)


def iwae_nll(seq_nll: torch.Tensor, log_q: torch.Tensor, log_p: torch.Tensor) -> torch.Tensor:
    """The importance-weighted upper bound on -log p(y | x) (Burda et al. 2016, eq. 8), nats per example:
    -(logsumexp_s [-d_s + log p(z_s | x) - log q(z_s | x, y)] - log k), with z_1..z_k ~ q. All (B, k);
    returns (B,). Its expectation is >= the marginal NLL and falls towards it as k grows."""
    k = seq_nll.shape[-1]
    return -(torch.logsumexp(-seq_nll + log_p - log_q, dim=-1) - math.log(k))


#: posterior or prior samples per row for the Gaussian latent's D_prior and D_shuffled (Monte Carlo means)
MC_SAMPLES = 8


def _seq_nll(model, batch, z: torch.Tensor) -> torch.Tensor:
    """-log p(y | x, z_s) per row and sample, nats per example: (B, n)."""
    out = model(batch, z=z)
    return masked_mean_token_nll(-out.target_logprobs, batch.target_mask) * batch.target_len[:, None].to(z.dtype)


@torch.no_grad()
def gaussian_readouts(model, batch, out, generator: torch.Generator, perm: torch.Tensor,
                      iw_samples: int = IW_SAMPLES, chunk: int = MC_SAMPLES) -> dict[str, torch.Tensor]:
    """The readouts of a Gaussian-latent CVAE on one batch, each (B,) in nats per example: D_prior
    (``chunk`` samples from p(z | x)), D_shuffled (``chunk`` samples from the posterior of row
    ``perm[i]`` of the same batch: a batch of one row gives NaN) and the ``iwae_nll`` bound with
    ``iw_samples`` samples from q as ``marginal_nll``; D_aggregate is NaN (the aggregate posterior of a
    Gaussian latent is the mixture of all rows' posteriors, which D_shuffled already samples). ``out``:
    the model's forward on ``batch`` (posterior and prior parameters)."""
    mu_q, lv_q, mu_p, lv_p = out.posterior_mean, out.posterior_logvar, out.prior_mean, out.prior_logvar
    d, lq, lp = [], [], []
    for s in range(0, iw_samples, chunk):
        z = model.sample_posterior(mu_q, lv_q, min(chunk, iw_samples - s), generator)
        d.append(_seq_nll(model, batch, z))
        lq.append(gaussian_log_density(z, mu_q, lv_q))
        lp.append(gaussian_log_density(z, mu_p, lv_p))
    marginal = iwae_nll(torch.cat(d, -1), torch.cat(lq, -1), torch.cat(lp, -1))
    d_prior = _seq_nll(model, batch, model.sample_posterior(mu_p, lv_p, chunk, generator)).mean(-1)
    if len(perm) >= 2:
        d_shuffled = _seq_nll(model, batch, model.sample_posterior(mu_q[perm], lv_q[perm], chunk, generator)).mean(-1)
    else:
        d_shuffled = torch.full_like(marginal, float("nan"))
    return {"d_prior": d_prior, "d_shuffled": d_shuffled, "d_aggregate": torch.full_like(marginal, float("nan")),
            "marginal_nll": marginal}


def readout_metrics(df: pd.DataFrame) -> dict[str, float]:
    """readout/* means over the evaluated rows, nats per example: the five readouts, within-model use
    (D_shuffled - D_q, D_prior - D_q) and the negative ELBO (D_q + KL, beta = 1)."""
    m = {f"readout/{k}": float(df[k].mean()) for k in READOUT_COLUMNS}
    m["readout/use_shuffled"] = float((df["d_shuffled"] - df["d_q"]).mean())
    m["readout/use_prior"] = float((df["d_prior"] - df["d_q"]).mean())
    m["readout/neg_elbo"] = float((df["d_q"] + df["kl"]).mean())
    return m
