"""Pure objective terms (DESIGN §1). One function per math term; per-example outputs; one
assembler (``assemble_objective``) reduces them and returns a named breakdown.

Vocabulary of axis names: batch, seq, vocab, n_latent, d_model, d_latent, pos (flattened
supervised positions). All NLLs are in nats. Sources:
  seed 000 = ../shared/seeds/000_c0dcb230ee7e6368.txt (distribution-level rescaling, w = 1/c_base)
  seed 002 = ../shared/seeds/002_456af910ac8bddc4.txt (example-level weighting, w = 1/(b + eps))
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from jaxtyping import Bool, Float, Int

from zfree.config import ObjectiveConfig


def masked_mean_token_nll(token_nll: Float[torch.Tensor, "batch *latent seq"],
                          target_mask: Bool[torch.Tensor, "batch seq"]) -> Float[torch.Tensor, "batch *latent"]:
    """nll(x, y) = (1/|S|) sum_{t in S} -log p(y_t | x, y_<t): masked mean, nats per token.

    ``token_nll`` is (batch, seq) or (batch, n_latent, seq); the mask (True = supervised position
    in S) is broadcast over the latent axis. Positions outside S may hold anything, even inf or
    NaN (they are selected away, not multiplied by 0, so they reach neither value nor gradient).
    Returns (batch,) or (batch, n_latent). Raises ValueError if some row has an empty S.
    Source: seed 000, "Implementation detail" (masked to the y-span, averaged not summed).
    """
    n = target_mask.sum(-1)
    if (n == 0).any():
        raise ValueError(f"rows {torch.nonzero(n == 0).flatten().tolist()} have an empty supervised region")
    m = target_mask if token_nll.dim() == 2 else target_mask[:, None, :]
    s = torch.where(m, token_nll, torch.zeros((), dtype=token_nll.dtype, device=token_nll.device)).sum(-1)
    return s / (n if token_nll.dim() == 2 else n[:, None]).to(s.dtype)


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
    changes (DESIGN §1, token). alpha = 0 gives uniform weights (plain). Raises ValueError if alpha
    is outside [0, 1].
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


#: Valid outer reconstruction weightings (``token`` reweights inside lbar and uses one of these outside).
RECONSTRUCTION_WEIGHTINGS = ("plain", "distribution", "example")


def reconstruction_weight(weighting: str, *, batch_size: int, c_base: float | None = None,
                          b: Float[torch.Tensor, "batch"] | None = None, epsilon: float = 0.0,
                          dtype: torch.dtype | None = None) -> Float[torch.Tensor, "batch"]:
    """Per-example reconstruction weight w(x, y), shape (batch_size,), detached (a constant).

    plain (alias none, the token_outer spelling): 1.  distribution: 1 / c_base (seed 000: one
    global constant, no reweighting).  example: 1 / (b + epsilon) with ``b`` the per-example
    z-free surprisal in nats per token, shape (batch_size,) (seed 002; its gradient is
    grad(lbar) / (b + eps)). ``dtype`` defaults to b's dtype, else float32.
    Raises ValueError for an unknown weighting (listing the valid ones), a missing, non-finite or
    non-positive c_base, a missing b or one of another length, or epsilon <= 0 for example.
    """
    if dtype is None:
        dtype = b.dtype if b is not None else torch.float32
    if weighting in ("plain", "none"):
        return torch.ones(batch_size, dtype=dtype, device=None if b is None else b.device)
    if weighting == "distribution":
        if c_base is None or not math.isfinite(c_base) or c_base <= 0:
            raise ValueError(f"c_base={c_base!r} must be a finite positive number for distribution weighting")
        return torch.full((batch_size,), 1.0 / float(c_base), dtype=dtype, device=None if b is None else b.device)
    if weighting == "example":
        if b is None:
            raise ValueError("example weighting needs the per-example base surprisal b")
        if b.shape != (batch_size,):
            raise ValueError(f"b has shape {tuple(b.shape)}, expected ({batch_size},)")
        if not epsilon > 0:
            raise ValueError(f"epsilon={epsilon!r} must be > 0 for example weighting (seed 002)")
        return (1.0 / (b.detach().clamp_min(0) + epsilon)).to(dtype)
    raise ValueError(f"weighting={weighting!r} is not one of {list(RECONSTRUCTION_WEIGHTINGS)}")


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


_FREE_BITS_MODES = ("none", "per_example", "batch_mean")


def apply_free_bits(kl: Float[torch.Tensor, "batch"], free_bits: float, mode: str) -> Float[torch.Tensor, "batch"]:
    """Free bits (Kingma et al. 2016): KL below ``free_bits`` nats is not penalized.

    per_example: max(K_i, lambda) for each example. batch_mean: the batch-mean KL is clamped,
    max(mean K, lambda), returned rescaled per example so its mean is the clamped value (and its
    gradient is 0 while the mean is below lambda). none (or free_bits <= 0): unchanged.
    Shapes (batch,) -> (batch,), nats per example. Raises ValueError for an unknown mode.
    """
    if mode not in _FREE_BITS_MODES:
        raise ValueError(f"free_bits_mode={mode!r} is not one of {list(_FREE_BITS_MODES)}")
    if mode == "none" or free_bits <= 0:
        return kl
    if mode == "per_example":
        return kl.clamp_min(free_bits)
    m = kl.mean()
    if m > 0:
        return kl * (torch.clamp_min(m, free_bits) / m)
    return kl * 0 + free_bits  # all K = 0: constant lambda, no gradient (not kl + lambda, whose gradient is 1/B)


def beta_at_step(cfg: ObjectiveConfig, step: int) -> float:
    """beta schedule as a function of the optimizer step: constant; linear warm-up 0 -> beta over
    ``beta_warmup_steps``; cyclical (Fu et al. 2019, NAACL): within each period of
    ``beta_cycle_steps``, linear 0 -> beta over the first half, then beta (their R = 0.5).
    With ``ae_steps`` > 0, beta = 0 through step ``ae_steps`` (an autoencoder phase; Bowman et al.
    2016 anneal from 0 instead) and the schedule runs on from there.
    Raises ValueError for a negative step or an unknown schedule."""
    if step < 0:
        raise ValueError(f"step={step} must be >= 0")
    if cfg.ae_steps:
        if step <= cfg.ae_steps:
            return 0.0
        step -= cfg.ae_steps
    if cfg.beta_schedule == "constant":
        return cfg.beta
    if cfg.beta_schedule == "linear":
        return cfg.beta * min(1.0, step / cfg.beta_warmup_steps)
    if cfg.beta_schedule == "cyclical":
        tau = (step % cfg.beta_cycle_steps) / cfg.beta_cycle_steps
        return cfg.beta * min(1.0, 2 * tau)
    raise ValueError(f"beta_schedule={cfg.beta_schedule!r} is not one of ['constant', 'linear', 'cyclical']")


def effective_beta(beta: float, target_len: Int[torch.Tensor, "batch"], w: Float[torch.Tensor, "batch"]
                   ) -> Float[torch.Tensor, "batch"]:
    """beta_eff(x, y) = beta * |S(x, y)| / w(x, y), exact in sequence nats (DESIGN §1).

    Dividing J = w * lbar + beta * K by w/|S| gives |S| * lbar + beta_eff * K: z pays for itself on
    an example iff beta_eff < 1. Seed 002 states the proportional form beta_eff ∝ beta * (b + eps).
    """
    return beta * target_len.to(w.dtype) / w


@dataclass
class ObjectiveBreakdown:
    """Named breakdown of one evaluation of J (every term can be logged)."""

    total: torch.Tensor  # scalar to minimize
    terms: dict[str, torch.Tensor]  # raw batch means: reconstruction_loss, kl_prior_loss, decoder_jsd
    contributions: dict[str, torch.Tensor]  # weighted batch means that sum to total
    recon_weight: torch.Tensor  # (batch,)
    beta_eff: torch.Tensor  # (batch,)
    per_example: dict[str, torch.Tensor] = field(default_factory=dict)  # lbar, kl, weighted recon

    def fractions_abs(self) -> dict[str, float]:
        """loss_contrib/fraction_abs/<term> = |contribution| / sum |contributions|."""
        tot = sum(abs(float(v.detach())) for v in self.contributions.values()) or 1.0
        return {k: abs(float(v.detach())) / tot for k, v in self.contributions.items()}

    def log_dict(self, prefix: str = "loss/train") -> dict[str, float]:
        d = {f"{prefix}/total": self.total.item()}
        d.update({f"{prefix}/{k}": float(v.detach()) for k, v in self.terms.items()})
        d.update({f"loss_contrib/fraction_abs/{k}": v for k, v in self.fractions_abs().items()})
        d["objective/recon_weight_mean"] = float(self.recon_weight.mean())
        d["objective/recon_weight_max"] = float(self.recon_weight.max())
        d["objective/beta_eff_median"] = float(self.beta_eff.median())
        return d


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


def assemble_objective(cfg: ObjectiveConfig, *, recon_per_latent: Float[torch.Tensor, "batch n_latent"],
                       q_logits: Float[torch.Tensor, "batch n_latent"] | None, p_logits: Float[torch.Tensor, "batch n_latent"],
                       target_len: Int[torch.Tensor, "batch"], step: int = 0, c_base: float | None = None,
                       b: Float[torch.Tensor, "batch"] | None = None, jsd: Float[torch.Tensor, "batch"] | None = None
                       ) -> ObjectiveBreakdown:
    """J = mean_i [ w_i * lbar_i + beta * K_i ] - lambda_jsd * mean_i JSD_i  (DESIGN §1).

    lbar_i = sum_k q(k | x_i, y_i) * recon_per_latent[i, k] is the exact expectation over the K
    latent values (recon_per_latent is the per-token mean NLL, token-weighted for ``token``).
    w_i follows ``cfg.weighting`` (token: its outer weight, ``cfg.token_outer``). K_i is the
    categorical KL to the router after free bits. Shapes: recon_per_latent, q_logits, p_logits
    (batch, n_latent); target_len, b (per-example base surprisal, nats per token), jsd (batch,).
    ``q_logits=None``: the optimal posterior (``optimal_posterior_logits``, detached), returned in
    ``per_example["q_logits"]`` (the given logits otherwise).
    ``contributions`` sum to ``total``. Raises ValueError (from ``reconstruction_weight``) for a
    missing/invalid c_base or b, and when ``cfg.lambda_jsd > 0`` but no ``jsd`` is given (the term
    would silently vanish from the objective).
    """
    if cfg.lambda_jsd > 0 and jsd is None:
        raise ValueError(f"lambda_jsd={cfg.lambda_jsd} > 0 but no jsd was given to assemble_objective")
    B = recon_per_latent.shape[0]
    outer = cfg.token_outer if cfg.weighting == "token" else cfg.weighting
    w = reconstruction_weight(outer, batch_size=B, c_base=c_base, b=b, epsilon=cfg.epsilon,
                              dtype=recon_per_latent.dtype).to(recon_per_latent.device)
    beta = beta_at_step(cfg, step)
    if q_logits is None:
        q_logits = optimal_posterior_logits(recon_per_latent, p_logits, w, beta)
    q = torch.softmax(q_logits, -1)
    lbar = (q * recon_per_latent).sum(-1)
    kl = categorical_kl(q_logits, p_logits)
    kl_pen = apply_free_bits(kl, cfg.free_bits, cfg.free_bits_mode)
    contributions = {"reconstruction_loss": (w * lbar).mean(), "kl_prior_loss": beta * kl_pen.mean()}
    terms = {"reconstruction_loss": lbar.mean(), "kl_prior_loss": kl.mean()}
    if jsd is not None:
        terms["decoder_jsd"] = jsd.mean()
        if cfg.lambda_jsd > 0:
            contributions["decoder_jsd"] = -cfg.lambda_jsd * jsd.mean()
    total = sum(contributions.values())
    return ObjectiveBreakdown(total, terms, contributions, w.detach(), effective_beta(beta, target_len, w.detach()),
                              {"lbar": lbar, "kl": kl, "weighted_recon": w * lbar, "q_logits": q_logits})


def free_bits_per_dim(kl_dims: Float[torch.Tensor, "batch d_latent"], free_bits: float) -> Float[torch.Tensor, "batch"]:
    """Free bits per latent dimension (Kingma et al. 2016, eq. 15, one group per dimension):
    sum_d max(lambda, mean_batch KL_d), returned per example (batch,) in nats so that its batch mean
    is that value: dimension d contributes KL_{i,d} * max(m_d, lambda) / m_d, whose gradient is 0
    while the batch-mean KL m_d of that dimension is below lambda (``free_bits``, nats per dimension).
    ``free_bits`` <= 0: the plain sum over dimensions."""
    if free_bits <= 0:
        return kl_dims.sum(-1)
    m = kl_dims.mean(0, keepdim=True)  # (1, d_latent)
    scaled = torch.where(m > 0, kl_dims * (torch.clamp_min(m, free_bits) / m.clamp_min(1e-12)),  # 1e-12: finite grads
                         kl_dims * 0 + free_bits)
    return scaled.sum(-1)


def assemble_gaussian_objective(cfg: ObjectiveConfig, *, recon_per_sample: Float[torch.Tensor, "batch n_samples"],
                                mu_q: Float[torch.Tensor, "batch d_latent"], logvar_q: Float[torch.Tensor, "batch d_latent"],
                                mu_p: Float[torch.Tensor, "batch d_latent"] | None,
                                logvar_p: Float[torch.Tensor, "batch d_latent"] | None,
                                target_len: Int[torch.Tensor, "batch"], step: int = 0, c_base: float | None = None,
                                b: Float[torch.Tensor, "batch"] | None = None) -> ObjectiveBreakdown:
    """J = mean_i [ w_i * lbar_i + beta * K_i ] for the continuous CVAE (DESIGN §1), with the same
    term names as ``assemble_objective`` (reconstruction_loss, kl_prior_loss).

    lbar_i = (1/S) sum_s recon_per_sample[i, s] is the reparameterized Monte Carlo estimate of
    E_q[nll] (recon_per_sample: per-token mean NLL per sample, token-weighted for ``token``).
    K_i = ``gaussian_kl`` (analytic; N(0, I) prior when mu_p, logvar_p are None) after free bits:
    ``per_dim`` uses ``free_bits_per_dim``, the other modes ``apply_free_bits`` on the summed KL.
    ``contributions`` sum to ``total``. Raises ValueError when ``cfg.lambda_jsd > 0`` (the
    inter-latent JSD is defined over K discrete values) and as ``reconstruction_weight`` does.
    """
    if cfg.lambda_jsd > 0:
        raise ValueError(f"lambda_jsd={cfg.lambda_jsd} > 0 is defined for the discrete CVAE only")
    B = recon_per_sample.shape[0]
    lbar = recon_per_sample.mean(-1)
    outer = cfg.token_outer if cfg.weighting == "token" else cfg.weighting
    w = reconstruction_weight(outer, batch_size=B, c_base=c_base, b=b, epsilon=cfg.epsilon,
                              dtype=lbar.dtype).to(lbar.device)
    kl_dims = gaussian_kl(mu_q, logvar_q, mu_p, logvar_p, per_dim=True)
    kl = kl_dims.sum(-1)
    beta = beta_at_step(cfg, step)
    if cfg.free_bits_mode == "per_dim":
        kl_pen = free_bits_per_dim(kl_dims, cfg.free_bits)
    else:
        kl_pen = apply_free_bits(kl, cfg.free_bits, cfg.free_bits_mode)
    contributions = {"reconstruction_loss": (w * lbar).mean(), "kl_prior_loss": beta * kl_pen.mean()}
    terms = {"reconstruction_loss": lbar.mean(), "kl_prior_loss": kl.mean()}
    total = sum(contributions.values())
    return ObjectiveBreakdown(total, terms, contributions, w.detach(), effective_beta(beta, target_len, w.detach()),
                              {"lbar": lbar, "kl": kl, "weighted_recon": w * lbar})
