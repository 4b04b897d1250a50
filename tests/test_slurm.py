"""Sweeps on a real one-node SLURM through submitit (slow tier; ``make test-slurm``, and ``.ci/run``
after the default tier). The cluster is the one ``etc/slurm/start-local-slurm.sh`` starts; one
already answering with an idle ``debug`` partition is used as it is.

* a sweep finishes every run on SLURM (job.json in each run folder, its log beside the others in
  ``submitit/``), renders its report, prints no sacct warning (job states come from squeue);
* a point failing inside its job exits 1 naming the job's SLURM log; a rerun reuses the finished run
  (no job submitted for it) and retries the failed one;
* SIGINT to ``zfree sweep`` cancels its queued and running jobs (squeue shows none left), says so on
  its one interrupt line, and a rerun resumes the interrupted runs from their checkpoints;
* the shipped SLURM specs (slurm_gpu.yaml among them) pass the scheduler's own checks of their
  options (``sbatch --test-only``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_faults import _spec_base, write_spec
from zfree.core.paths import ROOT, SPECS
from zfree_lab.experiment.cluster import sbatch_script, sbatch_test_only
from zfree_lab.experiment.sweeps import load_spec

pytestmark = pytest.mark.slow

START = ROOT / "etc" / "slurm" / "start-local-slurm.sh"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
#: one CPU per job: on a 2-CPU node two jobs run and a third waits in the queue
OPTIONS = {"cluster": "slurm", "slurm_partition": "debug", "cpus_per_task": 1, "mem_gb": 2, "timeout_min": 20}
NOISE = ("Bypassing sacct error", "submitit WARNING")


def _idle_debug_partition() -> bool | None:
    """True: a controller answers with an idle (or partly used) node in partition ``debug``;
    False: a controller answers without one; None: no controller answers (or no sinfo)."""
    if not shutil.which("sinfo"):
        return None
    r = subprocess.run(["sinfo", "-h", "-p", "debug", "-o", "%t"], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        return None
    return any(s.strip().rstrip("*~#$@").startswith(("idle", "mix", "alloc")) for s in r.stdout.split())


@pytest.fixture(scope="module")
def slurm():
    """A one-node SLURM with an idle ``debug`` partition: the running one, else started by
    ``etc/slurm/start-local-slurm.sh`` (root); skipped, with the reason, where it cannot be."""
    up = _idle_debug_partition()
    if up is False:
        pytest.skip("a SLURM controller answers but has no usable partition 'debug' (not this test's cluster)")
    if up is None:
        if os.geteuid() != 0:
            pytest.skip(f"no SLURM answers and starting one needs root: sudo {START} (or `make slurm`)")
        missing = [c for c in ("slurmctld", "slurmd", "munged", "sbatch", "squeue", "scancel")
                   if not (shutil.which(c) or Path("/usr/sbin", c).exists())]
        if missing:
            pytest.skip(f"SLURM packages missing ({', '.join(missing)}): `make slurm` installs them (Debian)")
        r = subprocess.run([str(START)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
    assert shutil.which("squeue") and shutil.which("scancel")


def _zfree(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "zfree_lab.cli", *map(str, args)], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _sweep(*args, timeout: float = 600) -> tuple[int, str, str]:
    proc = _zfree("sweep", *args)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    return proc.returncode, out, err


def _squeue(ids: list[str]) -> dict[str, str]:
    """job id -> state, for the ``ids`` squeue still lists."""
    r = subprocess.run(["squeue", "--me", "-h", "--states=all", "-o", "%i|%T"], capture_output=True, text=True,
                       check=True)
    return {i: s for i, s in (ln.split("|") for ln in r.stdout.split()) if i in ids}


def _logs(out: Path) -> set[str]:
    return {p.name for p in (out / "submitit").glob("*_log.out")}


@pytest.mark.timeout(900)
def test_sweep_runs_on_slurm_fails_with_its_log_and_reruns_reusing_finished_runs(slurm, tiny_run, tmp_path):
    data, base = tiny_run
    bad = tmp_path / "bad_base"
    (bad / "model").mkdir(parents=True)  # exists (the spec validates), but holds no model: fails in its job
    spec = write_spec(tmp_path, {"name": "on_slurm", "base": _spec_base(data, base),
                                 "grid": {"base_dir": [str(base), str(bad)]}, "controls": False,
                                 "executor": "submitit", "executor_options": OPTIONS})
    out = tmp_path / "sweep"
    code, stdout, stderr = _sweep(spec, "--out", out)
    assert code == 1, stderr[-3000:]
    assert not [n for n in NOISE if n in stdout + stderr], (stdout + stderr)[-3000:]
    (good,) = [p.parent for p in out.glob("runs/*/summary.json")]
    (failed,) = [p.parent for p in out.glob("runs/*/error.json")]
    jobs = {r.name: json.loads((r / "job.json").read_text()) for r in (good, failed)}
    assert {j["cluster"] for j in jobs.values()} == {"slurm"} and len({j["job_id"] for j in jobs.values()}) == 2
    assert all(Path(j["stdout"]).is_file() and Path(j["stdout"]).parent == out / "submitit" for j in jobs.values())
    states = _squeue([j["job_id"] for j in jobs.values()])  # kept for MinJobAge (300 s) after the end
    assert states.get(jobs[good.name]["job_id"], "COMPLETED") == "COMPLETED", states
    log = jobs[failed.name]["stderr"]
    assert f"FAILED {failed.name}: " in stderr and f"job log {log}" in stderr, stderr[-3000:]
    assert Path(log).is_file()
    assert (out / "report.html").is_file() and "; 1 of 2 failed (above); report: " in stdout and "runs ok" not in stdout

    summary, logs = (good / "summary.json").stat().st_mtime_ns, _logs(out)
    code, stdout, stderr = _sweep(spec, "--out", out, "--no-report")  # the same sweep again
    assert code == 1 and f"FAILED {failed.name}: " in stderr, stderr[-3000:]
    assert (good / "summary.json").stat().st_mtime_ns == summary  # reused, not rerun
    assert json.loads((good / "job.json").read_text()) == jobs[good.name]  # and no job submitted for it
    (new,) = _logs(out) - logs  # the failed point's new job only
    retried = json.loads((failed / "job.json").read_text())
    assert new.startswith(f"{retried['job_id']}_") and retried["attempts"] == [jobs[failed.name]["job_id"]]


def _wait_for_second_checkpoint(out: Path, proc: subprocess.Popen, timeout: float = 300) -> Path:
    """The first run folder holding checkpoint.prev/ (a checkpoint after step 0: training runs)."""
    deadline = time.time() + timeout
    while not (found := list(out.glob("runs/*/checkpoint.prev"))):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() < deadline, "no run wrote a second checkpoint"
        time.sleep(0.5)
    return found[0].parent


@pytest.mark.timeout(1200)
def test_sigint_cancels_the_sweeps_slurm_jobs_and_a_rerun_resumes(slurm, tiny_run, tmp_path):
    data, base = tiny_run
    flat = _spec_base(data, base, steps=STEPS, eval_every=STEPS // 4)
    spec = write_spec(tmp_path, {"name": "stopped", "base": flat, "grid": {"beta": [0.3, 1.0, 3.0]},
                                 "controls": False, "executor": "submitit", "executor_options": OPTIONS})
    out = tmp_path / "sweep"
    proc = _zfree("sweep", spec, "--out", out, "--no-report")
    try:
        run = _wait_for_second_checkpoint(out, proc)  # two jobs train, the third waits for a CPU
        t0 = time.time()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert time.time() - t0 < 30, "the sweep did not stop promptly"
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert not [n for n in NOISE if n in err], err[-3000:]
    (line,) = [ln for ln in re.split(r"[\r\n]", err) if ln.startswith("zfree: ")]
    m = re.fullmatch(r"zfree: interrupted; cancelled 3 SLURM job\(s\) queued or running \(scancel ([\d ]+)\); "
                     r"rerun the same command: .* \(SIGINT\)", line)
    assert m, line
    ids = m[1].split()
    deadline = time.time() + 60  # SIGTERM, then SIGKILL after KillWait (5 s in start-local-slurm.sh)
    while {s for s in _squeue(ids).values() if s != "CANCELLED"} and time.time() < deadline:
        time.sleep(1)
    assert set(_squeue(ids).values()) <= {"CANCELLED"}, _squeue(ids)
    assert not list(out.glob("runs/*/summary.json"))
    from zfree_lab.run.checkpoint_io import load_plain_state

    step = load_plain_state(run / "checkpoint")["state"]["step"]  # the TrainState's step (checkpoint.save_checkpoint)
    assert 0 < step < STEPS
    kept = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["step"] <= step]

    code, stdout, stderr = _sweep(spec, "--out", out, "--no-report", timeout=900)
    assert code == 0, stderr[-3000:]
    assert len(list(out.glob("runs/*/summary.json"))) == 3
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[:len(kept)] == kept  # resumed from its checkpoint: the evaluations before it kept as written
    assert json.loads((run / "job.json").read_text())["attempts"][-1] in ids  # its cancelled job, then a new one


#: a spec's cluster-specific amounts mapped onto the one-node test cluster (its partition, CPUs and
#: memory); every other option, the GPU request included, goes to the scheduler as written
LOCAL_AMOUNTS = {"slurm_partition": "debug", "cpus_per_task": 1, "mem_gb": 1}
SLURM_SPECS = [p for p in sorted(SPECS.glob("*.yaml"))
               if load_spec(p, check_paths=False).executor_options.get("cluster") == "slurm"]


@pytest.mark.parametrize("path", SLURM_SPECS, ids=lambda p: p.stem)
def test_shipped_slurm_specs_pass_the_schedulers_checks(slurm, path, tmp_path):
    """The sbatch script submitit writes for a shipped spec (slurm_gpu.yaml: one GPU per run) is
    accepted by the real scheduler (``sbatch --test-only``: nothing is submitted), its amounts mapped
    onto this node (``LOCAL_AMOUNTS``); a misspelt value of the same script is refused."""
    opts = load_spec(path, check_paths=False).executor_options
    local = {**opts, **{k: v for k, v in LOCAL_AMOUNTS.items() if k in opts}}
    script = sbatch_script(tmp_path, local)
    assert "#SBATCH --partition=debug" in script
    assert ("#SBATCH --gpus-per-node=1" in script) == ("gpus_per_node" in opts), script
    r = sbatch_test_only(script, tmp_path)
    assert r.returncode == 0 and "to start at" in r.stderr, r.stderr
    bad = sbatch_test_only(re.sub(r"#SBATCH --time=\d+", "#SBATCH --time=2hours", script), tmp_path)
    assert bad.returncode != 0 and "time" in bad.stderr.lower(), bad.stderr


#: steps of the interrupted sweep's runs: long enough to interrupt after a checkpoint, short enough
#: for the rerun to finish them
STEPS = 400
