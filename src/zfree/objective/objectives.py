"""The objective J (docs/concepts/weightings.md) for every latent kind and phase, from one assembler.

    J = mean_i [ w_i * lbar_i ] + sum_terms contribution_term

``assemble(kind, ...)`` computes the weight w_i (``losses.reconstruction_weight`` of the outer
weighting) and the scheduled beta (``losses.beta_at_step``) once, asks the kind's term function
(``KINDS``) for lbar_i and its other terms, and reduces everything into one
``ObjectiveBreakdown`` whose contributions sum to the total and whose beta_eff is
beta_at_step * |S| / w. The kinds:

  discrete  soft CVAE: lbar = sum_k q_k r_k (exact over the K values), rate = categorical KL after
            free bits, optionally - lambda_jsd * JSD;
  gaussian  continuous CVAE: lbar = the mean over reparameterized samples, rate = analytic KL after
            free bits (the mode's per-dimension rule: ``losses.penalized_kl_dims``);
  hard_em   the hard-EM aid (Shen et al. 2019): lbar = the decoded value's nll, plus the posterior's
            cross-entropy toward k* and the router's toward the (detached) posterior; no rate term.
            The reconstruction weight's batch mean is ``hard_em_recon_scale``'s (``hard_em_recon_factor``).
  given     a given z (the z-free control, a label oracle): lbar = the given value's nll; the rate
            KL(one-hot || p(z|x)) = -log p(z|x) is logged as kl_prior_loss and trains the router (a
            probe on detached features) with weight 1, whatever beta. It cannot reach the decoder: no
            gradient path, and the router's gradient is clipped on its own (``OptimConfig.router_clip``).

Training (``step_objective``: the model's forward pass, then ``assemble``) and evaluation
(``zfree_lab.run.metrics``) both call ``assemble``, so they cannot compute different objectives.
The step's forward passes ``zfree_metrics=False``: it reads no z-free quantity of the y-region, so
the models skip the z-free head on y and, where no posterior head reads y, the z-free pass over it
(``zfree.models.discrete.DiscreteCVAE._zfree_heads``); evaluation computes them as metrics.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Callable

import torch
from jaxtyping import Float, Int

from zfree.config import LatentKind, ObjectiveConfig, TrainConfig
from zfree.data.batching import Batch
from zfree.models.nll import masked_mean_token_nll
from zfree.objective.losses import (apply_free_bits, beta_at_step, categorical_kl, effective_beta,
                                    gaussian_kl, penalized_kl_dims, inter_latent_jsd, optimal_posterior_logits,
                                    outer_weighting, reconstruction_per_value, reconstruction_weight)
from zfree.models.precision import body_autocast, model_outputs_fp32


#: terms that are >= 0 by definition (a KL, a Jensen-Shannon divergence): logged clipped at 0, so a
#: float rounding below zero (e.g. -4e-10 nats for a collapsed latent) is never reported. The
#: objective itself uses the unclipped values (clipping would zero their gradient there).
NONNEGATIVE_TERMS = frozenset({"kl_prior_loss", "decoder_jsd"})


def _reported(name: str, v: torch.Tensor) -> torch.Tensor:
    """A term's value as logged: clipped at 0 for ``NONNEGATIVE_TERMS``, else as is (detached)."""
    return v.detach().clamp_min(0) if name in NONNEGATIVE_TERMS else v.detach()


@dataclass
class ObjectiveBreakdown:
    """Named breakdown of one evaluation of J (every term can be logged)."""

    total: torch.Tensor  # scalar to minimize
    terms: dict[str, torch.Tensor]  # raw batch means: reconstruction_loss, kl_prior_loss, decoder_jsd, ...
    contributions: dict[str, torch.Tensor]  # weighted batch means that sum to total
    recon_weight: torch.Tensor  # (batch,)
    beta_eff: torch.Tensor  # (batch,)
    per_example: dict[str, torch.Tensor] = field(default_factory=dict)  # lbar, kl, weighted recon, q_logits

    def fractions_abs(self) -> dict[str, float]:
        """loss_contrib/fraction_abs/<term> = |contribution| / sum |contributions|."""
        tot = sum(abs(float(v.detach())) for v in self.contributions.values()) or 1.0
        return {k: abs(float(v.detach())) / tot for k, v in self.contributions.items()}

    def log_tensors(self, prefix: str = "loss/train") -> dict[str, torch.Tensor]:
        """``log_dict``'s training keys (without loss_contrib/...) as detached float64 0-dim tensors
        on the loss's device: the training loop sums them over steps and reads them only at
        evaluation, so a step needs no device->host copy. float64 of the float32 values, so the
        running sums equal Python's float sums of ``log_dict`` bit for bit."""
        d = {f"{prefix}/total": self.total.detach().double()}
        d.update({f"{prefix}/{k}": _reported(k, v).double() for k, v in self.terms.items()})
        d["objective/recon_weight_mean"] = self.recon_weight.mean().double()
        d["objective/recon_weight_max"] = self.recon_weight.max().double()
        d["objective/beta_eff_median"] = self.beta_eff.median().double()
        return d

    def log_dict(self, prefix: str = "loss/train") -> dict[str, float]:
        """Flat floats for metrics.jsonl: <prefix>/total, <prefix>/<term>, loss_contrib/fraction_abs/<term>
        and objective/recon_weight_mean, recon_weight_max, beta_eff_median."""
        d = {f"{prefix}/total": self.total.item()}
        d.update({f"{prefix}/{k}": float(_reported(k, v)) for k, v in self.terms.items()})
        d.update({f"loss_contrib/fraction_abs/{k}": v for k, v in self.fractions_abs().items()})
        d["objective/recon_weight_mean"] = float(self.recon_weight.mean())
        d["objective/recon_weight_max"] = float(self.recon_weight.max())
        d["objective/beta_eff_median"] = float(self.beta_eff.median())
        return d


@dataclass
class KindTerms:
    """What one latent kind contributes before the shared reduction.

    ``lbar`` (batch,): expected reconstruction, nats per token; ``others``: name -> (raw batch mean,
    contribution to J or None when it is logged only), in logging order; ``recon_name``: the
    contribution name of w * lbar; ``w``: a replacement weight (hard EM's rescaling) or None."""

    lbar: torch.Tensor
    others: dict[str, tuple[torch.Tensor, torch.Tensor | None]]
    per_example: dict[str, torch.Tensor] = field(default_factory=dict)
    recon_name: str = "reconstruction_loss"
    w: torch.Tensor | None = None


def _discrete_terms(cfg: ObjectiveConfig, *, recon, w, beta, c_base, q_logits, p_logits, jsd=None) -> KindTerms:
    """recon (B, K) per value; q_logits None = the optimal posterior (``losses.optimal_posterior_logits``)."""
    if cfg.lambda_jsd > 0 and jsd is None:
        raise ValueError(f"lambda_jsd={cfg.lambda_jsd} > 0 but no jsd was given to assemble_objective")
    if q_logits is None:
        q_logits = optimal_posterior_logits(recon, p_logits, w, beta)
    q = torch.softmax(q_logits, -1)
    lbar = (q * recon).sum(-1)
    kl = categorical_kl(q_logits, p_logits)
    kl_pen = apply_free_bits(kl, cfg.free_bits, cfg.free_bits_mode)
    others = {"kl_prior_loss": (kl.mean(), beta * kl_pen.mean())}
    if jsd is not None:
        others["decoder_jsd"] = (jsd.mean(), -cfg.lambda_jsd * jsd.mean() if cfg.lambda_jsd > 0 else None)
    return KindTerms(lbar, others, {"kl": kl, "q_logits": q_logits})


def _gaussian_terms(cfg: ObjectiveConfig, *, recon, w, beta, c_base, mu_q, logvar_q, mu_p, logvar_p) -> KindTerms:
    """recon (B, S) per sample; mu_p = logvar_p = None: the N(0, I) prior."""
    if cfg.lambda_jsd > 0:
        raise ValueError(f"lambda_jsd={cfg.lambda_jsd} > 0 is defined for the discrete CVAE only")
    lbar = recon.mean(-1)
    kl_dims = gaussian_kl(mu_q, logvar_q, mu_p, logvar_p, per_dim=True)
    kl = kl_dims.sum(-1)
    kl_pen = penalized_kl_dims(kl_dims, cfg.free_bits, cfg.free_bits_mode)
    return KindTerms(lbar, {"kl_prior_loss": (kl.mean(), beta * kl_pen.mean())}, {"kl": kl})


def hard_em_recon_factor(recon_scale: str, c_base: float) -> float | None:
    """The batch mean of the hard phase's reconstruction weight (``AidConfig.hard_em_recon_scale``,
    whose comment gives the rule and its source): ``at_least_plain`` max(1, 1 / c_base), ``c_base``
    1 / c_base; None for ``weighting`` (w_i as the true objective has it). c_base in nats per token
    (> 0). Raises KeyError listing the choices for another ``recon_scale``."""
    if recon_scale not in HARD_EM_RECON_FACTORS:
        raise KeyError(f"recon_scale={recon_scale!r} is not one of {sorted(HARD_EM_RECON_FACTORS)}")
    return HARD_EM_RECON_FACTORS[recon_scale](c_base)


#: hard_em_recon_scale -> c_base -> the mean reconstruction weight of the hard phase (None: w unchanged)
HARD_EM_RECON_FACTORS: dict[str, Callable[[float], float | None]] = {
    "at_least_plain": lambda c_base: max(1.0, 1.0 / c_base), "c_base": lambda c_base: 1.0 / c_base,
    "weighting": lambda c_base: None}


def _hard_em_terms(cfg: ObjectiveConfig, *, recon, w, beta, c_base, q_logits, p_logits, k_star,
                   recon_scale: str = "at_least_plain", w_mean: float | None = None) -> KindTerms:
    """recon (B,): the decoded value's nll; q_logits None = the optimal posterior, one-hot on k*
    (its cross-entropy is 0); unless ``recon_scale='weighting'``, w is rescaled to mean
    ``hard_em_recon_factor(recon_scale, c_base)`` over the step's batch: ``w_mean`` is that batch's
    mean w where this call sees only a chunk of it (gradient accumulation,
    ``zfree.train.accumulate``), else w's own mean."""
    optimal = q_logits is None
    q_logp = (torch.log(torch.nn.functional.one_hot(k_star, p_logits.shape[-1]).to(recon.dtype).clamp_min(1e-12))
              if optimal else torch.log_softmax(q_logits, -1))
    factor = hard_em_recon_factor(recon_scale, c_base)
    if factor is not None:  # one scale for every weighting, its relative per-example weights kept
        w = w / (w.mean() if w_mean is None else w_mean) * factor
    ce_q = (torch.zeros_like(recon) if optimal else
            torch.nn.functional.cross_entropy(q_logits, k_star, reduction="none"))
    ce_p = -(q_logp.detach().exp() * torch.log_softmax(p_logits, -1)).sum(-1)
    return KindTerms(recon, {"posterior_ce": (ce_q.mean(), ce_q.mean()), "router_ce": (ce_p.mean(), ce_p.mean())},
                     {"q_logits": q_logp}, recon_name="hard_reconstruction", w=w)


def _given_terms(cfg: ObjectiveConfig, *, recon, w, beta, c_base, q_logits, p_logits) -> KindTerms:
    """recon (B,): the given value's nll; q_logits one-hot (``DiscreteCVAE.GIVEN_LOGIT``)."""
    kl = categorical_kl(q_logits, p_logits)  # exactly -log p(z | x) for a one-hot q
    return KindTerms(recon, {"kl_prior_loss": (kl.mean(), kl.mean())}, {"kl": kl, "q_logits": q_logits})


class Phase(StrEnum):
    """The training phase (``TrainState.phase``, recorded as its value): ``HARD`` is the hard-EM
    phase of the hard_em_then_soft aid, ``SOFT`` the true objective of the latent kind."""

    HARD = "hard"
    SOFT = "soft"


#: the terms of the hard-EM phase's objective (a key of ``KINDS`` beside the latent kinds)
HARD_EM = "hard_em"
#: the objective of a given z (``ModelConfig.latent_source`` control or label:<key>; a key of
#: ``KINDS`` and ``STEP_OBJECTIVES``)
GIVEN = "given"

#: latent kind / the hard-EM phase -> its term function
KINDS: dict[str, Callable[..., KindTerms]] = {LatentKind.DISCRETE: _discrete_terms,
                                              LatentKind.CONTINUOUS: _gaussian_terms, HARD_EM: _hard_em_terms,
                                              GIVEN: _given_terms}


def assemble(kind: str, cfg: ObjectiveConfig, *, recon: Float[torch.Tensor, "batch *n"],
             target_len: Int[torch.Tensor, "batch"], step: int = 0, c_base: float | None = None,
             b: Float[torch.Tensor, "batch"] | None = None, **inputs) -> ObjectiveBreakdown:
    """The one assembler of J (docs/concepts/weightings.md) for ``kind`` in ``KINDS``.

    ``recon``: the per-token reconstruction NLL (nats), (batch, K) per value (discrete), (batch, S)
    per sample (gaussian) or (batch,) of the decoded value (hard_em), token-weighted for ``token``.
    w_i = ``reconstruction_weight(outer_weighting(cfg))`` with ``b`` (batch,) the per-example base
    surprisal and ``c_base``; beta = ``beta_at_step(cfg, step)``; beta_eff = beta * |S| / w.
    ``inputs`` are the kind's own tensors (discrete: q_logits, p_logits, jsd; gaussian: mu_q,
    logvar_q, mu_p, logvar_p; hard_em: q_logits, p_logits, k_star, recon_scale).
    Raises KeyError listing the kinds for an unknown kind, ValueError as ``reconstruction_weight``
    does and for a lambda_jsd the kind cannot honour.
    """
    if kind not in KINDS:
        raise KeyError(f"objective kind {kind!r} is not one of {sorted(map(str, KINDS))}")
    w = reconstruction_weight(outer_weighting(cfg), batch_size=recon.shape[0], c_base=c_base, b=b,
                              epsilon=cfg.epsilon, dtype=recon.dtype, device=recon.device)
    beta = beta_at_step(cfg, step)
    t = KINDS[kind](cfg, recon=recon, w=w, beta=beta, c_base=c_base, **inputs)
    w = w if t.w is None else t.w
    contributions = {t.recon_name: (w * t.lbar).mean(), **{k: c for k, (_, c) in t.others.items() if c is not None}}
    terms = {"reconstruction_loss": t.lbar.mean(), **{k: raw for k, (raw, _) in t.others.items()}}
    total = sum(contributions.values())
    return ObjectiveBreakdown(total, terms, contributions, w.detach(), effective_beta(beta, target_len, w.detach()),
                              {"lbar": t.lbar, "weighted_recon": w * t.lbar, **t.per_example})


def assemble_objective(cfg: ObjectiveConfig, *, recon_per_latent: Float[torch.Tensor, "batch n_latent"],
                       q_logits: Float[torch.Tensor, "batch n_latent"] | None, p_logits: Float[torch.Tensor, "batch n_latent"],
                       target_len: Int[torch.Tensor, "batch"], step: int = 0, c_base: float | None = None,
                       b: Float[torch.Tensor, "batch"] | None = None, jsd: Float[torch.Tensor, "batch"] | None = None
                       ) -> ObjectiveBreakdown:
    """J = mean_i [ w_i * lbar_i + beta * K_i ] - lambda_jsd * mean_i JSD_i of the discrete CVAE
    (``assemble('discrete', ...)``, docs/concepts/weightings.md).

    lbar_i = sum_k q(k | x_i, y_i) * recon_per_latent[i, k] is the exact expectation over the K
    latent values; K_i is the categorical KL to the router after free bits. Shapes:
    recon_per_latent, q_logits, p_logits (batch, n_latent); target_len, b, jsd (batch,).
    ``q_logits=None``: the optimal posterior (``optimal_posterior_logits``, detached), returned in
    ``per_example["q_logits"]`` (the given logits otherwise). Raises ValueError for a missing or
    invalid c_base or b, and when ``cfg.lambda_jsd > 0`` but no ``jsd`` is given.
    """
    return assemble(LatentKind.DISCRETE, cfg, recon=recon_per_latent, target_len=target_len, step=step, c_base=c_base, b=b,
                    q_logits=q_logits, p_logits=p_logits, jsd=jsd)


# ---------------------------------------------------------------------------- one training step's J


def _forward(model, cfg: TrainConfig, call: Callable):
    """``call()`` (the model's forward) under ``cfg.optim.precision``'s autocast on the model's
    device, its floating outputs returned in float32 (``zfree.models.precision``): the objective
    is then assembled outside autocast, in float32."""
    with body_autocast(cfg.optim.precision, next(model.parameters()).device):
        out = call()
    return model_outputs_fp32(out)


def _warm_objective(cfg: ObjectiveConfig, warm: bool) -> ObjectiveConfig:
    """The beta0_warmup aid's objective: beta = 0, constant schedule (the prior is detached by the caller)."""
    return dataclasses.replace(cfg, beta=0.0, beta_schedule="constant") if warm else cfg


def soft_objective(model, batch: Batch, cfg: TrainConfig, step: int, c_base: float, b: torch.Tensor | None,
                   base_tok: torch.Tensor | None, warm: bool = False) -> ObjectiveBreakdown:
    """The true objective J of the discrete CVAE on one batch; ``warm``: the beta0_warmup aid
    (beta = 0, the router detached). ``b`` (batch,), ``base_tok`` (batch, seq): base surprisals."""
    obj = cfg.objective
    o = _forward(model, cfg, lambda: model(batch, with_distributions=obj.lambda_jsd > 0, zfree_metrics=False))
    recon = reconstruction_per_value(-o.target_logprobs, batch.target_mask, obj, base_tok)  # (B, K)
    jsd = None
    if obj.lambda_jsd > 0:
        jsd = inter_latent_jsd(o.next_token_logprobs, torch.softmax(o.prior_logits, -1), o.pos_mask)
    return assemble(LatentKind.DISCRETE, _warm_objective(obj, warm), recon=recon, target_len=batch.target_len, step=step,
                    c_base=c_base, b=b, q_logits=o.posterior_logits,  # None: the optimal posterior
                    p_logits=o.prior_logits.detach() if warm else o.prior_logits, jsd=jsd)


def continuous_objective(model, batch: Batch, cfg: TrainConfig, step: int, c_base: float, b: torch.Tensor | None,
                         base_tok: torch.Tensor | None, warm: bool = False) -> ObjectiveBreakdown:
    """J of the continuous CVAE on one batch: the per-sample reconstruction reduced like the K
    discrete values, the KL analytic; ``warm`` as in ``soft_objective`` (beta = 0, prior detached)."""
    obj = cfg.objective
    o = _forward(model, cfg, lambda: model(batch, zfree_metrics=False))
    recon = reconstruction_per_value(-o.target_logprobs, batch.target_mask, obj, base_tok)  # (B, S)
    learned = model.prior == "learned"
    mu_p = (o.prior_mean.detach() if warm else o.prior_mean) if learned else None
    logvar_p = (o.prior_logvar.detach() if warm else o.prior_logvar) if learned else None
    return assemble(LatentKind.CONTINUOUS, _warm_objective(obj, warm), recon=recon, target_len=batch.target_len, step=step,
                    c_base=c_base, b=b, mu_q=o.posterior_mean, logvar_q=o.posterior_logvar, mu_p=mu_p,
                    logvar_p=logvar_p)


def hard_em_objective(model, batch: Batch, cfg: TrainConfig, step: int, c_base: float, b: torch.Tensor | None,
                      base_tok: torch.Tensor | None = None, warm: bool = False,
                      w_mean: float | None = None) -> ObjectiveBreakdown:
    """Hard EM (mixture-of-experts translation, Shen et al. 2019, "hard-MoE"): the decoder reconstructs
    with one value per example, the best-reconstructing k* = argmin_k nll_k (``hard_em_decoder='best'``,
    winner-take-all; ties: the posterior's argmax) or the posterior's argmax; the posterior is trained
    by cross-entropy toward k*; the router by cross-entropy toward the (detached) posterior. Only the
    decoded value's pass is differentiated (``DiscreteCVAE.forward_selected``). The reconstruction
    weight is the weighting's w_i, rescaled to mean ``hard_em_recon_factor`` (max(1, 1/c_base) by
    default) over the batch when ``hard_em_recon_scale`` is not ``weighting`` (``w_mean``: the whole
    step's mean w when ``batch`` is one chunk of it under gradient accumulation, so the chunks sum to
    the full batch's J). With ``posterior_features='optimal'`` (no head) the posterior is one-hot on
    k* and its cross-entropy is 0. Under ``hard_em_router_features='detached'`` (the
    default) the router reads the separator state detached: its cross-entropy trains the router's head
    alone, never the body or LoRA. ``per_example["q_logits"]`` holds the posterior's
    log-probs (its argmax: the value counted by dead-value restarts); ``base_tok`` and ``warm`` are
    unused (the hard phase reconstructs with the plain per-token mean)."""
    detached = cfg.aid.hard_em_router_features == "detached"
    # only the decoded value's passes carry gradient
    sel = _forward(model, cfg, lambda: model.forward_selected(batch, cfg.aid.hard_em_decoder, cfg.aid.hard_em_estep_tokens,
                                                              router_detached=detached, zfree_metrics=False))
    rec = masked_mean_token_nll(-sel.selected_logprobs, batch.target_mask)  # (B,)
    return assemble(HARD_EM, cfg.objective, recon=rec, target_len=batch.target_len, step=step, c_base=c_base, b=b,
                    q_logits=sel.out.posterior_logits, p_logits=sel.out.prior_logits, k_star=sel.k_star,
                    recon_scale=cfg.aid.hard_em_recon_scale, w_mean=w_mean)


def given_objective(model, batch: Batch, cfg: TrainConfig, step: int, c_base: float, b: torch.Tensor | None,
                    base_tok: torch.Tensor | None = None, warm: bool = False) -> ObjectiveBreakdown:
    """J of a given z (the z-free control, a label oracle; ``KINDS['given']``): w_i * the given
    value's reconstruction (token-weighted under ``token``) + the router's cross-entropy toward it.
    Only the given value is decoded (``DiscreteCVAE.forward_given``); ``warm`` is unused."""
    sel = _forward(model, cfg, lambda: model.forward_given(batch, zfree_metrics=False))
    recon = reconstruction_per_value(-sel.selected_logprobs[:, None], batch.target_mask, cfg.objective, base_tok)[:, 0]
    return assemble(GIVEN, cfg.objective, recon=recon, target_len=batch.target_len, step=step, c_base=c_base, b=b,
                    q_logits=sel.posterior_logits, p_logits=sel.prior_logits)


#: training phase -> the objective of one step ("hard": the hard-EM phase of hard_em_then_soft;
#: otherwise the latent kind's true objective)
STEP_OBJECTIVES = {Phase.HARD: hard_em_objective, LatentKind.DISCRETE: soft_objective,
                   LatentKind.CONTINUOUS: continuous_objective, GIVEN: given_objective}


def step_objective(phase: str, model, batch: Batch, cfg: TrainConfig, step: int, c_base: float,
                   b: torch.Tensor | None, base_tok: torch.Tensor | None, warm: bool = False,
                   w_mean: float | None = None) -> ObjectiveBreakdown:
    """J of one training step in ``phase`` (a key of ``STEP_OBJECTIVES``); ``w_mean``: the whole
    step's mean reconstruction weight where ``batch`` is one chunk of it (read by the hard phase's
    rescaling only: the other objectives are means of per-example terms). Raises KeyError listing the phases."""
    if phase not in STEP_OBJECTIVES:
        raise KeyError(f"phase {phase!r} is not one of {sorted(map(str, STEP_OBJECTIVES))}")
    if phase == Phase.HARD:
        return hard_em_objective(model, batch, cfg, step, c_base, b, base_tok, warm, w_mean=w_mean)
    return STEP_OBJECTIVES[phase](model, batch, cfg, step, c_base, b, base_tok, warm)
