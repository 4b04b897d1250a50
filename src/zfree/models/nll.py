"""The masked mean token NLL over the supervised y-region: the one reduction from per-token to
per-example NLL (models, objective terms, evaluation, base-model training)."""

from __future__ import annotations

import torch
from jaxtyping import Bool, Float


#: device types where ``masked_mean_token_nll`` checks for empty rows on the host (a ValueError naming
#: them: a CPU tensor's read is no round-trip); on the others a device-side assertion, no host read
HOST_CHECK_DEVICES = ("cpu",)


def masked_mean_token_nll(token_nll: Float[torch.Tensor, "batch *latent seq"],
                          target_mask: Bool[torch.Tensor, "batch seq"]) -> Float[torch.Tensor, "batch *latent"]:
    """nll(x, y) = (1/|S|) sum_{t in S} -log p(y_t | x, y_<t): masked mean, nats per token.

    ``token_nll`` is (batch, seq) or (batch, n_latent, seq); the mask (True = supervised position
    in S) is broadcast over the latent axis. Positions outside S may hold anything, even inf or
    NaN (they are selected away, not multiplied by 0, so they reach neither value nor gradient).
    Returns (batch,) or (batch, n_latent). Raises ValueError naming the rows with an empty S on a
    device of ``HOST_CHECK_DEVICES``; elsewhere a device-side assertion (no host read).
    Source: docs/concepts/problem.md, "The objective" (masked to the y-span, averaged not summed).
    """
    n = target_mask.sum(-1)
    if n.device.type not in HOST_CHECK_DEVICES:
        torch._assert_async((n > 0).all(), "a row has an empty supervised region")
    elif (n == 0).any():
        raise ValueError(f"rows {torch.nonzero(n == 0).flatten().tolist()} have an empty supervised region")
    m = target_mask if token_nll.dim() == 2 else target_mask[:, None, :]
    s = torch.where(m, token_nll, torch.zeros((), dtype=token_nll.dtype, device=token_nll.device)).sum(-1)
    return s / (n if token_nll.dim() == 2 else n[:, None]).to(s.dtype)
