"""Running grid points: one papermill run of ``notebooks/train_cvae.ipynb`` per point
(``run_point``), on an executor (a local process pool, submitit, anything with ``submit`` and
``shutdown``), through one loop (``run_points``) that studies, sweeps and the launch panel share.

Each point runs into its own folder named by its stable id. A folder with ``summary.json`` and its
whole executed notebook is finished and skipped (never submitted: ``is_finished``), so a killed sweep
resumes; a point that fails leaves
``error.json`` and its executed notebook and does not stop the others. Local workers die with the process that started
them (``die_with_parent``), and their notebook kernels with them; cluster jobs (submitit, SLURM:
``zfree_lab.experiment.cluster``) are cancelled by the same stop (``stop_workers``).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
import traceback
from concurrent.futures import CancelledError, Future, ProcessPoolExecutor, as_completed
from contextlib import suppress
from pathlib import Path
from typing import Any, Callable, Protocol, runtime_checkable

from tqdm.auto import tqdm

from zfree.config import check_run_inputs
from zfree.core.io import atomic_write_json
from zfree_lab.run.locks import claim_folder, run_folder_lock
from zfree.core.paths import NOTEBOOKS, PATH_FIELDS, resolve_path
from zfree.core.progress import in_a_log, log_line
from zfree_lab.experiment.devices import cuda_devices, runs_at_once  # noqa: F401
from zfree_lab.experiment.memory_watch import KernelWatch, died_message
from zfree_lab.experiment.notebook_exec import execute, is_whole
from zfree_lab.experiment.spec import Point


#: the executed notebook a run folder holds (written whole or not at all: ``notebook_exec.execute``)
RUN_NOTEBOOK = "train_cvae.ipynb"
#: in a run folder while ``run_point`` executes its notebook (removed once the notebook is written): a
#: process killed in between (``kill -9`` just after training wrote summary.json) leaves it, and the
#: run is then not finished (``is_finished``): the next study executes its notebook again
RUNNING_MARK = ".notebook-running"
#: in a finished run's folder: the seconds its point took end to end (``run_point``: the kernel's start,
#: loading, the reference, training, the evaluations and the notebook's outputs), which summary.json's
#: ``wall_s`` (the trainer's own time) leaves partly out; ``zfree status`` reads its run time from it
RUN_TIME = "run_time.json"


def is_finished(run_dir: Path) -> bool:
    """A run is finished when its summary.json exists, no error.json says its notebook failed, no
    ``RUNNING_MARK`` says its notebook's execution never ended, and its executed notebook, if any,
    reads back whole (a run folder trained outside papermill, ``zfree train``, has none). A notebook
    torn by an earlier fault (e.g. a full disk), one that failed after training wrote summary.json (a
    figure cell), or a process killed between summary.json and the notebook makes the run run again:
    training then reuses the finished run folder and only the notebook is executed anew."""
    nb = run_dir / RUN_NOTEBOOK
    return ((run_dir / "summary.json").exists() and not (run_dir / "error.json").exists()
            and not os.path.lexists(run_dir / RUNNING_MARK) and (not nb.exists() or is_whole(nb)))


def _kernel_params(params: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """The notebook's parameters: the run folder and any relative or ``zfree:`` data/base folder made
    absolute (``zfree.core.paths.resolve_path`` against the run folder: the kernel starts elsewhere,
    ``notebook_exec``, and relative ones always meant the run folder, its former working directory)."""
    out = {**params, "out_dir": str(run_dir.resolve()), "progress": False}
    for key in PATH_FIELDS:
        v = out.get(key)
        if isinstance(v, str) and v and not Path(v).is_absolute():
            out[key] = resolve_path(v, run_dir)  # "zfree:<path>" under the repository, else under run_dir
    return out


def with_config_parameters(notebook: Path | str):
    """``notebook`` (train_cvae.ipynb) as a node whose parameters cell is generated from the config's
    declarations at use: its own lines, then every flat ``TrainConfig`` field it does not assign, at its
    declared default, so papermill knows each field a run passes (the committed cell names only a few:
    a new config field touches no notebook)."""
    from zfree.config import TrainConfig
    from zfree_lab.experiment.notebook_exec import import_nbformat

    nbformat = import_nbformat()  # lazy: as papermill

    nb = nbformat.read(str(notebook), as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    given = {line.split("=", 1)[0].strip() for line in cell.source.splitlines() if "=" in line and not line.startswith("#")}
    rest = [f"{k} = {v!r}" for k, v in TrainConfig().to_flat().items() if k not in given]
    cell.source = "\n".join([cell.source.rstrip(), *rest])
    return nb


def run_point(point: Point, runs_dir: str, notebook: str) -> dict[str, Any]:
    """Execute one point through papermill (kernel ``python3``, started outside the run folder, the
    executed notebook written whole: ``zfree_lab.experiment.notebook_exec.execute``); never raises.

    Returns ``{"run_id", "status": finished|skipped|failed, "error"?}``; a finished point writes
    ``RUN_TIME`` (its seconds end to end) into its folder.
    """
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # a fresh worker (submitit) inherits nothing
    run_dir = Path(runs_dir) / point.run_id
    if is_finished(run_dir):
        return {"run_id": point.run_id, "status": "skipped"}
    (run_dir / "error.json").unlink(missing_ok=True)
    watch, t0 = KernelWatch(), time.time()
    try:
        claim_folder(run_dir)  # zfree's own before the notebook is written there (train_cvae checks the folder)
        if os.environ.get("SUBMITIT_EXECUTOR"):  # a cluster job: its id and log in the run folder (job.json)
            from zfree_lab.experiment.cluster import record_job

            record_job(run_dir)
        params = _kernel_params(point.params, run_dir)
        if params.get("data_dir") and params.get("base_dir"):  # a missing folder fails now, not after a
            check_run_inputs(params["data_dir"], params["base_dir"])  # kernel's start (seconds): the same error
        atomic_write_json(run_dir / RUNNING_MARK, {"pid": os.getpid()})  # until the notebook is written
        with watch:  # the kernel's peak RSS, for the reason of a kernel killed for memory
            execute(with_config_parameters(notebook), run_dir / RUN_NOTEBOOK, parameters=params)
        atomic_write_json(run_dir / RUN_TIME, {"seconds": round(time.time() - t0, 3), "started": time.strftime(
            "%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0))})  # this execution's, a resumed run's included
        (run_dir / RUNNING_MARK).unlink()
        return {"run_id": point.run_id, "status": "finished"}
    except Exception as e:  # noqa: BLE001 - a failed point is recorded, the sweep goes on
        died = died_message(e, watch.peak)
        err = {"run_id": point.run_id, "error": died or f"{type(e).__name__}: {e}"[:20000],
               **({"peak_rss_bytes": watch.peak} if died else {}),
               "traceback": traceback.format_exc()[-8000:], "params": point.params}
        atomic_write_json(run_dir / "error.json", err)
        return {"run_id": point.run_id, "status": "failed", "error": err["error"]}


@runtime_checkable
class Executor(Protocol):
    """Anything that can ``submit(fn, *args) -> Future`` and ``shutdown()`` (concurrent.futures).
    Dask's ``distributed.Client.get_executor()`` fits as is."""

    def submit(self, fn: Callable, *args) -> Future:
        """Submit ``fn(*args)``; returns a Future of its result."""
        ...

    def shutdown(self, wait: bool = True) -> None:
        """Release the executor's resources (waiting for running jobs with ``wait``)."""
        ...


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent_pid: int) -> None:
    """Make this process receive SIGKILL when its parent dies (Linux ``PR_SET_PDEATHSIG``), and
    exit at once if the parent is already gone. Elsewhere a no-op. The notebook kernels that
    papermill starts poll their parent (ipykernel's ParentPollerUnix, via JPY_PARENT_PID) and
    exit within a second of the worker's death, so a killed sweep leaves no process behind."""
    if sys.platform.startswith("linux"):
        with suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _worker_init(parent_pid: int, slot=None, devices: tuple[str, ...] = ()):
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"
    if slot is not None and len(devices) > 1:  # worker i on device i mod n: its kernels see that one only
        with slot.get_lock():
            i, slot.value = slot.value, slot.value + 1
        os.environ["CUDA_VISIBLE_DEVICES"] = devices[i % len(devices)]
    # Ctrl-C reaches the whole foreground process group: the sweep's main process alone decides
    # (``stop_workers``), so a worker prints no KeyboardInterrupt/zmq traceback of its own
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the CLI's handler a forked worker inherits
    die_with_parent(parent_pid)


def local_executor(workers: int = 2) -> ProcessPoolExecutor:
    """A process pool with one torch thread per worker (two workers with two threads each made a
    training step 20x slower on a 2-core machine); the workers die with this process
    (``die_with_parent``). Workers are forked from the submitting thread, whose exit (not the
    process's) is what Linux's parent-death signal watches: submit from the main thread. With several
    CUDA devices, worker i runs on device i mod n (its ``CUDA_VISIBLE_DEVICES``: the papermill kernels
    it starts inherit it); with one, every worker shares it (``runs_at_once`` per device)."""
    import multiprocessing

    devices = tuple(cuda_devices())
    slot = multiprocessing.Value("i", 0) if len(devices) > 1 else None
    return ProcessPoolExecutor(max_workers=workers, initializer=_worker_init, initargs=(os.getpid(), slot, devices))


EXECUTORS = {"local": "a process pool on this machine", "submitit": "submitit (SLURM, local or debug)"}


def make_executor(kind: str = "local", workers: int = 2, folder: Path | str | None = None, **options) -> Executor:
    """``local``: ``local_executor(workers)``; ``submitit``: ``zfree_lab.experiment.cluster.SubmititExecutor(folder,
    **options)``.
    Raises ValueError for an unknown kind (listing the valid ones) or submitit without a folder."""
    if kind not in EXECUTORS:
        raise ValueError(f"executor={kind!r} is not one of {sorted(EXECUTORS)}")
    if kind == "local":
        return local_executor(workers)
    if folder is None:
        raise ValueError("executor 'submitit' needs a folder for its job logs")
    from zfree_lab.experiment.cluster import SubmititExecutor  # lazy: submitit

    return SubmititExecutor(folder, **options)


def run_points(points: list[Point], runs_dir: Path | str, *, workers: int = 2, executor: Executor | None = None,
               notebook: Path | str | None = None, progress: bool = True,
               on_done: Callable[[dict], None] | None = None, run_fn: Callable[[Point, str, str], dict] = run_point,
               on_submit: Callable[[list[Future]], None] | None = None,
               stopping: threading.Event | None = None) -> list[dict]:
    """Run every point (finished ones are skipped) and return their statuses in input order: the
    one executor loop of studies, sweeps and the launch panel (``zfree_lab.report.widgets``).

    ``executor``: where to run (default: ``local_executor(workers)``, shut down at the end; a given
    one is left open). ``run_fn(point, runs_dir, notebook)``: what runs a point (``run_point``).
    ``on_submit(futures)``: called once every point is submitted (a caller that may cancel them);
    ``on_done(status)``: after each point. A finished point (``is_finished``) is ``skipped`` without
    being submitted (no cluster job for it). A cancelled future's status is ``cancelled``; a future
    that raised is ``failed``, or ``stopped`` once ``stopping`` is set. An interrupt stops the
    executor (``stop_workers``) and re-raises, its ``stopped`` attribute saying what was cancelled.
    Holds the lock of ``runs_dir`` meanwhile: a second sweep or study on it raises ``LockHeldError``
    naming this process."""
    runs_dir = Path(runs_dir).resolve()
    with run_folder_lock(runs_dir, "runs folder"):  # one sweep/study writes these run folders
        nb = str(Path(notebook or NOTEBOOKS / "train_cvae.ipynb").resolve())
        done = {p.run_id: _skipped(p, on_done) for p in points if is_finished(runs_dir / p.run_id)}
        todo = [p for p in points if p.run_id not in done]
        ex = executor or local_executor(workers)
        futs: list[Future] = []
        try:
            for p in todo:
                futs.append(ex.submit(run_fn, p, str(runs_dir), nb))
            if on_submit:
                on_submit(futs)
            statuses = _collect(futs, todo, progress=progress, on_done=on_done, stopping=stopping,
                                skipped=len(points) - len(todo))
        except KeyboardInterrupt as e:  # Ctrl-C, SIGINT, SIGTERM: end the running points now, keep the finished ones
            e.stopped = stop_workers(ex, futs)  # zfree_lab.cli's interrupt line says it
            raise
        finally:
            if executor is None:
                ex.shutdown()
        by_id = {**done, **{s["run_id"]: s for s in statuses}}
        return [by_id[p.run_id] for p in points]


def _skipped(point: Point, on_done: Callable[[dict], None] | None) -> dict:
    """The status of a point finished before this sweep (``on_done`` told)."""
    status = {"run_id": point.run_id, "status": "skipped"}
    if on_done:
        on_done(status)
    return status


def terminate_tree(pid: int, timeout: float = 10.0, *, join: Callable[[float], Any] | None = None) -> None:
    """End worker ``pid`` and its descendants (papermill's kernel, which runs in a session of its
    own): the worker is killed first (it holds no lock and has nothing to write, and so never
    reports its kernel's death), the kernels get SIGTERM, and whatever is left after ``timeout``
    seconds SIGKILL.

    ``join(timeout)``: how the worker's owner waits for (and reaps) it, e.g. a process pool
    worker's ``multiprocessing.Process.join``. Given, psutil waits for the descendants only: had it
    reaped the worker, ``multiprocessing`` would find no child to wait for, take the worker for
    alive for ever (``Popen.poll`` answers None on ECHILD), and a pool shutting down with a full
    call queue would spin in CPython's ``shutdown_workers``, unable to put the worker's stop
    sentinel (a sweep that hung after Ctrl-C with two points queued behind the running one)."""
    import psutil  # lazy: only a stop needs it

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        with suppress(psutil.NoSuchProcess):
            p.kill() if p is root else p.terminate()
    _, alive = psutil.wait_procs(procs if join is None else procs[1:], timeout=timeout)
    for p in alive:
        with suppress(psutil.NoSuchProcess):
            p.kill()
    if join is not None:
        join(timeout)


def stop_workers(ex: Executor, futures: list[Future] = ()) -> str | None:
    """Cancel the points not yet started and end the running ones: the one stop of studies, sweeps
    and the launch panel. A local process pool's workers and their notebook kernels are terminated
    (each run folder keeps its last checkpoint, and the kernel's lock on it is released with the
    process); the pool is shut down without waiting. An executor with a ``stop()`` of its own
    (``zfree_lab.experiment.cluster.SubmititExecutor``: ``scancel`` of its queued and running jobs) is
    stopped by it. Returns one line saying what was cancelled, or None."""
    if callable(getattr(ex, "stop", None)):
        note = ex.stop()
        for f in futures:
            f.cancel()
        return note
    # the futures are cancelled only after the pool is down: CPython 3.11's pool marks every pending
    # work item broken once its workers die and raises InvalidStateError (a traceback from its
    # manager thread) on one already cancelled; the points not started end as "stopped" instead
    local = isinstance(ex, ProcessPoolExecutor)
    if not local:
        for f in futures:
            f.cancel()
    for proc in list((getattr(ex, "_processes", None) or {}).values()):
        # a pool's worker is reaped by its multiprocessing handle, never by psutil (terminate_tree)
        terminate_tree(proc.pid, join=getattr(proc, "join", None))
    if local:
        ex.shutdown(wait=True, cancel_futures=True)  # the workers are gone: returns at once
        for f in futures:
            f.cancel()
    return None


def _collect(futs: list[Future], points: list[Point], *, progress: bool, on_done, stopping,
             skipped: int = 0) -> list[dict]:
    """The statuses of ``futs`` in input order, as they complete (module ``run_points``); the bar
    counts the ``skipped`` points finished before as done."""
    results: list[dict | None] = [None] * len(points)
    index = {id(f): i for i, f in enumerate(futs)}
    total, done = len(points) + skipped, skipped
    # a log (nohup, SLURM, CI) gets one line per finished run; a terminal the bar, a notebook its widget bar
    lines = in_a_log(progress)
    with tqdm(total=total, initial=skipped, desc="runs", disable=not progress or lines) as bar:
        for f in as_completed(futs):
            i = index[id(f)]
            try:
                r = f.result()
            except CancelledError:
                r = {"run_id": points[i].run_id, "status": "cancelled"}
            except Exception as e:  # noqa: BLE001 - e.g. a cluster job killed before run_point could record it
                stopped = stopping is not None and stopping.is_set()  # a worker ended by stop
                r = {"run_id": points[i].run_id, "status": "stopped" if stopped else "failed",
                     "error": f"{type(e).__name__}: {e}"[:1000],
                     **({"log": e.log} if getattr(e, "log", None) else {})}  # a cluster job's log (cluster.JobFailed)
            results[i] = r
            bar.update(1)
            bar.set_postfix_str(f"{r['run_id']}: {r['status']}")
            done += 1
            if lines:
                log_line(f"runs: {done} of {total} done", f"{r['run_id']}: {r['status']}")
            if on_done:
                on_done(r)
    return [r for r in results if r is not None]


def print_failures(statuses: list[dict], runs_dir: Path) -> list[dict]:
    """Print one ``FAILED <run_id>: <error>  (see <error.json>[, log <job log>])`` line per failed
    point (the log of a cluster job, ``zfree_lab.experiment.cluster``); returns them."""
    failed = [s for s in statuses if s["status"] == "failed"]
    for f in failed:
        log = f", log {f['log']}" if f.get("log") else ""
        print(f"  FAILED {f['run_id']}: {f['error']}  (see {runs_dir / f['run_id'] / 'error.json'}{log})")
    return failed
