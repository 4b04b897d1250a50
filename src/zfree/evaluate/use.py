"""When a latent counts as used, and a portable argmax (``zfree_lab.run.metrics`` reads both)."""

from __future__ import annotations

import numpy as np
import torch

CODE_USED_FRACTION = 0.01  # a latent value counts as used if it is the posterior argmax of >= 1% of rows

#: values within this of the maximum are tied and the lowest index wins (``tied_argmax``): in
#: probability for the posterior, in nats per token for the oracle's value (docs/howto/reproducibility.md)
ARGMAX_TIE = 1e-6


def tied_argmax(values: torch.Tensor, tie: float = ARGMAX_TIE) -> torch.Tensor:
    """Argmax over the last axis, the lowest index among the values within ``tie`` of the maximum (the
    same on every machine). ``values`` (..., K) -> (...) int64."""
    near = values >= values.max(-1, keepdim=True).values - tie
    return near.to(torch.int8).argmax(-1)  # argmax of a 0/1 mask: its first 1


def measured_use(kl: np.ndarray, bayes: np.ndarray, fallback: float, codes_used: int | None = None) -> np.ndarray:
    """Per row: z is used when its KL (nats) reaches half the Bayes rate log(K/m) (``fallback`` where
    unknown), exceeds 1e-3 nats, and the posterior's argmax takes at least two values over the rows
    (``codes_used`` >= 2; None: not checked). (rows,) -> bool (rows,) (docs/concepts/metrics.md)."""
    used = (kl >= 0.5 * np.where(np.isfinite(bayes), bayes, fallback)) & (kl > 1e-3)
    return used & (codes_used is None or codes_used >= 2)
