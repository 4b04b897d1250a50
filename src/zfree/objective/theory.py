"""What information-preference theory predicts (docs/concepts/theory.md).

Sources: Chen et al. 2017, "Variational Lossy Autoencoder" (information preference: a decoder
that can model the data alone leaves z unused unless using it lowers the objective); Alemi et
al. 2018, "Fixing a Broken ELBO" (the rate-distortion view: beta sets the slope); seed 000
(w = 1/c_base, beta_eff = beta * c_base) and seed 002 (w = 1/(b + eps), beta_eff ∝ beta * (b + eps)).

On the synthetic benchmark, for an example whose consistent strategies carry prior mass P (m out
of K under the uniform prior, P = m/K), the z-free optimum costs bayes_nll = -log P nats per
sequence; a latent that names the strategy removes it at a rate of -log P nats (the posterior is
the prior restricted to the consistent strategies). In sequence nats the objective is
|S|*lbar + beta_eff*K, so z is worth using iff beta_eff * bayes_nll < bayes_nll + |S| * excess,
i.e. beta_eff < 1 + |S| * excess / bayes_nll, where excess = b - analytic per token is the base
model's measured excess (0 for a Bayes-optimal base model). Ties (beta_eff exactly at the
threshold) are predicted unused: z is not strictly better.

Array arguments are one-dimensional over examples ("n_rows") and accept anything numpy can
convert (lists, numpy arrays, pandas Series).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from zfree.core.weightings import OUTER_WEIGHTINGS as RECONSTRUCTION_WEIGHTINGS  # losses' registry, without torch


def _as_1d(name: str, a: ArrayLike) -> np.ndarray:
    arr = np.asarray(a, dtype=float)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional (one value per example), got shape {arr.shape}")
    return arr


def analytic_c_base(pairs: Sequence) -> float:
    """Exact c_base of the Bayes-optimal z-free model: mean_i bayes_nll_i / |S_i|, nats per token,
    with |S_i| = len(y_i) + 1 (digits plus the end token). ``pairs`` are ``zfree.data.pairs.Pair``
    rows (fields ``id``, ``y``, ``bayes_nll``). Raises ValueError if there are no rows or a row
    lacks ``bayes_nll``. Source: docs/concepts/problem.md#benchmark (the generator
    knows -log p*(y|x))."""
    vals = []
    for p in pairs:
        if p.bayes_nll is None:
            raise ValueError(f"row {p.id!r} has no bayes_nll: analytic c_base needs generator rows")
        vals.append(p.bayes_nll / (len(p.y.split()) + 1))
    if not vals:
        raise ValueError("analytic_c_base needs at least one row")
    return float(np.mean(vals))


def predicted_use(beta_eff: ArrayLike, bayes_nll: ArrayLike | None = None, excess_seq: ArrayLike | None = None,
                  exchange_rate: float = 1.0) -> np.ndarray:
    """Per example (bool, shape (n_rows,)): True where z pays for itself,
    beta_eff < eta * (1 + excess_seq / bayes_nll) (the second term only when both are given).

    ``exchange_rate`` eta: the nats of reconstruction one nat of rate buys: 1 on the synthetic benchmark by construction (z := the strategy lowers the
    sequence NLL by exactly the information it carries); on real data the measured
    eta = Delta R_label / H(label | x) of a label oracle (``zfree_lab.experiment.gains``).

    ``beta_eff`` is dimensionless (``zfree.objective.losses.effective_beta``); ``bayes_nll`` and
    ``excess_seq`` (= |S| * (b - analytic), the base model's excess) are nats per sequence.
    Examples with bayes_nll == 0 (every strategy agrees) have nothing to explain: False.
    Source: Chen et al. 2017 (information preference); docs/concepts/theory.md.
    """
    if not exchange_rate > 0:
        raise ValueError(f"exchange_rate={exchange_rate!r} must be > 0")
    beta_eff = _as_1d("beta_eff", beta_eff) / exchange_rate
    if bayes_nll is None:
        return beta_eff < 1.0
    bn = _as_1d("bayes_nll", bayes_nll)
    if bn.shape != beta_eff.shape:
        raise ValueError(f"bayes_nll has shape {bn.shape}, beta_eff {beta_eff.shape}")
    return (beta_eff < use_threshold(bn, excess_seq)) & (bn > 0)


def excess_nll(n_tokens: ArrayLike, b: ArrayLike, bayes_nll: ArrayLike) -> np.ndarray:
    """Per example (shape (n_rows,)): the z-free base's excess over the Bayes-optimal NLL, |S|·b − bayes_nll,
    nats per sequence (``n_tokens`` = |S| supervised tokens, ``b`` the base's mean NLL in nats per token,
    ``bayes_nll`` nats per sequence); the ``excess_seq`` of ``predicted_use`` and ``use_threshold``. NaN
    where ``bayes_nll`` is."""
    return _as_1d("n_tokens", n_tokens) * _as_1d("b", b) - _as_1d("bayes_nll", bayes_nll)


def use_threshold(bayes_nll: ArrayLike, excess_seq: ArrayLike | None = None) -> np.ndarray:
    """Per example (shape (n_rows,)): the β_eff below which z pays for itself at η = 1,
    1 + excess_seq / bayes_nll (1 without ``excess_seq``, and where bayes_nll == 0); ``predicted_use``
    compares β_eff / η with it. A base short of Bayes-optimal lifts it above 1: on the synthetic benchmark
    with its small shipped base the median is well above 1, so most rows are predicted to use z at a
    β_eff of 2. Nats per sequence in, dimensionless out."""
    bn = _as_1d("bayes_nll", bayes_nll)
    thr = np.ones_like(bn)
    if excess_seq is None:
        return thr
    ex = _as_1d("excess_seq", excess_seq)
    return thr + np.where(bn > 0, ex / np.where(bn > 0, bn, 1.0), 0.0)


def predicted_rate(beta_eff: ArrayLike, bayes_nll: ArrayLike, excess_seq: ArrayLike | None = None) -> float:
    """Predicted mean rate E[K], nats per example: bayes_nll_i (= log(K/m) under the uniform
    prior) on examples predicted to use z, else 0, averaged over examples. Raises ValueError on
    empty or mismatched inputs. Source: Alemi et al. 2018 (the rate at a given slope)."""
    use = predicted_use(beta_eff, bayes_nll, excess_seq)
    if use.size == 0:
        raise ValueError("predicted_rate needs at least one example")
    return float(np.mean(np.where(use, _as_1d("bayes_nll", bayes_nll), 0.0)))


def _weights(weighting: str, n: int, b: ArrayLike | None, c_base: float | None, epsilon: float) -> np.ndarray:
    if weighting == "token":
        raise ValueError("weighting='token' reweights inside lbar only; pass its outer weighting "
                         f"(token_outer: none -> 'plain', or one of {list(RECONSTRUCTION_WEIGHTINGS)})")
    import torch  # lazy: the report reads predictions without torch; the weights are the trainer's own

    from zfree.objective.losses import reconstruction_weight

    bt = None if b is None else torch.tensor(_as_1d("b", b), dtype=torch.float64)  # a copy: b may be read-only
    w = reconstruction_weight(weighting, batch_size=n, c_base=c_base, b=bt, epsilon=epsilon, dtype=torch.float64)
    return w.numpy()


def critical_beta(weighting: str, target_len: ArrayLike, bayes_nll: ArrayLike | None = None, *,
                  b: ArrayLike | None = None, c_base: float | None = None, epsilon: float = 0.0,
                  excess_seq: ArrayLike | None = None) -> np.ndarray:
    """Per example (shape (n_rows,)): the beta below which z is predicted to be used,
    beta* = threshold * w / |S| with threshold = 1 (+ excess_seq / bayes_nll when given).

    plain: 1/|S|; distribution: 1/(|S| c_base); example: 1/(|S| (b + eps)) (seeds 000, 002).
    ``target_len`` is |S| (tokens, end token included); ``b`` nats per token. Examples with
    bayes_nll == 0 get 0 (never used). Raises ValueError as ``reconstruction_weight`` does.
    """
    n_tok = _as_1d("target_len", target_len)
    w = _weights(weighting, len(n_tok), b, c_base, epsilon)
    thr = np.ones_like(n_tok)
    if bayes_nll is not None:
        bn = _as_1d("bayes_nll", bayes_nll)
        if excess_seq is not None:
            thr = thr + np.where(bn > 0, _as_1d("excess_seq", excess_seq) / np.where(bn > 0, bn, 1.0), 0.0)
        thr = np.where(bn > 0, thr, 0.0)
    return thr * w / n_tok


def predict_curve(weighting: str, betas: ArrayLike, target_len: ArrayLike, bayes_nll: ArrayLike,
                  b: ArrayLike | None = None, c_base: float | None = None, epsilon: float = 0.0,
                  excess_seq: ArrayLike | None = None) -> pd.DataFrame:
    """Predicted use and rate along a beta grid, to overlay on measured sweeps.

    For each beta: beta_eff_i = beta * |S_i| / w_i (``zfree.objective.losses.effective_beta``), then
    ``predicted_use`` and ``predicted_rate`` over the examples. Inputs: ``weighting`` one of
    plain / distribution / example (for token weighting pass its outer weighting); ``betas``
    (n_betas,), >= 0; ``target_len`` |S| per example (n_rows,), >= 1; ``bayes_nll`` (n_rows,)
    nats per sequence; ``b`` (n_rows,) nats per token (example weighting); ``c_base`` nats per
    token (distribution weighting); ``excess_seq`` as in ``predicted_use``.

    Returns a DataFrame with one row per beta and columns beta, predicted_use_fraction (fraction
    of examples predicted to use z), predicted_rate (mean nats per example), beta_eff_median.
    Raises ValueError for an unknown weighting, missing c_base / b / epsilon, negative or
    non-finite betas, or mismatched lengths. Sources: Chen et al. 2017; Alemi et al. 2018;
    seeds 000 and 002 for the weights.
    """
    betas = _as_1d("betas", betas)
    if not np.all(np.isfinite(betas)) or np.any(betas < 0):
        raise ValueError(f"betas must be finite and >= 0, got {betas.tolist()}")
    n_tok = _as_1d("target_len", target_len)
    bn = _as_1d("bayes_nll", bayes_nll)
    if len(n_tok) == 0 or n_tok.shape != bn.shape:
        raise ValueError(f"target_len {n_tok.shape} and bayes_nll {bn.shape} must be non-empty and of one length")
    if np.any(n_tok < 1):
        raise ValueError("target_len must be >= 1 on every example")
    w = _weights(weighting, len(n_tok), b, c_base, epsilon)
    rows = []
    for beta in betas:
        beta_eff = beta * n_tok / w
        use = predicted_use(beta_eff, bn, excess_seq)
        rows.append({"beta": float(beta), "predicted_use_fraction": float(use.mean()),
                     "predicted_rate": float(np.mean(np.where(use, bn, 0.0))),
                     "beta_eff_median": float(np.median(beta_eff))})
    return pd.DataFrame(rows, columns=["beta", "predicted_use_fraction", "predicted_rate", "beta_eff_median"])
