"""The probe of an estimate: a few steps of one grid point trained in a child ``zfree train``
(one torch thread), its wall times and its process tree's peak resident memory measured (``probe``,
``Probe``), stopped past a memory ceiling. The cost model that turns a Probe into a grid's wall time
is ``zfree_lab.experiment.cost``; the plan that runs both is ``zfree_lab.experiment.estimate``."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from zfree.config import TrainConfig
from zfree.core.errors import ConfigError
from zfree.core.io import read_jsonl
from zfree_lab.experiment.memory_floor import step_memory_floor
from zfree_lab.experiment.spec import Point

GB = 2**30
PROBE_STEPS, PROBE_ROWS = 4, 16  # steps and evaluated rows of the probe run (the first step apart)
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
    #: measured by an earlier probe of the same config on this machine (``probe``: its kept record)
    reused: bool = False
    #: not run: the model's size alone needs more than its ceiling (``peak_rss``: that floor,
    #: ``zfree_lab.experiment.cost.step_memory_floor``); ``over`` is set too
    skipped: bool = False
    #: stopped at its deadline (the probes' share of a budget, ``plan``): the times were not measured
    over_time: bool = False
    #: on an accelerator (CUDA): the bytes the run's process reserved on its device at its peak and the
    #: device's total (``zfree_lab.run.run_folder.device_memory``); 0 on the CPU
    device_peak: int = 0
    device_total: int = 0
    #: K of the probed K-way point (its evaluated row scores each value); 0: unknown (an older record)
    n_latent: int = 0

    @property
    def measured(self) -> bool:
        """Its times were measured (now or by the earlier probe it keeps)."""
        return not (self.over or self.over_time)


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
               over: threading.Event | None = None, deadline: float | None = None,
               late: threading.Event | None = None) -> None:
    """Keep ``peak[0]`` at the largest RSS of process ``pid`` with its descendants, every 0.2 s; where
    it passes ``ceiling`` bytes, kill the whole tree (SIGKILL) and set ``over``: a probe that does
    not fit stops there instead of pushing the machine into its out-of-memory killer. Past
    ``deadline`` (``time.time()`` seconds) the same, setting ``late``."""
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
            if deadline is not None and time.time() > deadline:
                if late is not None:
                    late.set()
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


def probe(point: Point, work: Path, micro_batch: int | None = None, ceiling: int | None = None,
          deadline: float | None = None) -> Probe:
    """Train ``point`` unaided for ``PROBE_STEPS`` steps on ``PROBE_ROWS`` evaluated rows (``probe_params``)
    in a child ``zfree train`` (one torch thread) in ``work``, and measure it (``Probe``). ``ceiling``:
    bytes of resident memory the child's process tree may reach; past it the child is killed and the
    Probe comes back with ``over`` set (SmolLM2-135M at batch 32 x K = 4 reached 21.7 GB of a 24 GB
    machine before the probe could report it), as it does when the system kills the child (SIGKILL).
    A ``micro_batch`` smaller than the batch is probed as batches of ``micro_batch`` rows (one chunk
    a step: the peak of an accumulated step, its gradient buffers and one chunk's activations, in a
    fraction of the time); ``Probe.batch_size`` is then ``micro_batch`` and ``run_seconds`` scales
    the step to the run's batch (the optimizer update counted once a chunk: a slight overestimate).
    A probe whose step the model's size alone puts over ``ceiling`` (``step_memory_floor``) is not
    run: the Probe comes back ``skipped`` and ``over`` with that floor as its peak, in no time (a
    SmolLM2-135M probe at batch 32 took 14.4 min of a 30 min budget). ``deadline`` (``time.time()``
    seconds): past it the child is killed and the Probe comes back ``over_time`` (its times NaN).
    Raises ConfigError with the child's last lines when it fails otherwise (a point that cannot run)."""

    cfg = TrainConfig.from_flat(point.params)
    mb = cfg.optim.micro_batch if micro_batch is None else micro_batch
    flat = probe_params(point.params, mb)
    n_batch = int(flat["batch_size"])
    run = work / f"probe-mb{mb}"
    kept = _measured_before(run, flat, ceiling)
    if kept is not None:
        return kept
    floor = step_memory_floor(flat) if ceiling is not None else None
    if floor is not None and floor > ceiling:
        nan = float("nan")
        return Probe(setup_s=nan, step_s=nan, eval_row_s=nan, peak_rss=floor, batch_size=n_batch, micro_batch=mb,
                     over=True, skipped=True)
    pr = dataclasses.replace(_probe_child(point, run, flat, mb, n_batch, ceiling, deadline), n_latent=cfg.model.n_latent)
    if not pr.over_time:  # a probe stopped by its deadline says nothing about a longer one
        _keep_measured(run, flat, ceiling, pr)
    return pr


def kept_probe(point: Point, work: Path, micro_batch: int | None = None, ceiling: int | None = None) -> Probe | None:
    """What ``probe`` would return without running anything: the kept record of an earlier probe of
    the same config (``_measured_before``), None where there is none that answers."""
    mb = TrainConfig.from_flat(point.params).optim.micro_batch if micro_batch is None else micro_batch
    return _measured_before(work / f"probe-mb{mb}", probe_params(point.params, mb), ceiling)


#: what a probe's measurement is kept with (``_keep_measured``): a later probe of the same config on
#: the same machine and zfree within ``MEASURED_MAX_AGE_S`` reuses it (a study refused by its budget,
#: run again with a larger one, re-probes nothing)
MEASURED_MAX_AGE_S = 24 * 3600


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity where the system tells it, else the count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _machine() -> dict:
    """What a probe's times depend on beyond its config: host, cores, memory, zfree's version."""
    import platform

    import psutil

    import zfree

    return {"host": platform.node(), "cores": usable_cores(), "memory_bytes": psutil.virtual_memory().total,
            "zfree": zfree.__version__}


def _keep_measured(run: Path, flat: dict, ceiling: int | None, pr: Probe) -> None:
    """Write ``run``.measured.json: the probe's config, ceiling, machine, time and Probe (atomic)."""
    import dataclasses

    from zfree.core.io import atomic_write_json

    if pr.reused:
        return
    atomic_write_json(run.parent / f"{run.name}.measured.json", {
        "config": flat, "ceiling": ceiling, "machine": _machine(), "time": time.time(),
        "probe": dataclasses.asdict(pr)})


def _measured_before(run: Path, flat: dict, ceiling: int | None) -> Probe | None:
    """The Probe kept by an earlier probe of the same ``flat`` config in ``run``'s folder (same
    machine and zfree, at most ``MEASURED_MAX_AGE_S`` old) when it still answers for ``ceiling``: a
    finished probe whose peak is under it, or one stopped at a ceiling at least as high; None
    otherwise (an unreadable record too: it is measured again)."""
    f = run.parent / f"{run.name}.measured.json"
    try:
        rec = json.loads(f.read_text())
        if rec["config"] != json.loads(json.dumps(flat)) or rec["machine"] != _machine() \
                or time.time() - float(rec["time"]) > MEASURED_MAX_AGE_S:
            return None
        kept = Probe(**{**rec["probe"], **{k: float("nan") for k in ("setup_s", "step_s", "eval_row_s")
                                           if rec["probe"][k] is None}, "reused": True})
    except (OSError, ValueError, KeyError, TypeError):
        return None
    old = rec["ceiling"]
    if kept.over:
        fits = old is not None and (ceiling is None or ceiling <= old)
    else:
        fits = ceiling is None or kept.peak_rss <= ceiling
    return kept if fits else None


def _probe_child(point: Point, run: Path, flat: dict, mb: int, n_batch: int, ceiling: int | None,
                 deadline: float | None = None) -> Probe:
    """``probe``'s measurement: the child ``zfree train`` of ``flat`` in ``run``, its peak polled."""
    import shutil

    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    (run.parent / f"{run.name}.json").write_text(json.dumps(flat))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    t0, peak, stop, over, late = time.time(), [0], threading.Event(), threading.Event(), threading.Event()
    proc = _start_child([sys.executable, "-m", "zfree_lab.cli", "train", "--config",
                         str(run.parent / f"{run.name}.json"), "--out", str(run)], env)
    poller = threading.Thread(target=_poll_peak, args=(proc.pid, stop, peak, ceiling, over, deadline, late),
                              daemon=True)
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
        _LIVE.discard(proc.pid)
    wall = time.time() - t0
    if over.is_set() or late.is_set() or proc.returncode == -signal.SIGKILL:
        for ckpt in run.glob("checkpoint*"):
            shutil.rmtree(ckpt, ignore_errors=True)
        nan = float("nan")
        return Probe(setup_s=nan, step_s=nan, eval_row_s=nan, peak_rss=peak[0], batch_size=n_batch,
                     micro_batch=mb, wall_s=wall, over=not late.is_set(), over_time=late.is_set())
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
                 micro_batch=mb, wall_s=wall, samples_s=samples, decode_s=decode,
                 device_peak=int(summary.get("compute/device_peak_bytes") or 0),
                 device_total=int(summary.get("compute/device_total_bytes") or 0))


#: pids of the probes' ``zfree train`` children still running (``probe_side_by_side`` kills them on an
#: interrupt, which reaches the main thread, not the threads that wait on them)
_LIVE: set[int] = set()
#: guards ``_LIVE`` and the stop events: a probe thread starts its child only while its call is not stopping
_LIVE_LOCK = threading.Lock()
#: ``stop`` in a thread of ``probe_side_by_side``: the Event its call sets on an interrupt
_CALL = threading.local()


class ProbeStopped(RuntimeError):
    """A probe of an interrupted ``probe_side_by_side`` asked to start its child."""


def _start_child(cmd: list[str], env: dict) -> subprocess.Popen:
    """``cmd`` started and listed in ``_LIVE``, atomically with respect to ``_stop_children``."""
    stop = getattr(_CALL, "stop", None)
    with _LIVE_LOCK:
        if stop is not None and stop.is_set():
            raise ProbeStopped("the probes were interrupted")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        _LIVE.add(proc.pid)
    return proc


def _stop_children(stop: threading.Event) -> None:
    """No probe of ``stop``'s call starts a child from now on; every running probe child is killed."""
    with _LIVE_LOCK:
        stop.set()
        pids = list(_LIVE)
    for pid in pids:
        _kill_tree(pid)


def probe_side_by_side(jobs: list[tuple[Point, Path, int | None]], ceiling: int, deadline: float | None = None
                       ) -> list[Probe]:
    """``probe(point, work, micro_batch, ceiling)`` of each job at the same time, one thread (and one
    ``zfree train`` child of one torch thread) each: on a machine of as many cores the probes take
    the time of the longest instead of their sum, and their times are measured as the grid's runs
    will go, side by side. ``ceiling``: bytes each child may reach (the caller's share). Returns the
    Probes in the jobs' order; a probe's ConfigError is raised after the others finish.

    An interrupt (Ctrl-C, or SIGTERM raised as one by the CLI) reaches the main thread wherever it
    waits, even inside a thread's start: no child starts after it, every running child is killed,
    and every thread that began is joined (so each child has exited and been reaped) before the
    interrupt is raised again."""
    stop = threading.Event()
    results: list = [None] * len(jobs)
    done = [threading.Event() for _ in jobs]  # not join(): an interrupted join marks a running thread stopped

    def work(i: int, point: Point, where: Path, mb: int | None) -> None:
        _CALL.stop = stop
        try:
            results[i] = probe(point, where, mb, ceiling, deadline)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread, which raises it
            results[i] = e
        finally:
            done[i].set()

    threads: list[threading.Thread] = []
    try:
        for i, (point, where, mb) in enumerate(jobs):
            t = threading.Thread(target=work, args=(i, point, where, mb), name=f"zfree-probe-{i}", daemon=True)
            threads.append(t)  # listed before its start: a start the interrupt cuts short is waited for too
            t.start()
        for event in done:
            event.wait()
    except BaseException:
        _stop_children(stop)
        for t, event in zip(threads, done):
            if t.ident is not None:  # it runs (or ran): its child, if any, is killed and it ends soon
                event.wait()
        raise
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


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
