"""The symmetry-breaking aids (``AidConfig``; docs/concepts/aids.md): from a zero latent injection every
latent value gives the same loss, so the posterior gets gradient only from the KL. Each aid is a small
named function; the training loop reaches them through its plug-ins (``zfree.train.plugins``):

  hard-EM phase   ``count_usage``, ``restart_dead_values`` (dead-value restarts),
                  ``handover_gate`` / ``check_handover`` (hand over to the true objective);
  beta0 warm-up   ``beta0_warm``;
  frozen decoder  ``frozen_decoder_phase`` and ``FrozenDecoderMask`` (only the posterior side learns);
  aggressive      the lagging-encoder remedy (He et al. 2019): ``aggressive_phase``, the inner loop's
                  stopping rule ``aggressive_inner_steps`` and the
                  phase's end ``check_aggressive_end`` (``posterior_mutual_information`` on the gate rows).

Functions that take a ``state`` mutate its ``phase``, ``handover_step``, ``handover_forced``,
``gate``, ``restarts``, ``usage`` and ``aggressive_*`` fields (``zfree_lab.run.run_setup.TrainState``).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

from zfree.config import LatentKind, TrainConfig
from zfree.data.batching import EncodedPair, collate
from zfree.evaluate.latent_stats import categorical_mutual_information, gaussian_mutual_information
from zfree.models.nll import masked_mean_token_nll
from zfree.objective.losses import outer_weighting, reconstruction_weight
from zfree.objective.objectives import Phase

#: top-level parameter names of the posterior q(z | x, y) (both CVAEs; ``posterior_bn``: BN-VAE's
#: shift): what the frozen-decoder warm phase and the aggressive encoder's inner steps train
POSTERIOR_SIDE = ("posterior_head", "posterior_bn", "pool_query", "encoder")


# ---------------------------------------------------------------------------- warm phases


def beta0_warm(cfg: TrainConfig, step: int) -> bool:
    """True while the beta0_warmup aid holds (beta = 0, the prior detached): through ``warmup_aid_steps``."""
    return cfg.aid.aid == "beta0_warmup" and step <= cfg.aid.warmup_aid_steps


def frozen_decoder_phase(cfg: TrainConfig, step: int) -> bool:
    """True during the frozen-decoder warm phase (the first ``frozen_decoder_steps`` steps)."""
    return step <= cfg.optim.frozen_decoder_steps


class FrozenDecoderMask:
    """Drops the gradient of every parameter outside ``POSTERIOR_SIDE`` (backbone, router, latent
    embeddings), so AdamW skips them: no moments, no decay, the values stay as they are
    (``drop("posterior")``); or, the other way round, of the posterior side (``drop("decoder")``)."""

    def __init__(self, model: nn.Module):
        named = list(model.named_parameters())
        #: the trained side -> the parameters whose gradient it drops
        self.dropped = {"posterior": [p for n, p in named if n.split(".")[0] not in POSTERIOR_SIDE],
                        "decoder": [p for n, p in named if n.split(".")[0] in POSTERIOR_SIDE], "all": []}

    def drop(self, side: str) -> None:
        """The mask of ``zfree.train.plugins.trained_side``'s answer: ``"posterior"`` (only the posterior
        side keeps its gradient), ``"decoder"`` (every parameter but the posterior side's keeps it: the
        aggressive phase's outer step) or ``"all"`` (nothing dropped). Call between ``backward`` and
        ``optimizer.step``. KeyError listing them for another."""
        for p in self.dropped[side]:
            p.grad = None


# ---------------------------------------------------------------------------- the aggressive encoder


def aggressive_phase(cfg: TrainConfig, state) -> bool:
    """True while the aggressive_encoder aid's aggressive phase lasts (He et al. 2019, "Lagging
    Inference Networks and Posterior Collapse in VAEs", Alg. 1): until ``check_aggressive_end`` ends it."""
    return cfg.aid.aid == "aggressive_encoder" and state.aggressive_end_step is None


def aggressive_inner_steps(cfg: TrainConfig, update: Callable[[int], torch.Tensor]) -> int:
    """The aggressive phase's inner loop before one joint step (He et al. 2019, Alg. 1, as in their
    ``text.py``): ``update(i)`` runs posterior-only step i = 1, 2, ... and returns its loss (a 0-dim
    tensor); every ``aggressive_inner_check`` steps (their 15) the summed loss of that window is
    compared with the previous window's (the first window's with +inf) and the loop stops once it is
    higher (their ``burn_pre_loss - burn_cur_loss < 0``), else after ``aggressive_max_inner`` steps
    (their ``while sub_iter < 100`` runs at most 99). Their window sums per-word losses; ours sums the
    step objectives (batch means of per-example J, equal batch sizes): the same comparison up to the
    token counts. One host read per window. Returns the number of inner steps run (>= 1)."""
    check, previous, window = cfg.aid.aggressive_inner_check, math.inf, None
    for i in range(1, cfg.aid.aggressive_max_inner + 1):
        loss = update(i).detach()
        window = loss if window is None else window + loss
        if i % check == 0:
            current = float(window)
            if current > previous:
                return i
            previous, window = current, None
    return cfg.aid.aggressive_max_inner


@torch.no_grad()
def posterior_mutual_information(model, encoded: Sequence[EncodedPair], pad_id: int, seed: int = 0) -> float:
    """I(x,y; z) of the amortized posterior on ``encoded`` rows in evaluation mode (BN-VAE: running
    statistics), from the z-free pass and the heads alone (``model.encode``; nothing is decoded), with the
    evaluation's estimators: discrete ``categorical_mutual_information`` (exact), Gaussian
    ``gaussian_mutual_information`` (Monte Carlo with ``seed``, the estimator of He et al. 2019's
    ``calc_mi``, here over all the rows at once, theirs per batch). Nats."""
    was = model.training
    model.eval()
    dev = next(model.parameters()).device
    parts = []
    for i in range(0, len(encoded), 128):
        enc = model.encode(collate(encoded[i : i + 128], pad_id=pad_id).to(dev))
        if model.latent_kind == LatentKind.DISCRETE:
            parts.append(torch.softmax(enc.posterior_logits.double(), -1).cpu())
        else:
            parts.append(torch.cat([enc.mu_q, enc.logvar_q], -1).double().cpu())
    model.train(was)
    x = torch.cat(parts).numpy()
    if model.latent_kind == LatentKind.DISCRETE:
        return categorical_mutual_information(x)
    mu, logvar = np.split(x, 2, axis=1)
    return gaussian_mutual_information(mu, logvar, seed=seed)


def check_aggressive_end(model, cfg: TrainConfig, state, step: int, gate_rows: Sequence[EncodedPair], pad_id: int
                         ) -> None:
    """In the aggressive phase, every ``aggressive_mi_every`` steps: the mutual information on the gate
    rows (``posterior_mutual_information``), recorded in ``state.aggressive_mi`` with the inner steps so
    far; the phase ends at ``step`` (``state.aggressive_end_step``) when it fell below the previous
    check's (the first check's against 0), He et al. 2019's ``if cur_mi - pre_mi < 0:
    aggressive_flag = False`` (they check once per epoch, on validation data)."""
    if not (aggressive_phase(cfg, state) and step % cfg.aid.aggressive_mi_every == 0):
        return
    mi = posterior_mutual_information(model, gate_rows, pad_id, seed=cfg.optim.seed)
    previous = state.aggressive_mi[-1]["mutual_information"] if state.aggressive_mi else 0.0
    state.aggressive_mi.append({"step": step, "mutual_information": mi, "inner_steps": state.aggressive_inner_steps})
    if mi - previous < 0:
        state.aggressive_end_step = step


# ---------------------------------------------------------------------------- the hard-EM phase


def new_lr(cfg: TrainConfig, phase: Phase) -> float:
    """The rate of the heads and latent embeddings (the ``new`` group): ``hard_em_lr_new`` in the
    hard phase when it is set (> 0), else ``lr_new``."""
    return cfg.aid.hard_em_lr_new if phase == Phase.HARD and cfg.aid.hard_em_lr_new > 0 else cfg.optim.lr_new


def count_usage(state, z_hat: torch.Tensor, n_latent: int) -> None:
    """Add the posterior argmax counts of one batch, ``z_hat`` (batch,), to ``state.usage`` (K,):
    a tensor on z_hat's device (no host copy per step; ``restart_dead_values`` and the training
    loop's checkpoints read it), or a list of ints as restored from a checkpoint."""
    z = z_hat.detach().long()  # scatter_add, not bincount: CUDA's bincount reads max(z) back to size its output
    counts = torch.zeros(n_latent, dtype=torch.long, device=z.device).scatter_add_(0, z, torch.ones_like(z))
    if isinstance(state.usage, torch.Tensor):
        state.usage = state.usage + counts
    elif state.usage:  # a list (restored from a checkpoint)
        state.usage = torch.as_tensor(state.usage, dtype=counts.dtype, device=counts.device) + counts
    else:
        state.usage = counts


def restart_dead_values(model, cfg: TrainConfig, state, step: int) -> None:
    """Every ``restart_dead_every`` steps: values whose share of the argmax counts since the last
    check is below ``restart_dead_share / K`` become perturbed copies of the most used one
    (``DiscreteCVAE.restart_values``); recorded in ``state.restarts``; the counts restart."""
    if not (cfg.aid.restart_dead_every and step % cfg.aid.restart_dead_every == 0 and len(state.usage)):
        return
    K = model.n_latent
    usage = state.usage.cpu().tolist() if isinstance(state.usage, torch.Tensor) else list(state.usage)
    share = np.asarray(usage, float) / max(1, sum(usage))
    dead = [k for k in range(K) if share[k] < cfg.aid.restart_dead_share / K]
    if dead:
        donor = int(share.argmax())
        model.restart_values(dead, donor)
        state.restarts.append({"step": step, "dead": dead, "donor": donor})
    state.usage = []


@torch.no_grad()
def handover_gate(model, encoded: Sequence[EncodedPair], b: np.ndarray, cfg: TrainConfig, c_base: float,
                  pad_id: int) -> dict:
    """Hand-over diagnostic: is the best-z state already better than collapse under the *true*
    objective? best = mean_i(w_i * min_k nll_k(i)) + beta * KL, collapsed = mean_i(w_i * b_i),
    with KL = log K (a confident posterior against a uniform router; ``handover_kl='log_k'``) or
    the router's current cost mean_i -log p(k*_i | x_i) (``'router'``). ``b`` (rows,): base
    surprisal, nats per token. For distribution weighting and log K this is
    oracle_rho + beta * log K < 1 (seed note 000, the switch-on test). With
    ``handover_reference='single_value'`` collapsed is instead the current decoder's best single value
    for every row, min_k mean_i(w_i * nll_k(i)) (a collapsed posterior pays no rate), so what passes
    is what the values add, not what fine-tuning the decoder added. Returns oracle_rho, best_objective,
    collapsed_objective, kl_estimate, pass and (``single_value`` only) single_value_objective
    (best < (1 - handover_margin) * collapsed); objectives in nats per token times w."""
    was = model.training
    model.eval()
    dev = next(model.parameters()).device
    per_value, router_cost = [], []
    for i in range(0, len(encoded), 128):
        batch = collate(encoded[i : i + 128], pad_id=pad_id).to(dev)
        o = model(batch)
        nll = masked_mean_token_nll(-o.target_logprobs, batch.target_mask)  # (rows, K)
        best = nll.min(-1)
        per_value.append(nll)
        router_cost.append(-torch.log_softmax(o.prior_logits, -1).gather(1, best.indices[:, None]).squeeze(1))
    model.train(was)
    nll_k = torch.cat(per_value).double().cpu()
    oracle_nll = nll_k.min(-1).values
    kl = math.log(model.n_latent) if cfg.aid.handover_kl == "log_k" else float(torch.cat(router_cost).mean())
    bb = torch.as_tensor(b, dtype=torch.float64)
    w = reconstruction_weight(outer_weighting(cfg.objective), batch_size=len(bb), c_base=c_base, b=bb,
                              epsilon=cfg.objective.epsilon, dtype=torch.float64)
    best = float((w * oracle_nll).mean()) + cfg.objective.beta * kl
    single = float(((w.reshape(-1, 1) if w.dim() == 1 else w) * nll_k).mean(0).min())
    collapsed = single if cfg.aid.handover_reference == "single_value" else float((w * bb).mean())
    out = {"oracle_rho": float(oracle_nll.mean()) / c_base, "best_objective": best, "collapsed_objective": collapsed,
           "kl_estimate": kl, "pass": best < (1.0 - cfg.aid.handover_margin) * collapsed}
    # the base gate's record keeps its keys (runs written before the option replay unchanged)
    return {**out, "single_value_objective": single} if cfg.aid.handover_reference == "single_value" else out


def check_handover(model, cfg: TrainConfig, state, step: int, gate_rows: Sequence[EncodedPair], gate_b: np.ndarray,
                   c_base: float, pad_id: int) -> None:
    """Every ``handover_check_every`` steps (and at ``hard_em_max_steps``): run the gate, record it
    in ``state.gate`` and hand over to the soft phase when it passes or the budget is spent (forced)."""
    if not (step % cfg.aid.handover_check_every == 0 or step >= cfg.aid.hard_em_max_steps):
        return
    g = handover_gate(model, gate_rows, gate_b, cfg, c_base, pad_id)
    state.gate.append({"step": step, **g})
    if g["pass"] or step >= cfg.aid.hard_em_max_steps:
        state.phase, state.handover_step, state.handover_forced = Phase.SOFT, step, not g["pass"]

