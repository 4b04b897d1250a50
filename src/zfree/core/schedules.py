"""The β schedules, one registry (docs/concepts/weightings.md, "Schedules"): each entry names β at a
step counted after the AE phase, the formula's source, the fields it reads and the check those fields
must pass. Config validation (``zfree.config.ObjectiveConfig``: the ``beta_schedule`` choices and their
field checks), the objective (``zfree.objective.losses.beta_at_step``), the docs' table and the tests
read this table; adding a schedule is one ``Schedule`` entry (and its test).

- constant: β at every step;
- linear: β · min(1, t / beta_warmup_steps) (a linear KL warm-up; Bowman et al. 2016 anneal from 0);
- cyclical: β · ``cyclical_fraction`` (Fu et al. 2019, NAACL; Optimus, Li et al. 2020).

In the core layer (``tests/test_layers.py``) so the config reads it; no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable


def cyclical_fraction(step: int, period: int, ratio_zero: float = 0.0, ratio_increase: float = 0.5) -> float:
    """beta / beta_max of the cyclical schedule at ``step`` (>= 0; 0 is the evaluation before the first
    update): with s = step mod period, 0 while s < period * ratio_zero, then (s - i0) / (period *
    ratio_increase) capped at 1, i0 = ceil(period * ratio_zero) the first step of the ramp (0 there).
    Optimus's ``frange_cycle_zero_linear(n_iter, 0, 1, n_cycle, ratio_increase, ratio_zero)`` (Li et al.
    2020) with period = n_iter / n_cycle an integer: ``cyclical_fraction(t, ...) == L[t]`` for
    t = 0 .. n_iter - 1 (their L[t] is the weight of iteration t counted from 0; ours of step t counted
    from 1, so our first update takes their L[1]); tested against a float re-implementation. Fu et al.
    2019 (NAACL), eq. 6 with R = 0.5: ratio_zero 0, ratio_increase 0.5, i.e. min(1, 2 s / period);
    Optimus: ratio_zero 0.5, ratio_increase 0.25. Raises ValueError for period < 1."""
    if period < 1:
        raise ValueError(f"period={period} must be >= 1")
    s = step % period
    zero = period * ratio_zero  # their float product: ``i < period * ratio_zero`` decides the zero part
    if s < zero:
        return 0.0
    return min(1.0, (s - math.ceil(zero)) / (period * ratio_increase))


def _need(name: str, low: int, schedule: str) -> Callable[[Any], str | None]:
    """A field check: ``name`` must be >= ``low`` under ``schedule`` (the one-line error, or None)."""
    return lambda cfg: (f"{name} must be >= {low} for beta_schedule={schedule!r}"
                        if getattr(cfg, name) < low else None)


@dataclass(frozen=True)
class Schedule:
    """One β schedule. ``beta(cfg, step)``: β at ``step`` (>= 0, counted after the AE phase) of the
    ``ObjectiveConfig`` ``cfg``; ``source``: the formula's source; ``formula``: the formula as the docs
    show it; ``fields``: the config fields it reads besides ``beta``; ``check(cfg)``: the one-line
    error of a config whose fields this schedule cannot run with, or None."""

    name: str
    beta: Callable[[Any, int], float]
    source: str
    formula: str
    fields: tuple[str, ...] = ()
    check: Callable[[Any], str | None] = lambda cfg: None


#: the registry, in the order the config's choices and the docs list them
SCHEDULES: dict[str, Schedule] = {s.name: s for s in (
    Schedule("constant", lambda cfg, step: cfg.beta, "the standard ELBO (Kingma & Welling 2014)", "β"),
    Schedule("linear", lambda cfg, step: cfg.beta * min(1.0, step / cfg.beta_warmup_steps),
             "linear KL warm-up (Bowman et al. 2016 anneal from 0)", "β · min(1, t / beta_warmup_steps)",
             ("beta_warmup_steps",), _need("beta_warmup_steps", 1, "linear")),
    Schedule("cyclical", lambda cfg, step: cfg.beta * cyclical_fraction(step, cfg.beta_cycle_steps, cfg.beta_ratio_zero,
                                                                         cfg.beta_ratio_increase),
             "Fu et al. 2019 (NAACL), cyclical annealing; Optimus (Li et al. 2020)",
             "0 for the first beta_ratio_zero of each period of beta_cycle_steps, then a linear rise to β over "
             "the next beta_ratio_increase of it, then β",
             ("beta_cycle_steps", "beta_ratio_zero", "beta_ratio_increase"), _need("beta_cycle_steps", 2, "cyclical")),
)}

#: every schedule's name, in registry order (``zfree.config.BetaSchedule``)
SCHEDULE_NAMES: tuple[str, ...] = tuple(SCHEDULES)
