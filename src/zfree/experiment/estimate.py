"""An estimate before a study starts: a few steps of one grid point are measured in a
child process (``probe``: a ``zfree train`` of ``PROBE_STEPS`` steps, its peak RSS polled), and the
whole grid's wall time and peak memory on this machine follow from them (``estimate_grid``). Where
the grid does not fit in memory, ``fit_memory`` picks fewer workers, else a smaller micro-batch with
gradient accumulation (``micro_batch``, the same objective: ``zfree.train.accumulate``), else refuses
in one line naming the memory it needs; under a budget, ``fit_budget`` cuts an own-data grid
(evaluated rows, intermediate evaluations, beta points, steps, weightings, batch: the order in its
docstring) until it fits and says what it cut. ``plan`` does all of it and writes ``estimate.json``.

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
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from zfree.config import TrainConfig
from zfree.core.errors import ConfigError
from zfree.core.io import atomic_write_json, read_jsonl
from zfree.experiment.spec import ExperimentSpec, Point
from zfree.train.accumulate import accumulation_problem
from zfree.core.weightings import WEIGHTINGS as WEIGHTING_REGISTRY

GB = 2**30
PROBE_STEPS, PROBE_ROWS = 4, 16  # steps and evaluated rows of the probe run (the first step apart)
#: seconds a study's run spends starting its papermill kernel and notebook beyond what a probe's
#: ``zfree train`` child measures (leaderboard study, session 5: notebook written 4-6 s after the
#: run's own wall_s)
KERNEL_START_S = 5.0
#: seconds a budget keeps for the report after the runs (an own study of 11 runs on E2E rows with a
#: 49k-vocabulary model: measured below in README "Real models on a small machine")
REPORT_S = 60.0
#: below this many steps a run is cut only after the weightings and the batch (a run of fewer steps
#: barely moves)
STEP_FLOOR = 50
#: the batch a budget falls back to when even the kept weightings do not fit at ``STEP_FLOOR`` steps
SMALL_BATCH = 8
#: an aggressive-encoder run's cost in K-way steps per step (He et al. 2019's inner posterior steps):
#: its forward tokens over a plain run's, measured 11.3x [11.0, 11.7] on the synthetic leaderboard
#: (distribution beta 0.3, 3 seeds: analysis/results/leaderboard-aggressive-distribution.json)
AGGRESSIVE_STEP_FACTOR = 11.3
MEMORY_SHARE = 0.85  # of the available memory a grid may plan to use (the rest: page cache, the OS)


@dataclass(frozen=True)
class Probe:
    """What a probe measured: seconds of setup, of one K-way step at ``batch_size`` rows (in chunks
    of ``micro_batch``), of one evaluated row; the child's peak resident memory in bytes; and, when a
    z-free control was probed too, its one-pass step and evaluated row (``given_*``; None: counted
    as K-way ones, an overestimate)."""
    setup_s: float
    step_s: float
    eval_row_s: float
    peak_rss: int
    batch_size: int
    micro_batch: int = 0
    wall_s: float = 0.0
    given_step_s: float | None = None
    given_eval_row_s: float | None = None
    #: decoding, measured where the run decodes (``decode_rows`` > 0 on data without strategies):
    #: seconds of the samples (greedy and sampled y per latent value) in each evaluation, and of the
    #: multi-reference outputs after the final one; ``given_*``: the control's (its K samples)
    samples_s: float = 0.0
    decode_s: float = 0.0
    given_samples_s: float | None = None
    given_decode_s: float | None = None
    #: seconds to score the training rows once with the base model (b on training rows, which example
    #: and token weightings need; cached after the first run that scores them): the training rows
    #: at the rate the preparation scored the validation rows (``scoring_s`` of an own study's
    #: reference); 0 where that rate is unknown
    train_scoring_s: float = 0.0
    #: the probe was stopped when its memory passed the ceiling it was given (or killed by the
    #: system, SIGKILL): ``peak_rss`` is a lower bound and the times were not measured (NaN)
    over: bool = False


def memory_limit() -> int:
    """Bytes this machine can give: the cgroup's memory.max when set, else the available memory."""
    import psutil  # lazy: only an estimate needs it

    avail = psutil.virtual_memory().available
    try:
        raw = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        return min(avail, int(raw)) if raw != "max" else avail
    except (OSError, ValueError):
        return avail


def _poll_peak(pid: int, stop: threading.Event, peak: list[int], ceiling: int | None = None,
               over: threading.Event | None = None) -> None:
    """Keep ``peak[0]`` at the largest RSS of process ``pid`` with its descendants, every 0.2 s; where
    it passes ``ceiling`` bytes, kill the whole tree (SIGKILL) and set ``over``: a probe that does
    not fit stops there instead of pushing the machine into its out-of-memory killer."""
    import psutil

    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    while not stop.is_set():
        try:
            procs = [root, *root.children(recursive=True)]
            rss = sum(p.memory_info().rss for p in procs)
            peak[0] = max(peak[0], rss)
            if ceiling is not None and rss > ceiling:
                if over is not None:
                    over.set()
                _kill_tree(pid)
                return
        except psutil.Error:
            pass
        stop.wait(0.2)


def _kill_tree(pid: int) -> None:
    """SIGKILL process ``pid`` and its descendants (children first); gone ones are skipped."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [*root.children(recursive=True), root]
    except psutil.Error:
        return
    for q in procs:
        try:
            q.kill()
        except psutil.Error:
            pass


def probe_params(params: dict, micro_batch: int = 0) -> dict:
    """The flat config a probe trains: ``params`` for ``PROBE_STEPS`` steps on ``PROBE_ROWS`` rows,
    decoding as the point does (its samples and multi-reference outputs are timed), unaided and with
    ``remedy`` "none" (a remedy's fields depend on the run's steps and may
    set an aid: its cost is modelled in ``run_seconds``, never probed); a ``micro_batch`` smaller than
    the batch becomes the probe's batch (one chunk a step: an accumulated step's peak memory in a
    fraction of its time; ``probe``)."""
    o = TrainConfig.from_flat(params).optim
    # the run's share of decoded rows (task correctness on data with strategies), at least one where
    # it decodes at all (samples and multi-reference outputs on data without)
    decode = 0 if not o.decode_rows else max(1, round(PROBE_ROWS * min(1.0, o.decode_rows / max(1, o.eval_rows or 1))))
    chunked = bool(micro_batch) and micro_batch < o.batch_size
    return {**params, "steps": PROBE_STEPS, "eval_every": PROBE_STEPS, "eval_rows": PROBE_ROWS,
            "decode_rows": decode, "aid": "none", "remedy": "none", "warmup_backbone": 1,
            "batch_size": micro_batch if chunked else o.batch_size, "micro_batch": 0 if chunked else micro_batch}


def probe(point: Point, work: Path, micro_batch: int | None = None, ceiling: int | None = None) -> Probe:
    """Train ``point`` unaided for ``PROBE_STEPS`` steps on ``PROBE_ROWS`` evaluated rows (``probe_params``)
    in a child ``zfree train`` (one torch thread) in ``work``, and measure it (``Probe``). ``ceiling``:
    bytes of resident memory the child's process tree may reach; past it the child is killed and the
    Probe comes back with ``over`` set (SmolLM2-135M at batch 32 x K = 4 reached 21.7 GB of a 24 GB
    machine before the probe could report it), as it does when the system kills the child (SIGKILL).
    A ``micro_batch`` smaller than the batch is probed as batches of ``micro_batch`` rows (one chunk
    a step: the peak of an accumulated step, its gradient buffers and one chunk's activations, in a
    fraction of the time); ``Probe.batch_size`` is then ``micro_batch`` and ``run_seconds`` scales
    the step to the run's batch (the optimizer update counted once a chunk: a slight overestimate).
    Raises ConfigError with the child's last lines when it fails otherwise (a point that cannot run)."""
    cfg = TrainConfig.from_flat(point.params)
    mb = cfg.optim.micro_batch if micro_batch is None else micro_batch
    flat = probe_params(point.params, mb)
    n_batch = int(flat["batch_size"])
    run = work / f"probe-mb{mb}"
    import shutil

    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    (run.parent / f"{run.name}.json").write_text(json.dumps(flat))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    t0, peak, stop, over = time.time(), [0], threading.Event(), threading.Event()
    proc = subprocess.Popen([sys.executable, "-m", "zfree.cli", "train", "--config", str(run.parent / f"{run.name}.json"),
                             "--out", str(run)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    poller = threading.Thread(target=_poll_peak, args=(proc.pid, stop, peak, ceiling, over), daemon=True)
    poller.start()
    try:
        output, _ = proc.communicate()
    except BaseException:  # Ctrl-C, SIGTERM (raised as an interrupt by the CLI): the child goes too
        _kill_tree(proc.pid)
        proc.wait()
        raise
    finally:
        stop.set()
        poller.join()
    wall = time.time() - t0
    if over.is_set() or proc.returncode == -signal.SIGKILL:
        for ckpt in run.glob("checkpoint*"):
            shutil.rmtree(ckpt, ignore_errors=True)
        nan = float("nan")
        return Probe(setup_s=nan, step_s=nan, eval_row_s=nan, peak_rss=peak[0], batch_size=n_batch,
                     micro_batch=mb, wall_s=wall, over=True)
    if proc.returncode != 0:
        raise ConfigError(f"the probe of {point.run_id} failed (exit {proc.returncode}): "
                          f"{' | '.join(output.strip().splitlines()[-3:])}")
    rows = read_jsonl(run / "metrics.jsonl")
    summary = json.loads((run / "summary.json").read_text())
    for ckpt in run.glob("checkpoint*"):  # a probe's weights are never read again (SmolLM2: 1.6 GB each)
        shutil.rmtree(ckpt, ignore_errors=True)
    ev0, end = rows[0]["wall_s"], rows[-1]["wall_s"]
    samples = float(rows[0].get("decode/samples_s") or 0.0)  # decoded in every evaluation, not per row
    decode = float(summary.get("multiref/decode_s") or 0.0)  # after the final evaluation, once a run
    step_s, warm = probed_step_seconds(summary, ev0, end)
    return Probe(setup_s=max(0.0, wall - end - decode) + warm, step_s=step_s,
                 eval_row_s=max(0.0, ev0 - samples) / PROBE_ROWS, peak_rss=peak[0], batch_size=n_batch,
                 micro_batch=mb, wall_s=wall, samples_s=samples, decode_s=decode)


def probed_step_seconds(summary: dict, ev0: float, end: float) -> tuple[float, float]:
    """(seconds of a steady step, the first step's extra seconds) from a probe's ``summary.json``:
    the steps' wall time (``compute/train_wall_s``, evaluations excluded) less the first step
    (``compute/first_step_s``: allocations and caches warm up in it) over the other
    ``PROBE_STEPS - 1``. Counting the first step as a steady one overestimated a 400-step synthetic
    leaderboard run 2.2x (probe 0.71 s a step, the run 0.28 s). Without those keys (an older
    trainer): (``end`` - 2 ``ev0``) / ``PROBE_STEPS`` and no extra, ``ev0``/``end`` the wall seconds
    of the first and last evaluation records."""
    first, train = summary.get("compute/first_step_s"), summary.get("compute/train_wall_s")
    if first is None or train is None or PROBE_STEPS < 2:
        return max(1e-3, (end - 2 * ev0) / PROBE_STEPS), 0.0
    steady = max(1e-3, (train - first) / (PROBE_STEPS - 1))
    return steady, max(0.0, first - steady)


def _n_evals(steps: int, every: int) -> int:
    return 1 + len(set(range(every, steps + 1, every)) | {steps})


def run_seconds(params: dict, pr: Probe, n_val: int) -> float:
    """Estimated wall seconds of one run (module docstring): setup + kernel start + steps x step +
    evaluated rows x row; a control's or oracle's steps and rows at the probe's ``given_*`` times,
    a hard-EM step at one given step + a third of a K-way step, an aggressive-encoder run's steps at
    ``AGGRESSIVE_STEP_FACTOR`` K-way steps each; where the run decodes, the probe's samples seconds
    per evaluation and multi-reference seconds once."""
    c = TrainConfig.from_flat(params)
    o, a = c.optim, c.aid
    given = c.model.latent_source != "posterior"
    soft = pr.step_s * o.batch_size / pr.batch_size
    one = (pr.step_s if pr.given_step_s is None else pr.given_step_s) * o.batch_size / pr.batch_size
    row = pr.given_eval_row_s if given and pr.given_eval_row_s is not None else pr.eval_row_s
    rows = min(o.eval_rows or n_val, n_val)
    evals = _n_evals(o.steps, o.eval_every) * rows
    hard = 0
    if a.aid == "hard_em_then_soft":
        hard = min(a.hard_em_max_steps, o.steps)
        evals += (hard // max(1, a.handover_check_every)) * min(a.handover_rows or n_val, n_val)
    step_time = o.steps * one if given else hard * (one + soft / 3) + (o.steps - hard) * soft
    if a.aid == "aggressive_encoder":
        step_time *= AGGRESSIVE_STEP_FACTOR
    decode = 0.0
    if o.decode_rows:  # the probe measured 0 where this data or latent decodes nothing
        samples = pr.given_samples_s if given and pr.given_samples_s is not None else pr.samples_s
        decode = _n_evals(o.steps, o.eval_every) * samples + (
            pr.given_decode_s if given and pr.given_decode_s is not None else pr.decode_s)
    return pr.setup_s + KERNEL_START_S + step_time + evals * row + decode


def grid_seconds(points: list[Point], pr: Probe, n_val: int, workers: int) -> float:
    """The grid's wall seconds: each point, in order, on the first free of ``workers`` workers. A
    point that needs b on the training rows (``needs_example_b``) and starts before the first such
    point has scored and cached them pays ``pr.train_scoring_s`` as well."""
    free = [0.0] * max(1, workers)
    scored = math.inf  # when the training rows' scores are in the cache
    for p in points:
        i = free.index(min(free))
        start, secs = free[i], run_seconds(p.params, pr, n_val)
        if pr.train_scoring_s and start < scored and TrainConfig.from_flat(p.params).objective.needs_example_b:
            secs += pr.train_scoring_s
            scored = min(scored, start + pr.setup_s + KERNEL_START_S + pr.train_scoring_s)
        free[i] += secs
    return max(free)


def train_scoring_seconds(points: list[Point]) -> float:
    """``Probe.train_scoring_s`` for ``points``: the training rows x the seconds a row the
    preparation's validation scoring took (``base_dir/reference/reference.json``: ``scoring_s``
    over its rows, written by ``zfree.experiment.sources.write_reference``); 0 when no point needs
    b on training rows or the rate is not recorded."""
    if not any(TrainConfig.from_flat(p.params).objective.needs_example_b for p in points):
        return 0.0
    params = points[0].params
    rj = Path(params["base_dir"]) / "reference" / "reference.json"
    try:
        meta = json.loads(rj.read_text())
        rate = float(meta["scoring_s"]) / int(meta["n_rows"])
        n_train = sum(1 for _ in open(Path(params["data_dir"]) / "train.jsonl", encoding="utf-8"))
    except (OSError, KeyError, TypeError, ValueError, ZeroDivisionError):
        return 0.0
    return rate * n_train


@dataclass
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
        return w, pr.micro_batch, pr, ([f"memory: {w} worker(s) instead of {workers} (each run peaks at "
                                        f"{pr.peak_rss / GB:.1f} GB, {room / GB:.1f} GB to plan with)"]
                                       if w < workers else [])
    problems = {accumulation_problem(TrainConfig.from_flat(p.params)) for p in points} - {None}
    mb = max(1, pr.batch_size // 4)
    if not problems and pr.batch_size > 1:
        small = reprobe(mb)
        if not small.over and small.peak_rss <= room:
            full = (f"over {pr.peak_rss / GB:.1f} GB a run (its probe stopped there)" if pr.over
                    else f"{pr.peak_rss / GB:.1f} GB a run")
            w = max(1, min(workers, int(room // max(1, small.peak_rss))))
            return w, mb, small, [f"memory: {w} worker(s), micro-batches of {mb} rows with gradient accumulation "
                                  f"(batch {pr.batch_size}: {full}, micro-batch: "
                                  f"{small.peak_rss / GB:.1f} GB a run, {room / GB:.1f} GB to plan with; "
                                  "recorded as micro_batch in config.json)"]
        pr = small
    need = (f"more than {pr.peak_rss / GB:.1f} GB for one run (a {PROBE_STEPS}-step probe"
            f"{f' at micro_batch={pr.micro_batch}' if pr.micro_batch else ''} was stopped there)" if pr.over else
            f"{pr.peak_rss / GB:.1f} GB for one run (a {PROBE_STEPS}-step probe's peak RSS"
            f"{f' at micro_batch={pr.micro_batch}' if pr.micro_batch else ''})")
    raise ConfigError(f"this grid needs {need} but {max(0.0, room) / GB:.1f} GB are free to plan with; "
                      "use a smaller model or batch_size")


def parse_budget(text: str | None) -> float | None:
    """``--budget`` text -> seconds: ``15m``, ``1h``, ``90s``, ``1h30m`` or a bare number of minutes;
    ``none``/``0`` -> None (no budget). Raises ConfigError naming ``--budget`` otherwise."""
    import re

    if text is None or str(text).strip().lower() in ("none", "0", "off"):
        return None
    t = str(text).strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", t):
        return float(t) * 60
    parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", t)
    if not parts or "".join(a + b for a, b in parts) != t:
        raise ConfigError(f"--budget {text!r}: give a duration such as 15m, 1h, 1h30m, 900s (or none)")
    return sum(float(a) * {"h": 3600, "m": 60, "s": 1}[b] for a, b in parts)


def _scaled(d: dict, f: float, floor: int = 10) -> dict:
    keys = ("steps", "eval_every", "hard_em_max_steps", "handover_check_every")
    return {**d, **{k: max(floor if k == "steps" else 1, int(round(d[k] * f))) for k in keys if k in d}}


def _with(spec: ExperimentSpec, train: dict | None = None, aided: dict | None = None, factors=None) -> ExperimentSpec:
    b = spec.boundary
    b = dataclasses.replace(b, aided=b.aided if aided is None else aided,
                            beta_factors=b.beta_factors if factors is None else tuple(factors))
    return dataclasses.replace(spec, train=spec.train if train is None else train, boundary=b)


def _fit_steps(spec: ExperimentSpec, seconds: Callable[[ExperimentSpec], float], budget: float, floor: int
               ) -> tuple[ExperimentSpec, str] | None:
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


#: the weightings an own-data grid keeps when the budget cannot hold all four: the seed notes' two
#: (distribution-level 1/c_base and example-level 1/(b + eps))
KEEP_WEIGHTINGS = tuple(n for n, w in WEIGHTING_REGISTRY.items() if w.kept_by_budget)  # distribution, example


def fit_budget(spec: ExperimentSpec, seconds: Callable[[ExperimentSpec], float], budget: float,
               labels: Sequence[str] = ()) -> tuple[ExperimentSpec, list[str]]:
    """Cut an own-data grid (``spec.boundary`` set) until ``seconds(spec)`` <= ``budget``, in this
    order, each only while the grid does not fit: the evaluated rows to a third (>= 50); the
    evaluations between step 0 and the end (curves only: every number of the report is read at the
    end); one beta point per weighting (the first factor); every run's steps (and intervals) by one
    factor down to ``STEP_FLOOR``; the weightings to ``KEEP_WEIGHTINGS``; the batch to ``SMALL_BATCH``
    rows (where ``STEP_FLOOR`` steps still do not fit); the steps down to 10; the weightings to the
    first kept one (where even 10 steps do not fit), the steps again; then the label oracles to the
    first of ``labels`` (the grid's oracle labels, in order), the evaluated rows to 50, the steps
    again (a large model on a small machine: SmolLM2-135M on 2 cores, 30 min).
    Returns the cut spec and one line per cut. Raises ConfigError naming the time the smallest grid
    needs (for the runs: ``budget`` is their share), or when ``spec`` is not an own-data grid."""
    if spec.boundary is None:
        raise ConfigError("--budget sizes an own-data grid (zfree study --model M --data F); a preset's grid is fixed")
    cuts: list[str] = []
    rows = int(spec.train.get("eval_rows", TrainConfig().optim.eval_rows))
    if seconds(spec) > budget and rows > 50:
        new = max(50, rows // 3)
        aided = {**spec.boundary.aided, "handover_rows": min(new, spec.boundary.aided.get("handover_rows", new))}
        spec = _with(spec, {**spec.train, "eval_rows": new}, aided)
        cuts.append(f"evaluated rows {rows} -> {new}")
    steps = int(spec.train.get("steps", TrainConfig().optim.steps))
    if seconds(spec) > budget and int(spec.train.get("eval_every", TrainConfig().optim.eval_every)) < steps:
        aided = spec.boundary.aided
        spec = _with(spec, {**spec.train, "eval_every": steps},
                     {**aided, "eval_every": aided.get("steps", steps)} if "eval_every" in aided or "steps" in aided
                     else aided)
        cuts.append("evaluations at step 0 and the end only")
    if seconds(spec) > budget and len(spec.boundary.beta_factors) > 1:
        old = spec.boundary.beta_factors
        spec = _with(spec, factors=old[:1])
        cuts.append(f"beta points {[round(f, 3) for f in old]} x beta* -> {[round(old[0], 3)]} x beta*")
    if seconds(spec) <= budget:
        return spec, cuts
    fitted = _fit_steps(spec, seconds, budget, STEP_FLOOR)
    if fitted is None:
        keep = tuple(w for w in spec.boundary.weightings if w in KEEP_WEIGHTINGS)
        if keep and len(keep) < len(spec.boundary.weightings):
            cuts.append(f"weightings {list(spec.boundary.weightings)} -> {list(keep)}")
            spec = dataclasses.replace(spec, boundary=dataclasses.replace(spec.boundary, weightings=keep))
        batch = int(spec.train.get("batch_size", TrainConfig().optim.batch_size))
        if seconds(spec) > budget and _fit_steps(spec, seconds, budget, STEP_FLOOR) is None and batch > SMALL_BATCH:
            spec = _with(spec, {**spec.train, "batch_size": SMALL_BATCH})
            cuts.append(f"batch {batch} -> {SMALL_BATCH} rows a step")
        fitted = (spec, None) if seconds(spec) <= budget else _fit_steps(spec, seconds, budget, 10)
        ws = spec.boundary.weightings
        if fitted is None and len(ws) > 1:
            # one weighting left (distribution): where even 10 steps do not fit with the other's
            # fixed cost (example's scoring of the training rows with a large model)
            cuts.append(f"weightings {list(ws)} -> {list(ws[:1])}")
            spec = dataclasses.replace(spec, boundary=dataclasses.replace(spec.boundary, weightings=ws[:1]))
            fitted = (spec, None) if seconds(spec) <= budget else _fit_steps(spec, seconds, budget, 10)
        if fitted is None and len(labels) > 1 and spec.controls:
            cuts.append(f"label oracles {list(labels)} -> {list(labels[:1])}")
            spec = dataclasses.replace(spec, oracles=tuple(labels[:1]))
            fitted = (spec, None) if seconds(spec) <= budget else _fit_steps(spec, seconds, budget, 10)
        rows = int(spec.train.get("eval_rows", TrainConfig().optim.eval_rows))
        if fitted is None and rows > 50:
            aided = {**spec.boundary.aided, "handover_rows": min(50, spec.boundary.aided.get("handover_rows", 50))}
            spec = _with(spec, {**spec.train, "eval_rows": 50}, aided)
            cuts.append(f"evaluated rows {rows} -> 50")
            fitted = (spec, None) if seconds(spec) <= budget else _fit_steps(spec, seconds, budget, 10)
    if fitted is None:
        smallest = seconds(_with(spec, _scaled(spec.train, 10 / steps), _scaled(spec.boundary.aided, 10 / steps)))
        raise ConfigError(f"even 10 steps a run need about {smallest / 60:.0f} min on this machine, "
                          f"{budget / 60:.1f} min are left for the runs")
    spec, line = fitted
    return spec, cuts + ([line] if line else [])


def plan(spec: ExperimentSpec, make_points: Callable[[ExperimentSpec], list[Point]], out: Path, workers: int,
         budget: float | None = None, started: float | None = None) -> Plan:
    """Probe one point (and a z-free control), fit the grid to memory (``fit_memory``) and to the
    budget (``fit_budget``), print the estimate and what changed, and write ``out/estimate.json``.
    ``budget``: seconds for the whole study; the grid gets what is left of it after the time since
    ``started`` (``time.time()`` when the study began: the split, the reference, the probes) and
    ``REPORT_S`` for the report. Raises ConfigError when nothing is left."""
    import psutil

    points = make_points(spec)
    val = Path(points[0].params["data_dir"]) / "val.jsonl"
    n_val = sum(1 for _ in open(val, encoding="utf-8"))
    work = out / "estimate"
    parent, limit = psutil.Process().memory_info().rss, memory_limit()
    ceiling = max(1, int(MEMORY_SHARE * limit - parent))  # a probe past it is stopped (``probe``)
    pr = probe(points[0], work, ceiling=ceiling)
    w, mb, pr, lines = fit_memory(points, pr, workers, limit, parent, lambda m: probe(points[0], work, m, ceiling))
    control = next((p for p in points if p.params.get("latent_source", "posterior") != "posterior"), None)
    pr = dataclasses.replace(pr, train_scoring_s=train_scoring_seconds(points))
    if control is not None:  # its one-pass step and evaluation: a third to a half of a study's runs
        g = probe(control, work / "control", mb, ceiling)
        if g.over:
            raise ConfigError(f"the z-free control {control.run_id} needs more than {g.peak_rss / GB:.1f} GB "
                              f"(its probe was stopped there) but {ceiling / GB:.1f} GB are free to plan with; "
                              "use a smaller model or batch_size")
        pr = dataclasses.replace(pr, given_step_s=g.step_s * pr.batch_size / g.batch_size,
                                 given_eval_row_s=g.eval_row_s, wall_s=pr.wall_s + g.wall_s,
                                 given_samples_s=g.samples_s, given_decode_s=g.decode_s)
    if mb:
        spec = dataclasses.replace(spec, train={**spec.train, "micro_batch": mb})
    cuts: list[str] = []
    grid_budget = None
    if budget is not None:
        spent = 0.0 if started is None else time.time() - started
        grid_budget = budget - spent - REPORT_S
        if grid_budget <= 0:
            raise ConfigError(f"--budget {budget / 60:.0f} min: the split, reference and probes took {spent / 60:.1f} min "
                              f"and the report needs about {REPORT_S / 60:.0f}; give a larger budget")
        labels = [str(p.params["latent_source"])[len("label:"):] for p in points
                  if str(p.params.get("latent_source", "")).startswith("label:")]
        try:
            spec, cuts = fit_budget(spec, lambda s: grid_seconds(make_points(s), pr, n_val, w), grid_budget, labels)
        except ConfigError as e:
            if spec.boundary is None:  # a preset's grid: the budget does not apply
                raise
            for line in [_measured(pr, w), *lines]:  # what the refusal was computed from
                print(line, flush=True)
            raise ConfigError(f"--budget {budget / 60:.0f} min: the split, reference and probes took {spent / 60:.1f} min "
                              f"and the report needs about {REPORT_S / 60:.0f}; {e}; give a larger budget") from None
    final = make_points(spec)
    if w < workers and final and final[0].params["batch_size"] < points[0].params["batch_size"]:
        # the budget cut the batch after memory fixed the workers at the full batch's peak:
        # probe the cut batch and take the workers its peak leaves room for
        small = probe(final[0], work / "cut", ceiling=ceiling)
        w2 = 0 if small.over else min(workers, int((MEMORY_SHARE * limit - parent) // max(1, small.peak_rss)))
        if w2 > w:
            lines.append(f"memory: {w2} worker(s) after the cut to batch {final[0].params['batch_size']} (each run "
                         f"peaks at {small.peak_rss / GB:.1f} GB there; {w} at batch {points[0].params['batch_size']})")
            pr = dataclasses.replace(pr, peak_rss=small.peak_rss, wall_s=pr.wall_s + small.wall_s)
            w = w2
    secs, peak = grid_seconds(final, pr, n_val, w), w * pr.peak_rss + parent
    head = (f"estimate: {len(final)} runs on {w} worker(s): about {secs / 60:.1f} min, peak memory {peak / GB:.1f} GB "
            f"({w} x {pr.peak_rss / GB:.2f} GB a run + {parent / GB:.2f} GB this process; {limit / GB:.1f} GB available). "
            + _measured(pr if any(TrainConfig.from_flat(p.params).objective.needs_example_b for p in final)
                        else dataclasses.replace(pr, train_scoring_s=0.0), None))  # the cut grid may need no b
    room = (f"budget {budget / 60:.0f} min ({grid_budget / 60:.1f} for the runs after the preparation and probes, "
            f"{REPORT_S:.0f} s kept for the report)" if budget is not None else "")
    lines = [head, *lines, *([f"{room}: cut " + "; ".join(cuts)] if cuts else
                             [f"{room}: the grid fits uncut"] if budget is not None else [])]
    rec = {"runs": len(final), "workers": w, "estimated_s": secs, "estimated_peak_bytes": peak, "budget_s": budget,
           "grid_budget_s": grid_budget, "cuts": cuts, "micro_batch": mb, "probe": dataclasses.asdict(pr), "memory_limit_bytes": limit,
           "lines": lines, "train": spec.train}
    atomic_write_json(out / "estimate.json", rec)
    for line in lines:
        print(line, flush=True)
    return Plan(spec, w, secs, peak, lines, rec)


def _measured(pr: Probe, workers: int | None) -> str:
    """The estimate's line of what the probes measured (``workers``: named where no estimate precedes it)."""
    return ((f"estimate: {workers} worker(s). " if workers is not None else "")
            + f"Measured by {PROBE_STEPS}-step probes ({pr.wall_s:.0f} s, peak {pr.peak_rss / GB:.2f} GB a run): "
            f"{pr.step_s:.2f} s a K-way step at batch "
            f"{pr.batch_size}, {pr.eval_row_s:.3f} s an evaluated row"
            + (f"; z-free control {pr.given_step_s:.2f} s a step, {pr.given_eval_row_s:.3f} s a row"
               if pr.given_step_s is not None else "") + f"; {pr.setup_s:.0f} s setup"
            + (f"; scoring the training rows once {pr.train_scoring_s:.0f} s" if pr.train_scoring_s else "")
            + (f"; decoding {pr.samples_s:.0f} s an evaluation + {pr.decode_s:.0f} s a run"
               + (f" (control {pr.given_samples_s or 0:.0f} + {pr.given_decode_s or 0:.0f} s)"
                  if pr.given_samples_s is not None else "") if pr.samples_s or pr.decode_s else ""))
