"""An estimate before a study starts: a few steps of one grid point are measured in a
child process (``probe``: a ``zfree train`` of ``PROBE_STEPS`` steps, its peak RSS polled), and the
whole grid's wall time and peak memory on this machine follow from them (``estimate_grid``). Where
the grid does not fit in memory, ``fit_memory`` picks fewer workers, else a smaller micro-batch with
gradient accumulation (``micro_batch``, the same objective: ``zfree.train.accumulate``), else refuses
in one line naming the memory it needs; under a budget, ``fit_budget`` cuts an own-data grid
(``zfree_lab.experiment.budget.CUTS``, one ordered table) until it fits and says what it cut. ``plan``
does all of it and writes ``estimate.json``. The parts live in their own modules: the probe
(``zfree_lab.experiment.probe``), the cost model (``zfree_lab.experiment.cost``) and the budget
(``zfree_lab.experiment.budget``); their names are re-exported here.

The model of a run's wall time: setup (process start, imports, model load, reference, plus
``KERNEL_START_S`` for the papermill kernel a study's run gets) + steps x the measured step time
(scaled by batch size) + evaluated rows (every evaluation, hand-over gate checks included) x the
measured time per evaluated row. Two kinds of step are probed: the K-way step of a CVAE run (the
first point) and the one-pass step of a z-free control or label oracle (``latent_source`` other than
``posterior``: only the given value is decoded), each with its own time per evaluated row. A hard-EM
step is counted as a one-pass step plus a third of a K-way step (its E-step: the K-way forward
without gradient, about a third of a forward + backward); an aggressive-encoder step as
``AGGRESSIVE_STEP_FACTOR`` K-way steps (its measured forward tokens). Decoding (the samples in each
evaluation, the multi-reference outputs after the last: ``decode_rows`` on data without strategies)
is timed by the probes and added per run. The probe trains the first point without its aid and
remedy. The grid's wall time: the points in order on the first free worker (what a process pool
does).
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Callable

from zfree.config import LatentSource, TrainConfig
from zfree.core.errors import ConfigError
from zfree.core.io import atomic_write_json
from zfree.train.accumulate import accumulation_problem
from zfree_lab.experiment.budget import (CUTS, FILL, KEEP_WEIGHTINGS, MIN_STEPS, PLAN_S, PROBE_SHARE, REPORT_S,  # noqa: F401
                                     SMALL_BATCH, STEP_FLOOR, _fit_steps, _scaled, _with, budget_help, fit_budget,
                                     parse_budget)
from zfree_lab.experiment.cost import (AGGRESSIVE_STEP_FACTOR, KERNEL_START_S, _n_evals, grid_seconds,  # noqa: F401
                                   run_seconds, train_scoring_seconds)
from zfree_lab.experiment.devices import CUDA_CONTEXT_BYTES, device_count, fit_device  # noqa: F401
from zfree_lab.experiment.probe import (GB, MEMORY_SHARE, PROBE_ROWS, PROBE_STEPS, Probe, _kill_tree,  # noqa: F401
                                    _poll_peak, kept_probe, memory_limit, probe, probe_params, probe_side_by_side,
                                    probed_step_seconds, usable_cores)
from zfree_lab.experiment.spec import ExperimentSpec, Point


@dataclasses.dataclass
class Plan:
    """What ``plan`` decided: the (possibly cut) spec, workers, the estimate and the lines said."""
    spec: ExperimentSpec
    workers: int
    seconds: float
    peak_bytes: int
    lines: list[str]
    record: dict


def fit_memory(points: list[Point], pr: Probe, workers: int, limit: int, parent: int, reprobe: Callable[[int], Probe]
               ) -> tuple[int, int, Probe, list[str]]:
    """(workers, micro_batch, the probe that fits, what was changed) so that workers x peak + this
    process fits in ``MEMORY_SHARE`` x ``limit``: fewer workers first, then micro-batches of the
    batch (probed again with ``reprobe(micro_batch)``) where accumulation keeps the objective, with
    as many of the ``workers`` as the micro-batched run's peak leaves room for.
    Raises ConfigError naming the memory one run needs when nothing fits."""
    room = MEMORY_SHARE * limit - parent
    fit = 0 if pr.over else int(room // max(1, pr.peak_rss))
    if fit >= 1:
        w = min(workers, fit)
        said = (f"memory: {w} worker(s) instead of {workers} (each run peaks at {pr.peak_rss / GB:.1f} GB, {room / GB:.1f}"
                f" GB to plan with: {MEMORY_SHARE:.0%} of the memory free now; where other processes held it, the same "
                f"command with --workers {workers} resumes on {workers} once it is free)")
        return w, pr.micro_batch, pr, [said] if w < workers else []
    problems = {accumulation_problem(TrainConfig.from_flat(p.params)) for p in points} - {None}
    mb = max(1, pr.batch_size // 4)
    if not problems and pr.batch_size > 1:
        small = reprobe(mb)
        small = dataclasses.replace(small, wall_s=small.wall_s + pr.wall_s,  # the probe stopped at its ceiling too
                                    reused=small.reused and pr.reused)
        if not small.over and small.peak_rss <= room:
            full = (f"at least {pr.peak_rss / GB:.1f} GB a run by the model's size (not probed)" if pr.skipped
                    else f"over {pr.peak_rss / GB:.1f} GB a run (its probe stopped there)" if pr.over
                    else f"{pr.peak_rss / GB:.1f} GB a run")
            w = max(1, min(workers, int(room // max(1, small.peak_rss))))
            return w, mb, small, [f"memory: {w} worker(s), micro-batches of {mb} rows with gradient accumulation "
                                  f"(batch {pr.batch_size}: {full}, micro-batch: "
                                  f"{small.peak_rss / GB:.1f} GB a run, {room / GB:.1f} GB to plan with; "
                                  "recorded as micro_batch in config.json)"]
        pr = small
    need = (f"at least {pr.peak_rss / GB:.1f} GB for one run (the model's size"
            f"{f' at micro_batch={pr.micro_batch}' if pr.micro_batch else ''}: not probed)" if pr.skipped else
            f"more than {pr.peak_rss / GB:.1f} GB for one run (a {PROBE_STEPS}-step probe"
            f"{f' at micro_batch={pr.micro_batch}' if pr.micro_batch else ''} was stopped there)" if pr.over else
            f"{pr.peak_rss / GB:.1f} GB for one run (a {PROBE_STEPS}-step probe's peak RSS"
            f"{f' at micro_batch={pr.micro_batch}' if pr.micro_batch else ''})")
    raise ConfigError(f"this grid needs {need} but {max(0.0, room) / GB:.1f} GB are free to plan with; "
                      "use a smaller model or batch_size")


def fit_workers(points: list[Point], pr: Probe, workers: int, limit: int, parent: int,
                reprobe: Callable[[int], Probe]) -> tuple[int, int, Probe, list[str]]:
    """``fit_memory`` for the host and, where the probe ran on CUDA, ``fit_device`` for the devices
    (``workers`` counts runs per device there): (processes at once, micro_batch, probe, lines)."""
    n_dev = device_count() if pr.device_peak else 0
    w, mb, pr, lines = fit_memory(points, pr, workers * max(1, n_dev), limit, parent, reprobe)
    if not n_dev:
        return w, mb, pr, lines
    w_dev, said = fit_device(pr, workers, n_dev)
    return min(w, w_dev), mb, pr, [*lines, *said]


def _first_control(points: list[Point]) -> Point | None:
    """The grid's first z-free control or label oracle (a one-pass run), None when it has none."""
    return next((p for p in points if p.params.get("latent_source", "posterior") != "posterior"), None)


def _with_control_probe(pr: Probe, g: Probe) -> Probe:
    """``pr`` with the one-pass step and evaluation measured by ``g``, a z-free control's or label
    oracle's probe (its step time scaled to ``pr``'s batch); the wall times add up."""
    return dataclasses.replace(pr, given_step_s=g.step_s * pr.batch_size / g.batch_size,
                               given_eval_row_s=g.eval_row_s, wall_s=pr.wall_s + g.wall_s,
                               given_samples_s=g.samples_s, given_decode_s=g.decode_s, reused=pr.reused and g.reused)


def _kind(point: Point) -> str:
    return "K-way" if point.params.get("latent_source", "posterior") == "posterior" else "z-free control"


class Probing:
    """The probes of one ``plan``, each through ``probe`` in ``work``: run now, kept from an earlier
    probe of the same config, or skipped for the model's size; each stopped at ``deadline`` (the
    budget's ``PROBE_SHARE``; None: no budget). ``log``: one record a probe (what it measured,
    its status, this session's seconds), for the estimate's line and estimate.json."""

    def __init__(self, work: Path, ceiling: int, deadline: float | None = None):
        self.work, self.ceiling, self.deadline, self.t0 = work, ceiling, deadline, time.time()
        self.t_end = self.t0  # when the last probe run now ended
        self.log: list[dict] = []

    def one(self, point: Point, sub: str = "", mb: int | None = None, ceiling: int | None = None) -> Probe:
        """``probe`` of ``point`` in ``work/sub`` at micro-batch ``mb``, logged."""
        pr = probe(point, self.work / sub if sub else self.work, mb, self.ceiling if ceiling is None else ceiling,
                   deadline=self.deadline)
        return self.note(point, pr)

    def pair(self, jobs: list[tuple[Point, str, int]]) -> list[Probe]:
        """``probe_side_by_side`` of (point, sub, mb) jobs, each within half the ceiling, logged."""
        done = probe_side_by_side([(p, self.work / sub if sub else self.work, mb) for p, sub, mb in jobs],
                                  self.ceiling // 2, self.deadline)
        return [self.note(p, pr, SIDE_BY_SIDE) for (p, _, _), pr in zip(jobs, done)]

    def note(self, point: Point, pr: Probe, how: str = "") -> Probe:
        """Log ``pr`` (the probe of ``point``; ``how``: a note on the batch) with its status — ran, kept,
        skipped, stopped at the deadline or at the memory ceiling — and this session's seconds; returns it."""
        status = ("skipped" if pr.skipped else "stopped at the deadline" if pr.over_time else
                  "stopped at its memory ceiling" if pr.over else "kept" if pr.reused else "ran")
        self.log.append({"probe": f"{_kind(point)} at batch {pr.batch_size}{how}", "status": status,
                         "wall_s": 0.0 if pr.reused or pr.skipped else pr.wall_s, "peak_bytes": pr.peak_rss})
        if status not in ("kept", "skipped"):
            self.t_end = time.time()
        return pr

    def spent(self) -> float:
        """Seconds this session's probes took (the kept ones none)."""
        return self.t_end - self.t0

    def left(self) -> float:
        """Seconds left before the deadline (inf without one)."""
        return math.inf if self.deadline is None else self.deadline - time.time()

    def ran(self) -> bool:
        """Whether any probe ran now (not kept, not skipped)."""
        return any(r["status"] not in ("kept", "skipped") for r in self.log)

    def check(self, pr: Probe, budget: float | None, prep_s: float) -> Probe:
        """``pr`` unless it was stopped at the deadline: then a ConfigError naming the probes' share of
        the budget and the least budget under which they could finish."""
        if not pr.over_time or budget is None:
            return pr
        spent = time.time() - self.t0
        raise ConfigError(f"--budget {budget / 60:.0f} min: the probes may take {PROBE_SHARE * 100:.0f} % of it "
                          f"({PROBE_SHARE * budget / 60:.1f} min) and were stopped there, unmeasured "
                          f"({self.log[-1]['probe']}); give a budget of at least "
                          f"{math.ceil((prep_s + PLAN_S + REPORT_S + spent / PROBE_SHARE) / 60)} min "
                          "(the probes then take longer than they were given here)")


def _with_control(pr: Probe, points: list[Point], probing: Probing, mb: int, lines: list[str]) -> tuple[Probe, float]:
    """``pr`` with the one-pass step and evaluation of the grid's first z-free control or label
    oracle (its probe: a third to a half of a study's runs), ``pr`` itself when the grid has none or
    ``pr`` already carries it (measured beside the K-way probe, ``_reprobe``); and the seconds of a
    probe it did not run. Not probed (its steps counted at the K-way probe's times, an overestimate,
    said in ``lines``) where no kept record answers and the K-way probe's time would pass the
    probes' deadline, or where it was stopped there. ConfigError when that probe was stopped at the
    memory ceiling."""
    control = _first_control(points)
    if control is None or pr.given_step_s is not None:
        return pr, 0.0
    expect = pr.wall_s if math.isfinite(pr.wall_s) else 0.0
    if kept_probe(control, probing.work / "control", mb, probing.ceiling) is None and expect > probing.left():
        lines.append(f"z-free control not probed (the probes' share of the budget, {PROBE_SHARE * 100:.0f} %, has "
                     f"less than the {expect:.0f} s the K-way probe took left): its steps counted as K-way ones, an overestimate")
        return pr, expect
    g = probing.one(control, "control", mb)
    if g.over_time:
        lines.append("z-free control stopped at the probes' share of the budget: its steps counted as K-way ones, "
                     "an overestimate")
        return pr, expect
    if g.over:
        raise ConfigError(f"the z-free control {control.run_id} needs more than {g.peak_rss / GB:.1f} GB "
                          f"(its probe was {'not run: its size' if g.skipped else 'stopped there'}) but "
                          f"{probing.ceiling / GB:.1f} GB are free to plan with; use a smaller model or batch_size")
    return _with_control_probe(pr, g), 0.0


def _spent_line(budget: float, spent: float) -> str:
    """The start of a budget refusal: the budget, the ``spent`` seconds and the report's share."""
    return (f"--budget {budget / 60:.0f} min: the split, reference and probes took {spent / 60:.1f} min "
            f"and the report needs about {REPORT_S / 60:.0f}")


def _cut_to_budget(spec: ExperimentSpec, seconds: Callable[[ExperimentSpec], float], grid_budget: float,
                   points: list[Point], why: str, measured: Callable[[], list[str]], before_grid: float = 0.0
                   ) -> tuple[ExperimentSpec, list[str]]:
    """``fit_budget`` of ``spec`` to ``grid_budget`` seconds (the label oracles of ``points`` kept in
    the cut): the cut spec and the cuts. A refusal of an own-data grid prints ``measured()`` (what it
    was computed from) and raises ConfigError starting with ``why`` and ending with the smallest
    budget the same command accepts next time: ``before_grid`` (the seconds a rerun spends outside
    its grid: the preparation, the planning with the probes kept, the report) + the smallest grid,
    in whole minutes rounded up; a preset's grid re-raises as is."""
    sources = [LatentSource.parse(p.params.get("latent_source")) for p in points]
    labels = [s.label for s in sources if s.kind == "label"]
    try:
        return fit_budget(spec, seconds, grid_budget, labels)
    except ConfigError as e:
        if spec.boundary is None:  # a preset's grid: the budget does not apply
            raise
        for line in measured():
            print(line, flush=True)
        smallest = getattr(e, "smallest_s", None)
        ask = ("give a larger budget" if smallest is None else
               f"give a budget of at least {math.ceil((before_grid + smallest) / 60)} min (the probes are kept: "
               "the same command with it re-probes nothing)")
        raise ConfigError(f"{why}; {e}; {ask}") from None


def _workers_after_cut(cut: Point, full: Point, pr: Probe, w: int, workers: int, probing: Probing,
                       room: float, lines: list[str], slack: float) -> tuple[int, Probe]:
    """The budget cut the batch after memory fixed the workers at the full batch's peak: probe the
    cut point and take the workers its peak leaves room for (``room``: bytes free to plan with).
    Returns (workers, probe), ``(w, pr)`` unchanged when the cut batch leaves no room for more, or
    when no kept record answers and the full batch's probe time would pass the probes' deadline or
    the grid's ``slack`` (its budget less its estimate: this probe runs outside the grid's share); a
    change appends its line to ``lines``."""
    expect = pr.wall_s if math.isfinite(pr.wall_s) else 0.0
    if kept_probe(cut, probing.work / "cut", None, probing.ceiling) is None and expect > min(slack, probing.left()):
        return w, pr
    small = probing.one(cut, "cut")
    w2 = 0 if small.over or small.over_time else min(workers, int(room // max(1, small.peak_rss)))
    if w2 <= w:
        return w, pr
    lines.append(f"memory: {w2} worker(s) after the cut to batch {cut.params['batch_size']} (each run "
                 f"peaks at {small.peak_rss / GB:.1f} GB there; {w} at batch {full.params['batch_size']})")
    return w2, dataclasses.replace(pr, peak_rss=small.peak_rss, wall_s=pr.wall_s + small.wall_s,
                                   reused=pr.reused and small.reused)


def _reprobe(points: list[Point], probing: Probing, workers: int) -> Callable[[int], Probe]:
    """``fit_memory``'s probe at a micro-batch ``m``: where the grid has a z-free control, 2 or more
    workers were asked for and this machine has 2 or more cores, the K-way point and the control are
    probed side by side (``probe_side_by_side``), each within half the ceiling, and the K-way
    Probe carries the control's measurements (``_with_control_probe``; the pair's wall time counted once); where one
    of them passes its half, the K-way point alone with the whole ceiling, as otherwise."""
    control = _first_control(points)
    cores = usable_cores()

    def again(m: int) -> Probe:
        if control is None or workers < 2 or cores < 2:
            return probing.one(points[0], "", m)
        t0 = time.time()
        k, g = probing.pair([(points[0], "", m), (control, "control", m)])
        if k.over or g.over or k.over_time or g.over_time:
            return probing.one(points[0], "", m)
        return _with_control_probe(dataclasses.replace(k, wall_s=time.time() - t0), dataclasses.replace(g, wall_s=0.0))
    return again


def _whole_command(runs_s: float, started: float | None) -> str:
    """The estimate line's part on the whole command: the runs' ``runs_s`` and the report after them, and (given
    ``started``) the preparation and probes so far."""
    so_far = 0.0 if started is None else time.time() - started
    return (f"with the report (about {REPORT_S / 60:.0f} min) the study ends in about {(runs_s + REPORT_S) / 60:.1f} min"
            + (f", {(so_far + runs_s + REPORT_S) / 60:.1f} min in all with the {so_far / 60:.1f} min of preparation and "
               "probes so far" if started is not None else "") + ". ")


def plan(spec: ExperimentSpec, make_points: Callable[[ExperimentSpec], list[Point]], out: Path, workers: int,
         budget: float | None = None, started: float | None = None) -> Plan:
    """Probe one point (and a z-free control), fit the grid to memory (``fit_memory``) and to the
    budget (``fit_budget``), print the estimate and what changed, and write ``out/estimate.json``.
    ``budget``: seconds for the whole study; the probes get at most ``PROBE_SHARE`` of it
    (``Probing``), the grid what is left of it after the time since ``started`` (``time.time()`` when
    the study began: the split, the reference, the probes) and ``REPORT_S`` for the report. Raises
    ConfigError when nothing is left, naming the smallest budget the same command accepts next
    time (its probes kept)."""
    import psutil

    t_plan = time.time()
    prep_s = 0.0 if started is None else max(0.0, t_plan - started)
    points = make_points(spec)
    val = Path(points[0].params["data_dir"]) / "val.jsonl"
    n_val = sum(1 for _ in open(val, encoding="utf-8"))
    parent, limit = psutil.Process().memory_info().rss, memory_limit()
    ceiling = max(1, int(MEMORY_SHARE * limit - parent))  # a probe past it is stopped (``probe``)
    probing = Probing(out / "estimate", ceiling, None if budget is None else t_plan + PROBE_SHARE * budget)
    pr = probing.check(probing.one(points[0]), budget, prep_s)
    w, mb, pr, lines = fit_workers(points, pr, workers, limit, parent, _reprobe(points, probing, workers))
    pr = probing.check(pr, budget, prep_s)
    pr = dataclasses.replace(pr, train_scoring_s=train_scoring_seconds(points))
    pr, unprobed = _with_control(pr, points, probing, mb, lines)
    if mb:
        spec = dataclasses.replace(spec, train={**spec.train, "micro_batch": mb})
    cuts: list[str] = []
    grid_budget = None
    if budget is not None:
        spent = 0.0 if started is None else time.time() - started
        why, grid_budget = _spent_line(budget, spent), max(0.0, budget - spent - REPORT_S)  # 0: refused below
        spec, cuts = _cut_to_budget(spec, lambda s: grid_seconds(make_points(s), pr, n_val, w), grid_budget, points,
                                    why, lambda: [_measured(pr, w, probing.log, probing.spent(),
                                                            points[0].params["batch_size"]), *lines],
                                    before_grid=prep_s + PLAN_S + REPORT_S + unprobed)
    final = make_points(spec)
    if w < workers and final and final[0].params["batch_size"] < points[0].params["batch_size"]:
        slack = math.inf if grid_budget is None else grid_budget - grid_seconds(final, pr, n_val, w)
        w, pr = _workers_after_cut(final[0], points[0], pr, w, workers, probing,
                                   MEMORY_SHARE * limit - parent, lines, slack)
    secs, peak = grid_seconds(final, pr, n_val, w), w * pr.peak_rss + parent
    head = (f"estimate: {len(final)} runs on {w} worker(s): about {secs / 60:.1f} min, peak memory {peak / GB:.1f} GB "
            f"({w} x {pr.peak_rss / GB:.2f} GB a run + {parent / GB:.2f} GB this process; {limit / GB:.1f} GB available); "
            + _whole_command(secs, started)
            + _measured(pr if any(TrainConfig.from_flat(p.params).objective.needs_example_b for p in final)
                        else dataclasses.replace(pr, train_scoring_s=0.0), None,  # the cut grid may need no b
                        probing.log, probing.spent(), final[0].params["batch_size"] if final else None))
    room = (f"budget {budget / 60:.0f} min ({grid_budget / 60:.1f} for the runs after the preparation and probes, "
            f"{REPORT_S:.0f} s kept for the report)" if budget is not None else "")
    lines = [head, *lines, *([f"{room}: cut " + "; ".join(cuts)] if cuts else
                             [f"{room}: the grid fits uncut"] if budget is not None else [])]
    rec = {"runs": len(final), "workers": w, "estimated_s": secs, "estimated_peak_bytes": peak, "budget_s": budget,
           "grid_budget_s": grid_budget, "cuts": cuts, "micro_batch": mb, "probe": dataclasses.asdict(pr),
           "probes": probing.log, "probes_s": probing.spent(), "memory_limit_bytes": limit, "lines": lines, "train": spec.train}
    atomic_write_json(out / "estimate.json", rec)
    for line in lines:
        print(line, flush=True)
    return Plan(spec, w, secs, peak, lines, rec)


#: the note a probe run beside another carries in ``Probing.log``
SIDE_BY_SIDE = " (side by side)"


def probes_said(probes: list[dict], spent: float) -> str:
    """What the probes of a plan did (``Probing.log``): the ones run now with this session's
    ``spent`` seconds, those kept from an earlier probe of the same config on this machine (named
    "kept" only where nothing was run for them now), and those skipped or stopped."""
    groups: dict[str, list[str]] = {}
    ran_now = {r["probe"].removesuffix(SIDE_BY_SIDE) for r in probes if r["status"] != "kept"}
    for r in probes:  # a probe reused from one that ran (or stopped) side by side this session is no earlier one
        if r["status"] != "kept" or r["probe"].removesuffix(SIDE_BY_SIDE) not in ran_now:
            groups.setdefault(r["status"], []).append(r["probe"])
    said = {"ran": f"ran now ({spent:.0f} s)", "kept": "kept from an earlier probe of the same config on this machine",
            "skipped": "skipped (the model's size alone needs more memory than there is)",
            "stopped at its memory ceiling": "stopped at their memory ceiling",
            "stopped at the deadline": "stopped at the probes' share of the budget"}
    parts = [f"{v}: {', '.join(groups[k])}" for k, v in said.items() if k in groups]
    if "ran" not in groups:
        parts.insert(0, "none ran now")
    return f"{PROBE_STEPS}-step probes " + "; ".join(parts)


def _measured(pr: Probe, workers: int | None, probes: list[dict] | None = None, spent: float = 0.0,
              batch: int | None = None) -> str:
    """The estimate's line of what the probes measured (``workers``: named where no estimate
    precedes it): which probes ran and which were kept (``probes_said``), then the times at the
    grid's ``batch`` (a step's time scaled from the probe's batch, as ``run_seconds`` does)."""
    b = pr.batch_size if batch is None else batch
    at = (f"at the grid's batch of {b} rows" + (f" (scaled from the probe's {pr.batch_size})" if b != pr.batch_size
                                                else ""))
    scale = b / pr.batch_size
    return ((f"estimate: {workers} worker(s). " if workers is not None else "")
            + (probes_said(probes, spent) + ". " if probes is not None else "")
            + f"Measured {at}: {pr.step_s * scale:.2f} s a K-way step, {pr.eval_row_s:.3f} s an evaluated row"
            + (f"; z-free control {pr.given_step_s * scale:.2f} s a step, {pr.given_eval_row_s:.3f} s a row"
               if pr.given_step_s is not None else "") + f"; {pr.setup_s:.0f} s setup; peak {pr.peak_rss / GB:.2f} GB a run"
            + (f"; scoring the training rows once {pr.train_scoring_s:.0f} s" if pr.train_scoring_s else "")
            + (f"; decoding {pr.samples_s:.0f} s an evaluation + {pr.decode_s:.0f} s a run"
               + (f" (control {pr.given_samples_s or 0:.0f} + {pr.given_decode_s or 0:.0f} s)"
                  if pr.given_samples_s is not None else "") if pr.samples_s or pr.decode_s else ""))
