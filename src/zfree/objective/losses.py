"""Pure objective terms (docs/concepts/weightings.md): one function per math term, per-example tensors,
no reduction to J and no model (``zfree.objective.objectives`` assembles J from these terms).

Vocabulary of axis names: batch, seq, vocab, n_latent, d_model, d_latent, pos (flattened
supervised positions). All NLLs are in nats. Sources:
  seed 000 = the project's distribution-level rescaling, w = 1/c_base (docs/concepts/weightings.md)
  seed 002 = the project's example-level weighting, w = 1/(b + eps) (docs/concepts/weightings.md)
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from jaxtyping import Bool, Float, Int

from zfree.config import ObjectiveConfig
from zfree.models.nll import masked_mean_token_nll
from zfree.core.free_bits import FREE_BITS_MODES, free_bits_per_dim, kl_threshold  # noqa: F401 (re-exported)
from zfree.core.schedules import SCHEDULES, cyclical_fraction  # noqa: F401 (the registry; cyclical_fraction re-exported)
from zfree.core.weightings import OUTER_WEIGHTINGS, weight_function


def token_surprisal_shares(base_token_nll: Float[torch.Tensor, "batch seq"], target_mask: Bool[torch.Tensor, "batch seq"]
                           ) -> Float[torch.Tensor, "batch seq"]:
    """s_t = b_t / sum_{u in S} b_u over the supervised region (0 outside), shape (batch, seq).

    Rows whose base surprisal is 0 everywhere get uniform shares 1/|S| (nothing to prefer);
    values outside S may be anything (even inf/NaN). Source: seed 000, "Token-level
    surprisal-share weighting" (neighbouring variant)."""
    zero = torch.zeros((), dtype=base_token_nll.dtype, device=base_token_nll.device)
    b = torch.where(target_mask, base_token_nll, zero).clamp_min(0)
    tot = b.sum(-1, keepdim=True)
    uniform = target_mask / target_mask.sum(-1, keepdim=True)
    return torch.where(tot > 0, b / tot.clamp_min(1e-30), uniform)


def token_weights(base_token_nll: Float[torch.Tensor, "batch seq"], target_mask: Bool[torch.Tensor, "batch seq"],
                  alpha: float) -> Float[torch.Tensor, "batch seq"]:
    """Token-level surprisal-share weights omega_t = (1 - alpha) + alpha * |S| * s_t on S, 0 elsewhere.

    They sum to |S| per example, like uniform weights, so only the distribution inside the example
    changes (docs/concepts/weightings.md, token level). alpha = 0 gives uniform weights (plain). Raises
    ValueError if alpha is outside [0, 1].
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"token_alpha={alpha} must be in [0, 1]")
    n = target_mask.sum(-1, keepdim=True)
    s = token_surprisal_shares(base_token_nll, target_mask)
    return ((1 - alpha) + alpha * n * s) * target_mask


def weighted_mean_token_nll(token_nll: Float[torch.Tensor, "batch *latent seq"],
                            target_mask: Bool[torch.Tensor, "batch seq"],
                            weights: Float[torch.Tensor, "batch seq"]) -> Float[torch.Tensor, "batch *latent"]:
    """(1/|S|) sum_{t in S} omega_t nll_t, nats per token; shapes as ``masked_mean_token_nll``.

    Equals ``masked_mean_token_nll`` when omega = 1 on S (``token_weights`` with alpha = 0).
    Raises ValueError if some row has an empty S."""
    w = weights if token_nll.dim() == 2 else weights[:, None, :]
    return masked_mean_token_nll(token_nll * w, target_mask)


#: Valid outer reconstruction weightings (``token`` reweights inside lbar and uses one of these outside):
#: the registry's (``zfree.core.weightings``)
RECONSTRUCTION_WEIGHTINGS = OUTER_WEIGHTINGS


def reconstruction_weight(weighting: str, *, batch_size: int, c_base: float | None = None,
                          b: Float[torch.Tensor, "batch"] | None = None, epsilon: float = 0.0,
                          dtype: torch.dtype | None = None, device: torch.device | str | None = None
                          ) -> Float[torch.Tensor, "batch"]:
    """Per-example reconstruction weight w(x, y), shape (batch_size,), detached (a constant).

    plain (alias none, the token_outer spelling): 1.  distribution: 1 / c_base (seed 000: one
    global constant, no reweighting).  example: 1 / (b + epsilon) with ``b`` the per-example
    z-free surprisal in nats per token, shape (batch_size,) (seed 002; its gradient is
    grad(lbar) / (b + eps)). ``dtype`` defaults to b's dtype, else float32; ``device`` (where w is
    built: pass the log-probs' device) defaults to b's device, else the CPU.
    Raises ValueError for an unknown weighting (listing the valid ones), a missing, non-finite or
    non-positive c_base, a missing b or one of another length, or epsilon <= 0 for example.
    """
    fn = weight_function(weighting)  # ValueError listing the valid ones
    if dtype is None:
        dtype = b.dtype if b is not None else torch.float32
    if device is None:
        device = b.device if b is not None else torch.device("cpu")
    return fn(batch_size, c_base, b, epsilon, dtype, device)


def outer_weighting(cfg: ObjectiveConfig) -> str:
    """The weighting that sets w(x, y): ``cfg.weighting``, or under ``token`` (which reweights
    inside lbar) its outer weighting ``cfg.token_outer`` (docs/concepts/weightings.md, token level)."""
    return cfg.token_outer if cfg.weighting == "token" else cfg.weighting


def base_token_matrix(target_mask: Bool[torch.Tensor, "batch seq"], prefix_len: Int[torch.Tensor, "batch"],
                      rows: Sequence, dtype: torch.dtype = torch.float32) -> Float[torch.Tensor, "batch seq"]:
    """The base model's per-token surprisal b_t laid out like the batch (B, T), ``dtype`` (float32;
    float64 in the fp64 reference mode), nats:
    row r's values start at its first y position ``prefix_len[r]``, 0 elsewhere. ``rows[r]`` holds
    |S_r| values (the reference's ``surprisal_of``); on ``target_mask``'s device (one host->device
    copy). Raises ValueError if a row does not fit."""
    np_dtype = {torch.float32: np.float32, torch.float64: np.float64}[dtype]
    out = np.zeros(tuple(target_mask.shape), dtype=np_dtype)  # built on the host, copied to the device once
    for r, (p, s) in enumerate(zip(prefix_len.tolist(), rows)):  # one read of prefix_len, not one per row
        if p + len(s) > out.shape[1]:
            raise ValueError(f"row {r}: {len(s)} base surprisals from position {p} exceed the batch width {out.shape[1]}")
        out[r, p : p + len(s)] = np.asarray(s, dtype=np_dtype)  # a copy (the reference's arrays are read-only)
    return torch.from_numpy(out).to(target_mask.device)


def reconstruction_per_value(token_nll: Float[torch.Tensor, "batch n seq"], target_mask: Bool[torch.Tensor, "batch seq"],
                             cfg: ObjectiveConfig, base_token_nll: Float[torch.Tensor, "batch seq"] | None
                             ) -> Float[torch.Tensor, "batch n"]:
    """The reconstruction term per latent value or sample (B, n), nats per token: the plain masked
    mean (``masked_mean_token_nll``), or under ``token`` weighting the base-surprisal-share weighted
    mean (``token_weights`` with ``cfg.token_alpha``) when ``base_token_nll`` (B, T) is given."""
    if cfg.weighting != "token" or base_token_nll is None:
        return masked_mean_token_nll(token_nll, target_mask)
    return weighted_mean_token_nll(token_nll, target_mask, token_weights(base_token_nll, target_mask, cfg.token_alpha))


def categorical_kl(q_logits: Float[torch.Tensor, "batch n_latent"], p_logits: Float[torch.Tensor, "batch n_latent"]
                   ) -> Float[torch.Tensor, "batch"]:
    """Rate K = KL(q(z|x,y) || p(z|x)) = sum_k q_k (log q_k - log p_k), nats per example.

    Shapes (batch, n_latent) -> (batch,); logits must be finite. Equals
    ``torch.distributions.kl_divergence`` of two Categoricals (tested)."""
    lq = torch.log_softmax(q_logits, -1)
    lp = torch.log_softmax(p_logits, -1)
    return (lq.exp() * (lq - lp)).sum(-1)


def gaussian_kl(mu_q: Float[torch.Tensor, "batch d_latent"], logvar_q: Float[torch.Tensor, "batch d_latent"],
                mu_p: Float[torch.Tensor, "batch d_latent"] | None = None,
                logvar_p: Float[torch.Tensor, "batch d_latent"] | None = None, per_dim: bool = False
                ) -> Float[torch.Tensor, "batch"] | Float[torch.Tensor, "batch d_latent"]:
    """Rate of the continuous CVAE: KL(N(mu_q, diag e^logvar_q) || N(mu_p, diag e^logvar_p)), nats
    per example; the prior is N(0, I) when mu_p and logvar_p are both None.

    0.5 * sum_d [logvar_p - logvar_q + (e^logvar_q + (mu_q - mu_p)^2) / e^logvar_p - 1]
    (Kingma & Welling 2014, App. B). Returns (batch,) or (batch, d_latent) with ``per_dim``.
    Raises ValueError if only one of mu_p, logvar_p is given.
    """
    if (mu_p is None) != (logvar_p is None):
        raise ValueError("gaussian_kl: give both mu_p and logvar_p (learned prior) or neither (N(0, I))")
    if mu_p is None:
        mu_p, logvar_p = torch.zeros_like(mu_q), torch.zeros_like(logvar_q)
    kl = 0.5 * (logvar_p - logvar_q + (logvar_q.exp() + (mu_q - mu_p) ** 2) / logvar_p.exp() - 1.0)
    return kl if per_dim else kl.sum(-1)


def inter_latent_jsd(logp: Float[torch.Tensor, "batch n_latent pos vocab"], weights: Float[torch.Tensor, "batch n_latent"],
                     pos_mask: Bool[torch.Tensor, "batch pos"]) -> Float[torch.Tensor, "batch"]:
    """Generalized Jensen-Shannon divergence among the K decoder next-token distributions,
    JSD_pi = H(sum_k pi_k p_k) - sum_k pi_k H(p_k), averaged over supervised positions; nats.

    0 <= JSD <= H(pi) <= log K; with router weights it is I(z; y_t | x, y_<t) under p(z|x).
    ``logp`` holds log-probs at the positions predicting supervised tokens (padded with anything
    where ``pos_mask`` is False; -inf log-probs are allowed). ``weights`` (non-negative, e.g. the
    router p(z|x)) are normalized to pi per row. Returns (batch,). Raises ValueError if a row has
    no position. Source: seed 000, "Inter-Latent JSD"; Lin 1991 (generalized JSD).
    """
    n = pos_mask.sum(-1)
    if (n == 0).any():
        raise ValueError("inter_latent_jsd: a row has no supervised position")
    pi = weights / weights.sum(-1, keepdim=True)
    # Select padding away (not multiply by 0) and clamp -inf so neither value nor gradient sees NaN.
    logp = torch.where(pos_mask[:, None, :, None], logp, torch.zeros((), dtype=logp.dtype, device=logp.device))
    logp = logp.clamp_min_(torch.finfo(logp.dtype).min)  # in place on the fresh copy: one copy, not two
    p = logp.exp()
    mix = (pi[:, :, None, None] * p).sum(1)  # (B, P, V)
    h_mix = -(mix * torch.log(mix.clamp_min(1e-30))).sum(-1)
    h_each = -(p * logp).sum(-1)  # (B, K, P)
    jsd = h_mix - (pi[:, :, None] * h_each).sum(1)  # (B, P)
    return (jsd * pos_mask).sum(-1) / n.to(jsd.dtype)


def apply_free_bits(kl: Float[torch.Tensor, "batch"], free_bits: float, mode: str) -> Float[torch.Tensor, "batch"]:
    """Free bits (Kingma et al. 2016): KL below ``free_bits`` nats is not penalized; the ``mode`` entry
    of the registry ``zfree.core.free_bits.FREE_BITS_MODES``.

    per_example: max(K_i, lambda) for each example. batch_mean: the batch-mean KL is clamped,
    max(mean K, lambda), returned rescaled per example so its mean is the clamped value (and its
    gradient is 0 while the mean is below lambda). threshold: Optimus's mask (``kl_threshold``; a
    Gaussian's per-dimension KL goes to ``kl_threshold`` directly). none (or free_bits <= 0): unchanged.
    Shapes (batch,) -> (batch,), nats per example. Raises ValueError for an unknown mode.
    """
    fn = FREE_BITS_MODES[mode].per_example if mode in FREE_BITS_MODES else None
    if fn is None:
        raise ValueError(f"free_bits_mode={mode!r} is not one of "
                         f"{[n for n, m in FREE_BITS_MODES.items() if m.per_example is not None]}")
    if free_bits <= 0:
        return kl
    return fn(kl, free_bits)


def penalized_kl_dims(kl_dims: Float[torch.Tensor, "batch d_latent"], free_bits: float, mode: str
                      ) -> Float[torch.Tensor, "batch"]:
    """The penalized KL of a Gaussian latent (batch,), nats per example, from its KL per dimension
    ``kl_dims`` (batch, d_latent): the mode's ``per_dim`` rule where it has one (per_dim, threshold),
    else ``apply_free_bits`` on the sum over dimensions. Raises ValueError for an unknown mode."""
    entry = FREE_BITS_MODES.get(mode)
    if entry is not None and entry.per_dim is not None:
        return entry.per_dim(kl_dims, free_bits)
    return apply_free_bits(kl_dims.sum(-1), free_bits, mode)


def beta_at_step(cfg: ObjectiveConfig, step: int) -> float:
    """beta as a function of the optimizer step: the ``beta_schedule`` entry of the registry
    ``zfree.core.schedules.SCHEDULES`` (constant; linear warm-up 0 -> beta over ``beta_warmup_steps``;
    cyclical, Fu et al. 2019, NAACL: within each period of ``beta_cycle_steps``, 0 over the first
    ``beta_ratio_zero`` of it, linear 0 -> beta over the next ``beta_ratio_increase``, then beta).
    With ``ae_steps`` > 0, beta = 0 through step ``ae_steps`` (an autoencoder phase; Bowman et al.
    2016 anneal from 0 instead) and the schedule runs on from there.
    Raises ValueError for a negative step or an unknown schedule."""
    if step < 0:
        raise ValueError(f"step={step} must be >= 0")
    if cfg.ae_steps:
        if step <= cfg.ae_steps:
            return 0.0
        step -= cfg.ae_steps
    if cfg.beta_schedule not in SCHEDULES:
        raise ValueError(f"beta_schedule={cfg.beta_schedule!r} is not one of {list(SCHEDULES)}")
    return SCHEDULES[cfg.beta_schedule].beta(cfg, step)


def effective_beta(beta: float, target_len: Int[torch.Tensor, "batch"], w: Float[torch.Tensor, "batch"]
                   ) -> Float[torch.Tensor, "batch"]:
    """beta_eff(x, y) = beta * |S(x, y)| / w(x, y), exact in sequence nats (docs/concepts/theory.md).

    Dividing J = w * lbar + beta * K by w/|S| gives |S| * lbar + beta_eff * K: z pays for itself on
    an example iff beta_eff < 1. Seed 002 states the proportional form beta_eff ∝ beta * (b + eps).
    """
    return beta * target_len.to(w.dtype) / w


#: beta below this counts as 0 in ``optimal_posterior_logits`` (the posterior becomes the argmin)
OPTIMAL_POSTERIOR_MIN_BETA = 1e-4


def optimal_posterior_logits(recon_per_latent: Float[torch.Tensor, "batch n_latent"],
                             p_logits: Float[torch.Tensor, "batch n_latent"], w: Float[torch.Tensor, "batch"],
                             beta: float) -> Float[torch.Tensor, "batch n_latent"]:
    """The posterior that minimizes J_i = w_i * sum_k q_k r_ik + beta * KL(q || p) for fixed decoders
    and router: log q(k | x_i, y_i) = log p(k | x_i) - w_i r_ik / beta + const (the Gibbs / EM
    E-step posterior; Neal & Hinton 1998, eq. 2 with temperature beta / w_i; at w = beta = 1 it is
    the exact Bayes posterior p(k | x, y)). At this q, J_i = -beta log sum_k p_k exp(-w_i r_ik / beta).

    recon_per_latent (B, K): per-token NLL of each value, nats; p_logits (B, K): router logits;
    w (B,): reconstruction weights. Returned detached: by the envelope theorem the gradient of J at
    the optimal q with q held fixed equals the total gradient (tested against autograd). ``beta`` below
    ``OPTIMAL_POSTERIOR_MIN_BETA`` is clamped to it (the argmin, up to ties). With free bits or the
    JSD term in the objective this q is the optimum of the objective without them. Raises
    ValueError for beta < 0.
    """
    if beta < 0:
        raise ValueError(f"beta={beta} must be >= 0")
    t = max(beta, OPTIMAL_POSTERIOR_MIN_BETA)
    return (torch.log_softmax(p_logits, -1) - w[:, None] * recon_per_latent / t).detach()
