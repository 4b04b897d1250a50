"""The reconstruction weightings, one registry (docs/concepts/weightings.md): each entry names its
weight w(x, y), the source of its formula, the fields a study grid sets with it, and how figures draw
it. Config validation (``zfree.config``), the loss (``zfree.objective.losses.reconstruction_weight``),
the boundary theory, the study grids and presets, the launch panel, the figures and the budget's cuts all
read this table; adding a weighting is one ``Weighting`` entry (and its test).

The weight of a row, shape (batch,), a constant (no gradient), per entry:

- plain: w = 1 (the standard ELBO's reconstruction term);
- distribution: w = 1 / c_base, c_base the z-free reference's mean NLL in nats per token (seed 000:
  one global constant that puts reconstruction on the scale of the base's loss);
- example: w = 1 / (b + eps), b the row's z-free surprisal in nats per token (seed 002);
- token: reweights *inside* the per-row mean, omega_t = the base-surprisal share of token t mixed
  with uniform by token_alpha (seed 002, token level); its outer weight is ``token_outer``'s.

c_base, b and b_t are the run's z-free reference's; a run with ``injection: prefix`` reads them through the
route's initial soft token (the base model on [bos] x, s_0, sep, y: ``zfree.reference.prefix``).

In the core layer (``tests/test_layers.py``), so every layer may read it; torch is imported only when a
weight is computed, so reading the table (config validation, ``zfree --help``) stays light.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # torch is imported by the weight functions themselves: config and the CLI stay light
    import torch


def _check_c_base(c_base: float | None) -> float:
    if c_base is None or not math.isfinite(c_base) or c_base <= 0:
        raise ValueError(f"c_base={c_base!r} must be a finite positive number for distribution weighting")
    return float(c_base)


def plain_weight(batch_size: int, c_base, b, epsilon, dtype, device) -> torch.Tensor:
    """w = 1, shape (batch_size,)."""
    import torch

    return torch.ones(batch_size, dtype=dtype, device=device)


def distribution_weight(batch_size: int, c_base, b, epsilon, dtype, device) -> torch.Tensor:
    """w = 1 / c_base, shape (batch_size,) (seed 000). ValueError for a missing or non-positive c_base."""
    import torch

    return torch.full((batch_size,), 1.0 / _check_c_base(c_base), dtype=dtype, device=device)


def example_weight(batch_size: int, c_base, b, epsilon, dtype, device) -> torch.Tensor:
    """w = 1 / (b + epsilon), shape (batch_size,), b detached and clamped at 0 (seed 002).
    ValueError for a missing b, one of another length, or epsilon <= 0."""
    if b is None:
        raise ValueError("example weighting needs the per-example base surprisal b")
    if b.shape != (batch_size,):
        raise ValueError(f"b has shape {tuple(b.shape)}, expected ({batch_size},)")
    if not epsilon > 0:
        raise ValueError(f"epsilon={epsilon!r} must be > 0 for example weighting (w = 1 / (b + epsilon))")
    return (1.0 / (b.detach().clamp_min(0) + epsilon)).to(device=device, dtype=dtype)


@dataclass(frozen=True)
class Weighting:
    """One reconstruction weighting.

    ``weight``: w(batch_size, c_base, b, epsilon, dtype, device) -> (batch_size,), or None for a
    weighting that acts inside the per-row mean and takes its outer w from ``token_outer`` (token);
    ``source``: the formula's source; ``grid``: the fields a study grid sets with it besides
    ``weighting`` (their values the presets use); ``color`` and ``fill``: matplotlib colour and marker
    fill in every figure; ``kept_by_budget``: whether ``--budget``'s "weightings" cut keeps it;
    ``needs_b``: the per-example (or per-token) base surprisal b on training rows; ``needs_c_base``:
    w uses c_base; ``needs_epsilon``: epsilon must be > 0 (as the weighting or token's outer one)."""

    name: str
    weight: Callable[..., "torch.Tensor"] | None
    source: str
    grid: dict[str, Any] = field(default_factory=dict)
    color: str = "tab:gray"
    fill: str = "full"
    kept_by_budget: bool = False
    needs_b: bool = False
    needs_c_base: bool = False
    needs_epsilon: bool = False

    @property
    def grid_fields(self) -> dict[str, Any]:
        """The flat config fields a study grid point of this weighting sets (``weighting`` first)."""
        return {"weighting": self.name, **self.grid}


#: the registry, in the order every table, grid and legend lists them
WEIGHTINGS: dict[str, Weighting] = {w.name: w for w in (
    Weighting("plain", plain_weight, "the standard ELBO (Kingma & Welling 2014)", color="tab:blue", fill="full"),
    Weighting("distribution", distribution_weight, "seed 000: R / c_base", color="tab:orange", fill="none",
              kept_by_budget=True, needs_c_base=True),
    Weighting("example", example_weight, "seed 002: per example 1 / (b + eps)", grid={"epsilon": 0.05},
              color="tab:green", fill="left", kept_by_budget=True, needs_b=True, needs_epsilon=True),
    Weighting("token", None, "seed 002: per token, the base-surprisal share (inner); outer w from token_outer",
              grid={"token_outer": "distribution", "token_alpha": 0.5}, color="tab:purple", fill="bottom", needs_b=True),
)}

#: every weighting's name, in registry order
WEIGHTING_NAMES: tuple[str, ...] = tuple(WEIGHTINGS)
#: the weightings that set w(x, y) themselves (``reconstruction_weight``; token's outer choices)
OUTER_WEIGHTINGS: tuple[str, ...] = tuple(n for n, w in WEIGHTINGS.items() if w.weight is not None)
#: token's outer weighting: "none" is the spelling of plain there
TOKEN_OUTER_NAMES: tuple[str, ...] = ("none",) + tuple(n for n in OUTER_WEIGHTINGS if n != "plain")


def weight_function(name: str) -> Callable[..., torch.Tensor]:
    """The w(x, y) function of outer weighting ``name`` ("none" is plain). ValueError listing the
    valid names otherwise."""
    key = "plain" if name == "none" else name
    if key not in OUTER_WEIGHTINGS:
        raise ValueError(f"weighting={name!r} is not one of {list(OUTER_WEIGHTINGS)}")
    return WEIGHTINGS[key].weight
