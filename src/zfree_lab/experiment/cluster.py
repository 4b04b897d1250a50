"""submitit (SLURM, or its local/debug executors for tests) behind the Executor protocol of
``zfree_lab.experiment.executor``: one Future per job, completed by one poller thread; ``stop`` cancels
every job not yet finished (one ``scancel`` on SLURM) and settles its Future at once, so an
interrupted sweep neither waits for its jobs nor leaves them running.

Job states on SLURM are read with ``squeue`` (``SqueueWatcher``), the way submitit lets a job class
bring its own watcher: submitit's own watcher calls ``sacct``, which needs the accounting database
(slurmdbd); on a cluster without it every poll logged "Bypassing sacct error ... status may be
inaccurate". squeue lists a job from its submission until ``MinJobAge`` (300 s by default) after its
end; a job no longer listed has ended, and its result file (or its absence) tells how.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from concurrent.futures import Future, InvalidStateError
from contextlib import suppress
from pathlib import Path
from typing import Any, Callable

import submitit
from submitit.slurm.slurm import SlurmInfoWatcher, SlurmJob

from zfree.core.errors import ConfigError
from zfree.core.io import atomic_write_json, read_json

#: squeue states of a job that has not ended -> the submitit state that means "not done"
#: (submitit's incomplete set lacks CONFIGURING, SUSPENDED, ...: it would take those for done)
_ACTIVE = {"PENDING": "PENDING", "CONFIGURING": "PENDING", "REQUEUE_HOLD": "PENDING", "REQUEUE_FED": "PENDING",
           "RESV_DEL_HOLD": "PENDING", "REQUEUED": "REQUEUED", "RUNNING": "RUNNING", "COMPLETING": "COMPLETING",
           "SUSPENDED": "RUNNING", "STOPPED": "RUNNING", "SIGNALING": "RUNNING", "STAGE_OUT": "COMPLETING",
           "RESIZING": "RUNNING"}
#: the state given to a job squeue no longer lists (ended more than MinJobAge ago)
ENDED_UNLISTED = "ENDED (no longer listed by squeue)"


class SqueueWatcher(SlurmInfoWatcher):
    """submitit's job-state watcher reading ``squeue --me --states=all`` instead of ``sacct``
    (module docstring). One call per refresh for every job of this user; states of jobs this
    process did not submit are ignored."""

    def _make_command(self) -> list[str] | None:
        if not self._registered - self._finished:
            return None
        return ["squeue", "--me", "--noheader", "--states=all", "--format=%i|%T|%N"]

    def read_info(self, string: bytes | str) -> dict[str, dict[str, str]]:
        """``{job_id: {"JobID", "State", "NodeList", "SqueueState"}}`` for every job this watcher
        registered: listed ones with their state (active ones as submitit's names), the others
        ``ENDED_UNLISTED``."""
        text = string.decode() if isinstance(string, bytes) else string
        listed = {}
        for line in text.splitlines():
            parts = line.strip().split("|")
            if len(parts) == 3 and parts[0]:
                job_id, state, nodes = parts
                listed[job_id] = {"JobID": job_id, "State": _ACTIVE.get(state, state), "NodeList": nodes,
                                  "SqueueState": state}
        return {j: listed.get(j, {"JobID": j, "State": ENDED_UNLISTED, "NodeList": "", "SqueueState": ""})
                for j in self._registered - self._finished}


class SqueueSlurmJob(SlurmJob):
    """A submitit SLURM job whose state comes from ``SqueueWatcher``."""

    watcher = SqueueWatcher(delay_s=60)


#: a job record in a run folder (``record_job``)
JOB_FILE = "job.json"


def record_job(run_dir: Path) -> dict[str, Any] | None:
    """Inside a submitit job: write ``run_dir/job.json`` (cluster, job id, host, the job's stdout and
    stderr logs; earlier attempts' ids under ``attempts``) and return it; elsewhere None. A record
    that cannot be written (an unreadable old one, an environment submitit did not set up) is a
    printed note, never the run's failure."""
    if not os.environ.get("SUBMITIT_EXECUTOR"):
        return None
    f = run_dir / JOB_FILE
    try:
        env = submitit.JobEnvironment()
        before = read_json(f) if f.exists() else {}
        rec = {"cluster": env.cluster, "job_id": str(env.job_id), "host": socket.gethostname(),
               "stdout": str(env.paths.stdout), "stderr": str(env.paths.stderr),
               "attempts": [*before.get("attempts", []), *([before["job_id"]] if "job_id" in before else [])]}
        atomic_write_json(f, rec)
    except (OSError, KeyError, ValueError, RuntimeError) as e:
        print(f"note: {f} not written ({type(e).__name__}: {e})", flush=True)
        return None
    return rec


class JobFailed(RuntimeError):
    """A cluster job ended without the result of its point (killed, cancelled, out of time or
    memory); the message names the job and its log, ``log`` is the log's path."""

    def __init__(self, message: str, log: str):
        super().__init__(message)
        self.log = log


class SubmititExecutor:
    """submitit behind the Executor protocol (module docstring).

    ``cluster``: None (auto: SLURM if available, else local), "slurm", "local" (one subprocess per
    job) or "debug" (in-process). Other options go to ``update_parameters`` (timeout_min,
    slurm_partition, cpus_per_task, ...). Job logs live in ``folder``. ``poll_s``: seconds between
    two looks at the unfinished jobs (each look reads the result files; squeue is asked at most
    once a minute, and sooner just after a submission).
    """

    def __init__(self, folder: Path | str, cluster: str | None = None, poll_s: float = 1.0, **options):
        self._ex = submitit.AutoExecutor(folder=str(folder), cluster=cluster)
        opts = {"timeout_min": 60, "cpus_per_task": 1, **options}
        if self._ex.cluster == "debug":
            opts = {k: v for k, v in opts.items() if k == "timeout_min"}
        self._ex.update_parameters(**opts)
        if self._ex.cluster == "slurm":
            self._ex._executor.job_class = SqueueSlurmJob  # the job class SlurmExecutor instantiates
        self.cluster, self.poll_s = self._ex.cluster, poll_s
        self._jobs: list[tuple[Any, Future]] = []
        self._lock, self._closed = threading.Lock(), threading.Event()
        self._poller: threading.Thread | None = None

    def submit(self, fn: Callable, *args) -> Future:
        """Submit ``fn(*args)`` as a job; returns a Future of its result (a dict result gains the
        job's ``job_id`` and ``log``, its stderr file). The Future stays pending until the job ends,
        so ``stop`` can cancel it."""
        job = self._ex.submit(fn, *args)
        fut: Future = Future()
        if self.cluster == "debug":  # debug jobs run in-process on result(): one at a time
            self._settle(job, fut)
            return fut
        with self._lock:
            self._jobs.append((job, fut))
            if self._poller is None:
                self._poller = threading.Thread(target=self._poll, name="submitit-poller", daemon=True)
                self._poller.start()
        return fut

    def _poll(self) -> None:
        """The poller thread: settle the Future of every job that is done, until closed."""
        while not self._closed.is_set():
            with self._lock:
                pending = [(j, f) for j, f in self._jobs if not f.done()]
            for job, fut in pending:
                if not self._closed.is_set() and job.done():
                    self._settle(job, fut)
            self._closed.wait(self.poll_s)

    def _log(self, job) -> str:
        return str(job.paths.stderr)

    def _settle(self, job, fut: Future) -> None:
        """Complete ``fut`` with the job's result (a dict gains ``job_id`` and ``log``), or with a
        ``JobFailed`` naming the job and its log; a Future already cancelled by ``stop`` stays so."""
        try:
            r = job.result()
            if isinstance(r, dict):
                r = {**r, "job_id": str(job.job_id), "log": self._log(job)}
        except Exception as e:  # noqa: BLE001 - the job's own failure, reported by the sweep
            lines = [ln.strip() for ln in str(e).splitlines() if ln.strip().strip("-")]
            why = " ".join(lines[:2]) or type(e).__name__  # submitit's: "Job N ... (state: TIMEOUT)"
            err = JobFailed(f"{self._kind()} job {job.job_id} (log {self._log(job)}) ended without a result: "
                            f"{why[:300]}", self._log(job))
            with suppress(InvalidStateError):
                fut.set_exception(err)
            return
        with suppress(InvalidStateError):
            fut.set_result(r)

    def _kind(self) -> str:
        return "SLURM" if self.cluster == "slurm" else f"submitit {self.cluster}"

    def stop(self) -> str | None:
        """Cancel every job not yet finished (queued or running: one ``scancel`` on SLURM; submitit's
        ``cancel`` elsewhere) and cancel its Future; the poller ends. Returns one line saying what
        was cancelled (None when nothing was)."""
        self._closed.set()
        with self._lock:
            pending = [(j, f) for j, f in self._jobs if not f.done()]
        for _, fut in pending:
            fut.cancel()
        ids = [str(j.job_id) for j, _ in pending]
        if not ids:
            return None
        if self.cluster == "slurm":
            r = subprocess.run(["scancel", *ids], capture_output=True, text=True)
            if r.returncode != 0 and r.stderr.strip():
                return f"scancel {' '.join(ids)} failed: {r.stderr.strip().splitlines()[-1]}"
        else:
            for job, _ in pending:
                job.cancel(check=False)
        return f"cancelled {len(ids)} {self._kind()} job(s) queued or running ({_id_list(ids)})"

    def shutdown(self, wait: bool = True) -> None:
        """With ``wait``, block until every job has ended (after ``stop``: returns at once); then
        end the poller."""
        if wait:
            with self._lock:
                futs = [f for _, f in self._jobs]
            for f in futs:
                with suppress(BaseException):  # CancelledError; waiting only
                    f.exception()  # waits; a cancelled Future raises CancelledError at once
        self._closed.set()


def _id_list(ids: list[str], show: int = 8) -> str:
    """``scancel 12 13 14`` (at most ``show`` ids, then ``... (+N more)``)."""
    more = f" ... (+{len(ids) - show} more)" if len(ids) > show else ""
    return "scancel " + " ".join(ids[:show]) + more


def sbatch_script(folder: Path | str, options: dict[str, Any], command: str = "true") -> str:
    """The sbatch script submitit writes for a job of a spec's ``executor_options`` (``cluster``
    aside): its ``#SBATCH`` lines, then ``command``. Raises what submitit raises for an unknown
    option (naming the valid ones) and ConfigError where no ``srun`` exists (no SLURM here)."""
    try:
        ex = submitit.AutoExecutor(folder=str(folder), cluster="slurm")
    except RuntimeError as e:
        raise ConfigError(f"no SLURM on this machine to check the options with ({e})") from None
    ex.update_parameters(**{k: v for k, v in options.items() if k != "cluster"})
    return ex._executor._make_submission_file_text(command, "check")


def sbatch_test_only(script: str, folder: Path | str) -> subprocess.CompletedProcess:
    """``sbatch --test-only`` of ``script`` (written to ``folder/check.sbatch``): the scheduler
    validates every option and says when and where the job would start, submitting nothing.
    Returns the finished process (returncode 0: accepted; stderr: the scheduler's answer)."""
    f = Path(folder) / "check.sbatch"
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(script)
    return subprocess.run(["sbatch", "--test-only", str(f)], capture_output=True, text=True, timeout=60)

