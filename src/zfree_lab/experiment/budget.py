"""The budget of an own-data study (``--budget``): the grid is cut, one ordered cut at a time, until
the cost model says it fits (``fit_budget``). The cuts are one table, ``CUTS``, ordered by what
they cost the result per minute saved (the label oracles last): each entry either changes the grid
(fewer evaluated rows, evaluations, beta points, weightings, a smaller batch, fewer label oracles)
or scales every run's steps by one factor down to a floor (a *steps fit*, which ends the search
when it succeeds). The fitted grid fills the budget (``FILL``). ``--budget``'s help
(``budget_help``) and the docs are generated from the table. Light: no torch (the CLI's help reads
it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from zfree.config import TrainConfig
from zfree.core.errors import ConfigError
from zfree.core.weightings import WEIGHTINGS

if TYPE_CHECKING:
    from zfree_lab.experiment.spec import ExperimentSpec

#: seconds a budget keeps for the report after the runs (an own study of 11 runs on E2E rows with a
#: 49k-vocabulary model)
REPORT_S = 60.0
#: below this many steps a run is cut only after the weightings and the batch (a run of fewer steps
#: barely moves)
STEP_FLOOR = 50
#: the batch a budget falls back to when even the kept weightings do not fit at ``STEP_FLOOR`` steps
SMALL_BATCH = 8
#: the weightings an own-data grid keeps when the budget cannot hold all four: the seed notes' two
#: (distribution-level 1/c_base and example-level 1/(b + eps)), from the registry
KEEP_WEIGHTINGS = tuple(n for n, w in WEIGHTINGS.items() if w.kept_by_budget)
#: the fewest steps a run keeps under any budget
MIN_STEPS = 10
#: the share of its budget a fitted grid fills at the least, by the estimate (``fit_budget``): a
#: steps fit fills it (to the rounding of the steps); a grid that a cut left under it at its asked
#: steps (one beta point of two halves a grid) gets evaluated rows back
FILL = 0.85
#: the share of a budget the probes may take (``zfree_lab.experiment.estimate.plan``): a probe still
#: running past it is stopped, and a probe that is not needed (a z-free control's, counted at the
#: K-way probe's times instead) is not started where it would pass it (SmolLM2-135M: one probe took
#: 14.4 min of a 30 min budget, then the study was refused with nothing trained)
PROBE_SHARE = 0.25
#: seconds a rerun spends planning beyond its preparation when its probes are kept (reading the kept
#: records, expanding the grid): counted in the budget a refusal asks for
PLAN_S = 10.0


def parse_budget(text: str | None) -> float | None:
    """``--budget`` text -> seconds: ``15m``, ``1h``, ``90s``, ``1h30m`` or a bare number of minutes;
    ``none``/``off`` -> None (no budget). Raises ConfigError naming ``--budget`` otherwise, and for a
    zero however written (``0``, ``0m``, ``0h0m``): it would fit no run, and ``0`` read as "no budget"
    would start the whole grid without a word (issue 61)."""
    import re

    if text is None or str(text).strip().lower() in ("none", "off"):
        return None
    t = str(text).strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", t):
        seconds = float(t) * 60
    else:
        parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", t)
        if not parts or "".join(a + b for a, b in parts) != t:
            raise ConfigError(f"--budget {text!r}: give a duration such as 15m, 1h, 1h30m, 900s (or none)")
        seconds = sum(float(a) * {"h": 3600, "m": 60, "s": 1}[b] for a, b in parts)
    if seconds == 0:
        raise ConfigError(f"--budget {text!r}: a zero budget fits no run; give a duration such as 15m, 1h, "
                          f"1h30m, 900s or none (no budget)")
    return seconds


def _scaled(d: dict, f: float, floor: int = 10) -> dict:
    keys = ("steps", "eval_every", "hard_em_max_steps", "handover_check_every")
    return {**d, **{k: max(floor if k == "steps" else 1, int(round(d[k] * f))) for k in keys if k in d}}


def _with(spec: "ExperimentSpec", train: dict | None = None, aided: dict | None = None, factors=None) -> "ExperimentSpec":
    b = spec.boundary
    b = dataclasses.replace(b, aided=b.aided if aided is None else aided,
                            beta_factors=b.beta_factors if factors is None else tuple(factors))
    return dataclasses.replace(spec, train=spec.train if train is None else train, boundary=b)


def _fit_steps(spec: "ExperimentSpec", seconds: Callable[["ExperimentSpec"], float], budget: float, floor: int
               ) -> tuple["ExperimentSpec", str] | None:
    """Every run's steps (and eval/hand-over intervals) scaled by one factor f so that the grid fits
    ``budget`` (f from the grid's time at f = 1 and 1/2, linear in the steps, then lowered until the
    rounded steps fit); None when f x steps would fall below ``floor``."""
    steps = int(spec.train.get("steps", TrainConfig().optim.steps))
    full = seconds(spec)
    half = seconds(_with(spec, _scaled(spec.train, 0.5, 1), _scaled(spec.boundary.aided, 0.5, 1)))
    slope = 2 * (full - half)
    f = min(1.0, (budget - (full - slope)) / slope) if slope > 0 else 0.0
    if f * steps < floor:
        return None
    cut = _with(spec, _scaled(spec.train, f), _scaled(spec.boundary.aided, f))
    for _ in range(20):  # rounded steps may overshoot the linear fit: step f down until it fits
        if seconds(cut) <= budget:
            break
        f *= 0.98
        if f * steps < floor:
            return None
        cut = _with(spec, _scaled(spec.train, f), _scaled(spec.boundary.aided, f))
    return cut, (f"steps x {f:.2f} (unaided {steps} -> {cut.train['steps']}, aided "
                 f"{spec.boundary.aided.get('steps', steps)} -> {cut.boundary.aided.get('steps', cut.train['steps'])})")




def _rows(spec: "ExperimentSpec") -> int:
    return int(spec.train.get("eval_rows", TrainConfig().optim.eval_rows))


def _rows_to(spec: "ExperimentSpec", new: int) -> "ExperimentSpec":
    aided = {**spec.boundary.aided, "handover_rows": min(new, spec.boundary.aided.get("handover_rows", new))}
    return _with(spec, {**spec.train, "eval_rows": new}, aided)


def _cut_rows_third(spec, labels):
    rows = _rows(spec)
    if rows <= 50:
        return None
    new = max(50, rows // 3)
    return _rows_to(spec, new), f"evaluated rows {rows} -> {new}"


def _cut_evaluations(spec, labels):
    steps = int(spec.train.get("steps", TrainConfig().optim.steps))
    if int(spec.train.get("eval_every", TrainConfig().optim.eval_every)) >= steps:
        return None
    aided = spec.boundary.aided
    spec = _with(spec, {**spec.train, "eval_every": steps},
                 {**aided, "eval_every": aided.get("steps", steps)} if "eval_every" in aided or "steps" in aided
                 else aided)
    return spec, "evaluations at step 0 and the end only"


def _cut_beta_points(spec, labels):
    old = spec.boundary.beta_factors
    if len(old) <= 1:
        return None
    return _with(spec, factors=old[:1]), f"beta points {[round(f, 3) for f in old]} x beta* -> {[round(old[0], 3)]} x beta*"


def _cut_weightings(spec, labels):
    keep = tuple(w for w in spec.boundary.weightings if w in KEEP_WEIGHTINGS)
    if not keep or len(keep) >= len(spec.boundary.weightings):
        return None
    return (dataclasses.replace(spec, boundary=dataclasses.replace(spec.boundary, weightings=keep)),
            f"weightings {list(spec.boundary.weightings)} -> {list(keep)}")


def _cut_batch(spec, labels):
    batch = int(spec.train.get("batch_size", TrainConfig().optim.batch_size))
    if batch <= SMALL_BATCH:
        return None
    return _with(spec, {**spec.train, "batch_size": SMALL_BATCH}), f"batch {batch} -> {SMALL_BATCH} rows a step"


def _cut_first_weighting(spec, labels):
    ws = spec.boundary.weightings
    if len(ws) <= 1:
        return None
    return (dataclasses.replace(spec, boundary=dataclasses.replace(spec.boundary, weightings=ws[:1])),
            f"weightings {list(ws)} -> {list(ws[:1])}")


def _cut_oracles(spec, labels):
    if len(labels) <= 1 or not spec.controls:
        return None
    return dataclasses.replace(spec, oracles=tuple(labels[:1])), f"label oracles {list(labels)} -> {list(labels[:1])}"


def _cut_no_oracles(spec, labels):
    if not labels or not spec.controls or spec.oracles == ():
        return None
    kept = list(labels) if spec.oracles is None else list(spec.oracles)
    return dataclasses.replace(spec, oracles=()), f"label oracles {kept} -> none"


def _cut_rows_50(spec, labels):
    rows = _rows(spec)
    if rows <= 50:
        return None
    return _rows_to(spec, 50), f"evaluated rows {rows} -> 50"


@dataclass(frozen=True)
class Cut:
    """One row of the budget's table: ``name`` (for ``--budget``'s help), ``what`` (for the docs), and
    either ``apply`` (spec, the grid's oracle labels) -> (the cut spec, the line said) or None where
    it does not apply, or a steps fit down to ``floor`` steps (``apply`` None)."""

    name: str
    what: str
    apply: Callable | None = None
    floor: int = 0


#: the cuts in order (``fit_budget``), what buys the least result per minute first: each tried only
#: while the grid does not fit; a steps fit that succeeds ends the search. The evaluations go first
#: (they measure, the runs learn), then steps down to ``STEP_FLOOR`` (the report's smoke-test line),
#: then the beta points, the weightings, the batch and the last evaluated rows, each followed by a
#: steps fit at that floor; only then steps below it; and the label oracles last of all: what z could
#: gain from a named label is the point of a labelled study (SmolLM2-135M on 2 cores, 39 min: the old
#: order cut every oracle before the steps went under 50). The weightings are cut to the first kept
#: one (distribution) where even the floor does not fit with the other's fixed cost (example's
#: scoring of the training rows with a large model).
CUTS: tuple[Cut, ...] = (
    Cut("evaluated rows", "the evaluated rows to a third (at least 50)", _cut_rows_third),
    Cut("intermediate evaluations", "the evaluations between step 0 and the end (curves only: every number "
        "of the report is read at the end)", _cut_evaluations),
    Cut("steps", f"every run's steps (and intervals) by one factor, down to {STEP_FLOOR}", floor=STEP_FLOOR),
    Cut("beta points", "one beta point per weighting (the first factor)", _cut_beta_points),
    Cut("steps", f"the steps again, down to {STEP_FLOOR}", floor=STEP_FLOOR),
    Cut("weightings", f"the weightings to {list(KEEP_WEIGHTINGS)}", _cut_weightings),
    Cut("steps", f"the steps again, down to {STEP_FLOOR}", floor=STEP_FLOOR),
    Cut("batch", f"the batch to {SMALL_BATCH} rows", _cut_batch),
    Cut("steps", f"the steps again, down to {STEP_FLOOR}", floor=STEP_FLOOR),
    Cut("distribution alone", "the weightings to the first kept one", _cut_first_weighting),
    Cut("steps", f"the steps again, down to {STEP_FLOOR}", floor=STEP_FLOOR),
    Cut("50 evaluated rows", "the evaluated rows to 50", _cut_rows_50),
    Cut("steps", f"the steps again, down to {STEP_FLOOR}", floor=STEP_FLOOR),
    Cut("steps", f"the steps below the floor, down to {MIN_STEPS} (the report calls such runs a smoke test)",
        floor=MIN_STEPS),
    Cut("one label oracle", "the label oracles to the first of the grid's labels", _cut_oracles),
    Cut("steps", f"the steps again, down to {MIN_STEPS}", floor=MIN_STEPS),
    Cut("no label oracle", "no label oracle (what a label is worth to the decoder goes unmeasured; each run keeps "
        "its z-free control)", _cut_no_oracles),
    Cut("steps", f"the steps again, down to {MIN_STEPS}", floor=MIN_STEPS),
)


def budget_help() -> str:
    """The cut order for ``--budget``'s help: each cut's name once (a steps fit repeated at the same
    floor is a retry, not a new cut)."""
    names, floor = [], None
    for c in CUTS:
        if c.apply is None:
            if c.floor != floor:
                names.append(f"steps (>= {c.floor})")
            floor = c.floor
        else:
            names.append(c.name)
    return ", ".join(names)


def _at_steps(spec: "ExperimentSpec", n: int) -> "ExperimentSpec | None":
    """``spec`` with every run's steps scaled to ``n`` (None where they are at ``n`` or fewer)."""
    steps = int(spec.train.get("steps", TrainConfig().optim.steps))
    if steps <= n:
        return None
    return _with(spec, _scaled(spec.train, n / steps), _scaled(spec.boundary.aided, n / steps))


def _steps_line(spec: "ExperimentSpec", cut: "ExperimentSpec") -> str:
    """The line of a steps fit from ``spec`` to ``cut``, naming the floor when it went under it."""
    steps = int(spec.train.get("steps", TrainConfig().optim.steps))
    new = int(cut.train["steps"])
    under = f"; under the {STEP_FLOOR}-step floor" if new < STEP_FLOOR <= steps else ""
    return (f"steps x {new / steps:.2f} (unaided {steps} -> {new}, aided {spec.boundary.aided.get('steps', steps)} -> "
            f"{cut.boundary.aided.get('steps', new)}{under})")


def _fill_rows(asked: "ExperimentSpec", spec: "ExperimentSpec", seconds: Callable[["ExperimentSpec"], float],
               budget: float, lines: list[str]) -> tuple["ExperimentSpec", list[str]]:
    """A grid that a cut left under ``FILL`` of ``budget`` at its asked steps (a beta point or a
    weighting is a large share of a grid) gets its evaluated rows back, as many as fit up to the
    asked ones (a bisection), and its rows line says the final number."""
    rows, want = _rows(spec), _rows(asked)
    if rows >= want or seconds(spec) >= FILL * budget:
        return spec, lines
    lo, hi = rows, want
    while hi - lo > 1:  # the most rows that fit: seconds grow with the rows
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if seconds(_rows_to(spec, mid)) <= budget else (lo, mid)
    best = hi if seconds(_rows_to(spec, hi)) <= budget else lo
    if best == rows:
        return spec, lines
    kept = [ln for ln in lines if not ln.startswith("evaluated rows")]
    return _rows_to(spec, best), ([f"evaluated rows {want} -> {best}"] if best < want else []) + kept


def fit_budget(spec: "ExperimentSpec", seconds: Callable[["ExperimentSpec"], float], budget: float,
               labels: Sequence[str] = ()) -> tuple["ExperimentSpec", list[str]]:
    """Cut an own-data grid (``spec.boundary`` set) with ``CUTS``, in order, each only while
    ``seconds(spec)`` > ``budget``; ``labels``: the grid's oracle labels, in order. Returns the cut
    spec and one line per cut, in the table's order: a cut made after a steps fit at a floor was not
    enough says what that floor needed. A cut that would save nothing (fewer evaluated rows than the
    validation set has, say) is not made. The grid fills the budget: a steps fit takes as many steps
    as fit, and a grid a cut left under ``FILL`` of it at its asked steps gets evaluated rows back
    (``_fill_rows``). Raises ConfigError naming the time the smallest grid needs (for the runs:
    ``budget`` is their share; its seconds in the error's ``smallest_s``; that budget is accepted),
    or when ``spec`` is not an own-data grid."""
    if spec.boundary is None:
        raise ConfigError("--budget sizes an own-data grid (zfree study --model M --data F); a preset's grid is fixed")
    asked, lines, short = spec, [], ""
    now = seconds(spec)  # the current grid's seconds (each call expands its points)
    for cut in CUTS:
        if now <= budget:
            return _fill_rows(asked, spec, seconds, budget, lines)
        if cut.apply is None:
            fitted = _fit_steps(spec, seconds, budget, cut.floor)
            if fitted is not None:
                return fitted[0], lines + [_steps_line(spec, fitted[0])]
            at = _at_steps(spec, cut.floor)
            if at is not None:
                short = (f" (at {cut.floor} steps the grid needs {seconds(at) / 60:.1f} min, "
                         f"{max(0.0, budget) / 60:.1f} are left)")
            continue
        done = cut.apply(spec, labels)
        after = None if done is None else seconds(done[0])
        if after is not None and after < now:
            (spec, line), now = done, after
            lines.append(line + short)
            short = ""
    if now <= budget:
        return _fill_rows(asked, spec, seconds, budget, lines)
    least = _at_steps(spec, MIN_STEPS) or spec
    smallest = seconds(least)
    if smallest <= budget:  # the budget a refusal asked for: the linear steps fit may round below the floor
        return least, lines + [_steps_line(spec, least)]
    refusal = ConfigError(f"even {MIN_STEPS} steps a run need about {smallest / 60:.0f} min on this machine, "
                          f"{max(0.0, budget) / 60:.1f} min are left for the runs")
    refusal.smallest_s = smallest  # the smallest grid's seconds: the caller names the budget it needs
    raise refusal
