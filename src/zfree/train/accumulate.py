"""Gradient accumulation: a step's batch of B rows run as chunks of ``micro_batch`` rows,
each chunk's objective scaled by its share n_c / B before its backward pass, so the accumulated
gradient is that of the whole batch's J = mean_i J_i (the objective is a batch mean of
per-example terms) while the peak memory is that of one chunk. Used by a study whose grid would not
fit in memory (``zfree_lab.experiment.estimate``), recorded in each run's config.json as ``micro_batch``.

Exact only where J is a mean of per-example terms: ``accumulation_problem`` names the settings that
are not (batch-mean free bits, BN-VAE's batch statistics, the hard phase's batch-normalised example
weights), and those refuse
``micro_batch``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from zfree.core.errors import ConfigError


def accumulation_problem(cfg) -> str | None:
    """Why chunked gradients would change the objective of ``cfg`` (a ``TrainConfig``), or None
    when J is a mean of per-example terms: free bits on the batch-mean KL (``batch_mean``,
    ``per_dim``) and BN-VAE's batch-normalized posterior means are not (Optimus's ``threshold``
    masks each example's KL: it is). The hard phase's w_i / mean_batch(w) is: w depends on b alone,
    so each chunk is given the whole batch's mean (``batch_weight_mean``)."""
    if cfg.objective.free_bits_mode in ("batch_mean", "per_dim"):
        return f"free_bits_mode={cfg.objective.free_bits_mode!r} clamps a batch mean"
    if cfg.model.bn_gamma > 0:
        return f"bn_gamma={cfg.model.bn_gamma:g} (BN-VAE) normalizes the posterior means by the batch's statistics"
    return None


def batch_weight_mean(cfg, c_base: float, b: torch.Tensor | None, n_rows: int) -> float:
    """mean_i w_i over a whole step's ``n_rows`` rows (``zfree.objective.losses.reconstruction_weight``
    of the outer weighting, seed 002's 1/(b + eps) for example; b (n_rows,) nats/token or None), the
    normaliser the hard phase's rescaling (``hard_em_recon_scale`` other than ``weighting``) divides by,
    computed once so that every chunk of the step uses the same one. Raises ValueError as ``reconstruction_weight``."""
    from zfree.objective.losses import outer_weighting, reconstruction_weight

    w = reconstruction_weight(outer_weighting(cfg.objective), batch_size=n_rows, c_base=c_base, b=b,
                              epsilon=cfg.objective.epsilon, dtype=torch.float64)
    return float(w.mean())


def check_accumulation(cfg) -> None:
    """ConfigError naming ``micro_batch`` when it is set on a config whose objective it would change."""
    if cfg.optim.micro_batch and cfg.optim.micro_batch < cfg.optim.batch_size:
        why = accumulation_problem(cfg)
        if why:
            raise ConfigError(f"micro_batch={cfg.optim.micro_batch}: {why}, so chunked gradients would change "
                              "the objective; use micro_batch=0 or a smaller batch_size")


@dataclass
class AccumulatedBreakdown:
    """The breakdown of an accumulated step, shaped like ``ObjectiveBreakdown`` for the loop
    (terms and contributions: the share-weighted sums of the chunks' batch means, detached;
    per-example tensors concatenated); its backward passes are done (``backward_done``)."""
    total: torch.Tensor
    terms: dict[str, torch.Tensor]
    contributions: dict[str, torch.Tensor]
    recon_weight: torch.Tensor
    beta_eff: torch.Tensor
    per_example: dict[str, torch.Tensor] = field(default_factory=dict)
    backward_done: bool = True

    def log_tensors(self, prefix: str = "loss/train") -> dict[str, torch.Tensor]:
        """As ``ObjectiveBreakdown.log_tensors``."""
        from zfree.objective.objectives import ObjectiveBreakdown  # the one definition of the keys

        return ObjectiveBreakdown.log_tensors(self, prefix)  # type: ignore[arg-type]


def _weighted_sum(parts: list[tuple[float, dict[str, torch.Tensor]]]) -> dict[str, torch.Tensor]:
    keys = parts[0][1].keys()
    return {k: sum(share * d[k].detach() for share, d in parts) for k in keys}


def accumulated_step(objective: Callable, rows: list, micro_batch: int, opt: torch.optim.Optimizer,
                     collate: Callable) -> AccumulatedBreakdown:
    """Zero the gradients, then for each chunk of ``micro_batch`` of the step's encoded ``rows`` (in
    order): ``br = objective(collate(chunk))`` and ``(n_c / B * br.total).backward()``. Returns the
    combined breakdown (``AccumulatedBreakdown``; per-example tensors in row order). Each chunk is
    padded to its own longest row (padding changes nothing, ``tests/test_batching.py``)."""
    n = len(rows)
    opt.zero_grad(set_to_none=True)
    parts, per_ex, totals = [], [], []
    for start in range(0, n, micro_batch):
        chunk = collate(rows[start:start + micro_batch])
        share = len(chunk.ids) / n
        br = objective(chunk)
        (share * br.total).backward()
        totals.append(share * br.total.detach())
        parts.append((share, {**{f"t:{k}": v for k, v in br.terms.items()},
                              **{f"c:{k}": v for k, v in br.contributions.items()}}))
        per_ex.append((br.recon_weight.detach(), br.beta_eff.detach(), {k: v.detach() for k, v in br.per_example.items()}))
    summed = _weighted_sum(parts)
    return AccumulatedBreakdown(
        total=sum(totals), terms={k[2:]: v for k, v in summed.items() if k.startswith("t:")},
        contributions={k[2:]: v for k, v in summed.items() if k.startswith("c:")},
        recon_weight=torch.cat([w for w, _, _ in per_ex]), beta_eff=torch.cat([b for _, b, _ in per_ex]),
        per_example={k: torch.cat([d[k] for _, _, d in per_ex]) for k in per_ex[0][2]})


def use_accumulation(cfg, n_rows: int) -> bool:
    """True when a step of ``n_rows`` rows runs in chunks (``micro_batch`` set and smaller)."""
    return bool(cfg.optim.micro_batch) and cfg.optim.micro_batch < n_rows
