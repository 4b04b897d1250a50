"""What information-preference theory predicts (DESIGN §1).

Sources: Chen et al. 2017, "Variational Lossy Autoencoder" (information preference: a decoder
that can model the data alone leaves z unused unless using it lowers the objective); Alemi et
al. 2018, "Fixing a Broken ELBO" (the rate-distortion view: beta sets the slope).

On the synthetic benchmark, for an example with m consistent strategies out of K (uniform
prior), the z-free optimum costs log(K/m) nats per sequence; a latent that names the strategy
removes it at a rate of log(K/m) nats. In sequence nats the objective is |S|*lbar + beta_eff*K,
so z is worth using iff beta_eff * log(K/m) < log(K/m) + |S| * excess, i.e. beta_eff < 1 + |S| *
excess / log(K/m), where excess = b - analytic per token is the base model's measured excess.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def analytic_c_base(pairs: Sequence) -> float:
    """Exact c_base of the Bayes-optimal z-free model: mean_i bayes_nll_i / |S_i|, nats per token,
    with |S_i| = len(y_i) + 1 (digits plus the end token). Raises ValueError if a row lacks
    ``bayes_nll``."""
    vals = []
    for p in pairs:
        if p.bayes_nll is None:
            raise ValueError(f"row {p.id!r} has no bayes_nll: analytic c_base needs generator rows")
        vals.append(p.bayes_nll / (len(p.y.split()) + 1))
    return float(np.mean(vals))


def predicted_use(beta_eff: np.ndarray, bayes_nll: np.ndarray | None = None, excess_seq: np.ndarray | None = None
                  ) -> np.ndarray:
    """Per example: True where z pays for itself, beta_eff < 1 (+ |S|*excess / log(K/m) when given).

    Examples with bayes_nll == 0 (every strategy agrees) have nothing to explain: False.
    """
    beta_eff = np.asarray(beta_eff, float)
    thr = np.ones_like(beta_eff)
    if bayes_nll is not None:
        bn = np.asarray(bayes_nll, float)
        if excess_seq is not None:
            with np.errstate(divide="ignore", invalid="ignore"):
                thr = thr + np.where(bn > 0, np.asarray(excess_seq, float) / bn, 0.0)
        return (beta_eff < thr) & (bn > 0)
    return beta_eff < thr


def predicted_rate(beta_eff: np.ndarray, bayes_nll: np.ndarray, excess_seq: np.ndarray | None = None) -> float:
    """Predicted mean rate E[K] in nats per example: log(K/m) on examples predicted to use z, else 0."""
    use = predicted_use(beta_eff, bayes_nll, excess_seq)
    return float(np.mean(np.where(use, np.asarray(bayes_nll, float), 0.0)))
