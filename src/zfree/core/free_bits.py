"""The free-bits modes, one registry (docs/concepts/weightings.md, "Free bits"): each entry names the
KL it penalizes instead of K (per example, and per latent dimension where the Gaussian has one), the
formula's source and the latent kinds it applies to. Config validation (``zfree.config``: the
``free_bits_mode`` choices and the latent kind a mode needs), the objective
(``zfree.objective.objectives`` through ``zfree.objective.losses.apply_free_bits``), the docs' table and
the tests read this table; adding a mode is one ``FreeBitsMode`` entry (and its test).

In the core layer (``tests/test_layers.py``) so the config reads it; torch is imported only when a
penalty is computed (``zfree --help`` and config validation stay light). Shapes: kl (batch,) nats per
example; kl_dims (batch, d_latent) nats per example and dimension.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import torch


def _batch_mean(kl, free_bits):
    """max(mean K, lambda), returned per example rescaled so that its mean is that value (gradient 0
    while the mean is below lambda; Kingma et al. 2016, one group over the batch)."""
    import torch

    m = kl.mean()
    if m > 0:
        return kl * (torch.clamp_min(m, free_bits) / m)
    return kl * 0 + free_bits  # all K = 0: constant lambda, no gradient (not kl + lambda, whose gradient is 1/B)


def kl_threshold(kl: "torch.Tensor", threshold: float) -> "torch.Tensor":
    """Optimus's KL thresholding (Li et al. 2020, ``fb_mode=1`` with ``dim_target_kl``; Li et al. 2019's
    ``fb=2``): sum_d 1[K_id > threshold] * K_id, nats per example (batch,). Their code
    (``code/examples/big_ae/modules/vae.py``): ``loss_kl = 0.5 * (mu^2 + e^logvar - logvar - 1)``
    (batch, d), ``kl_mask = (loss_kl > dim_target_kl).float()``, ``loss_kl = (kl_mask * loss_kl).sum(dim=1)``:
    the mask is elementwise, one per example and dimension (not on a batch mean), and carries no
    gradient, so a masked entry gets gradient 0 (the gradient of their paper's hinge
    max(lambda, K_id), whose value differs from this one by the constant lambda). ``kl``: (batch, d_latent)
    per dimension (Gaussian), or (batch,) one group (categorical: K_i counts only above ``threshold``).
    A mean of per-example terms: exact under gradient accumulation."""
    per_dim = kl if kl.dim() == 2 else kl[:, None]
    mask = (per_dim.detach() > threshold).to(per_dim.dtype)
    return (per_dim * mask).sum(-1)


def free_bits_per_dim(kl_dims: "torch.Tensor", free_bits: float) -> "torch.Tensor":
    """Free bits per latent dimension (Kingma et al. 2016, eq. 15, one group per dimension):
    sum_d max(lambda, mean_batch KL_d), returned per example (batch,) in nats so that its batch mean
    is that value: dimension d contributes KL_{i,d} * max(m_d, lambda) / m_d, whose gradient is 0
    while the batch-mean KL m_d of that dimension is below lambda (``free_bits``, nats per dimension).
    ``free_bits`` <= 0: the plain sum over dimensions."""
    import torch

    if free_bits <= 0:
        return kl_dims.sum(-1)
    m = kl_dims.mean(0, keepdim=True)  # (1, d_latent)
    scaled = torch.where(m > 0, kl_dims * (torch.clamp_min(m, free_bits) / m.clamp_min(1e-12)),  # 1e-12: finite grads
                         kl_dims * 0 + free_bits)
    return scaled.sum(-1)


@dataclass(frozen=True)
class FreeBitsMode:
    """One free-bits mode. ``per_example(kl, free_bits)``: the penalized KL (batch,) from the KL per
    example, or None where the mode needs the dimensions; ``per_dim(kl_dims, free_bits)``: the
    penalized KL (batch,) from the Gaussian's KL per dimension, or None to use ``per_example`` on
    their sum; ``kinds``: the latent kinds (``ModelConfig.latent_kind``) it applies to; ``source`` and
    ``formula``: the paper and the formula the docs show."""

    name: str
    per_example: Callable | None
    source: str
    formula: str
    per_dim: Callable | None = None
    kinds: tuple[str, ...] = ("discrete", "continuous")


#: the registry, in the order the config's choices and the docs list them
FREE_BITS_MODES: dict[str, FreeBitsMode] = {m.name: m for m in (
    FreeBitsMode("none", lambda kl, free_bits: kl, "the standard ELBO", "K"),
    FreeBitsMode("per_example", lambda kl, free_bits: kl.clamp_min(free_bits), "Kingma et al. 2016 (IAF), free bits",
                 "max(K_i, λ) per example"),
    FreeBitsMode("batch_mean", _batch_mean, "Kingma et al. 2016 (IAF), eq. 15, one group",
                 "max(mean_batch K, λ), rescaled per example"),
    FreeBitsMode("per_dim", None, "Kingma et al. 2016 (IAF), eq. 15, one group per dimension",
                 "Σ_d max(λ, mean_batch K_d)", per_dim=free_bits_per_dim, kinds=("continuous",)),
    FreeBitsMode("threshold", kl_threshold, "Optimus (Li et al. 2020), dim_target_kl",
                 "Σ_d 1[K_id > λ] K_id (the whole K on the categorical)", per_dim=kl_threshold),
)}

#: every mode's name, in registry order (``zfree.config.FreeBitsMode``)
FREE_BITS_NAMES: tuple[str, ...] = tuple(FREE_BITS_MODES)
