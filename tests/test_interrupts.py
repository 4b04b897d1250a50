"""Fault injection for issue 22 item 4 (interrupts and faults), one test (or more) per row; each
fails on the code before it (a traceback, a hang or a blocked resume) and checks the one line,
the exit status, the kept checkpoint and the released locks.

| case                                         | test                                                   |
|----------------------------------------------|--------------------------------------------------------|
| SIGINT / SIGTERM during `zfree train`        | test_signal_during_train_is_one_line_and_resumes       |
| an interrupt anywhere in `zfree study`       | test_interrupted_study_is_one_line                     |
| SIGINT to a sweep's main process, Ctrl-C to  | test_signal_during_sweep_stops_workers_and_kernels     |
| its process group, SIGTERM                   |                                                        |
| stopping a pool with a full call queue       | test_stop_workers_with_a_full_call_queue_returns       |
| disk full while checkpointing                | test_disk_full_checkpoint_is_one_line_and_error_json   |
| disk full appending to metrics.jsonl         | test_disk_full_metrics_append_is_one_line_and_error_json |
| a torn last line in metrics.jsonl            | test_torn_metrics_line_is_dropped_on_resume            |
| `zfree report`: no finished run              | test_report_without_a_finished_run_is_one_line         |
| `zfree report`: read-only folder             | test_report_on_a_read_only_folder_is_one_line          |
| a notebook pointed at a missing folder       | test_missing_sweep_dir_says_no_such_folder,            |
|                                              | test_explore_notebook_on_a_missing_folder_says_so      |
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.test_faults import _marked, _spec_base, one_error_line, snapshot, write_spec
from tests.tiny_sweep import tiny_base_flat
from zfree_lab.run.locks import run_folder_lock
from zfree_lab.cli import main

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}


def _zfree(*args, env=None, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "zfree_lab.cli", *map(str, args)], env=env or ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _wait_for(root: Path, pattern: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until ``root.glob(pattern)`` finds something; fails if ``proc`` ends first."""
    deadline = time.time() + timeout
    while not list(root.glob(pattern)):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() < deadline, f"{root / pattern} never appeared"
        time.sleep(0.1)


def _stderr_lines(err: str) -> list[str]:
    """The lines of stderr that are not progress bars or library warnings."""
    return [line for line in re.split(r"[\r\n]", err) if line.startswith("zfree: ")]


# SIGTERM goes through the very handler SIGINT does (zfree_lab.cli.interrupts): its end-to-end variants
# are in the slow tier, keeping the default tier within its 6 minutes
@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)],
                         ids=["SIGINT", "SIGTERM"])
@pytest.mark.timeout(180)
def test_signal_during_train_is_one_line_and_resumes(tiny_run, tmp_path, sig):
    data, base = tiny_run
    run, cfg = tmp_path / "run", tmp_path / "c.json"
    cfg.write_text(json.dumps(tiny_base_flat(data, base, steps=400, eval_every=400, checkpoint_every=2)))
    proc = _zfree("train", "--config", cfg, "--out", run)
    try:
        _wait_for(run, "checkpoint.prev", proc)  # a checkpoint of a step > 0 exists: training runs
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == CODES[sig], err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    (line,) = _stderr_lines(err)
    m = re.fullmatch(rf"zfree: interrupted at step (\d+) \(the checkpoint of step (\d+) is kept\); "
                     rf"resume with `zfree train --resume {re.escape(str(run))}` \({sig.name}\)", line)
    assert m and int(m[2]) <= int(m[1]) < 400, line
    assert not (run / "summary.json").exists() and (run / "checkpoint" / "COMPLETE").is_file()
    with run_folder_lock(run):  # released
        pass
    assert main(["train", "--resume", str(run)]) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 400


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
# Ctrl-C (SIGINT to the whole group, as a terminal sends it) in the default tier; SIGINT or SIGTERM to
# the main process alone (kill -INT / -TERM PID) in the slow tier: the same stop path
@pytest.mark.parametrize("sig, to", [pytest.param(signal.SIGINT, "pid", marks=pytest.mark.slow), (signal.SIGINT, "group"),
                                     pytest.param(signal.SIGTERM, "pid", marks=pytest.mark.slow)],
                         ids=["SIGINT-main", "ctrl-c-group", "SIGTERM-main"])
@pytest.mark.timeout(300)
def test_signal_during_sweep_stops_workers_and_kernels(tiny_run, tmp_path, sig, to):
    data, base = tiny_run
    spec = write_spec(tmp_path, {"name": "interrupted", "base": _spec_base(data, base, steps=5000, eval_every=2500),
                                 "grid": {"beta": [0.3, 1.0]}, "workers": 1})
    out, mark = tmp_path / "sweep", uuid.uuid4().hex
    proc = _zfree("sweep", spec, "--out", out, "--no-report", env={**ENV, "ZFREE_FAULT_MARK": mark},
                  start_new_session=True)
    try:
        _wait_for(out, "runs/*/checkpoint", proc, timeout=240)  # a kernel is training
        assert len(_marked(mark)) >= 3  # the sweep, its worker, the worker's kernel
        t0 = time.time()
        if to == "group":  # Ctrl-C in a terminal: the whole foreground process group
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        assert time.time() - t0 < 30, "the sweep did not stop promptly"
        assert proc.returncode == CODES[sig], err[-3000:]
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
        assert _stderr_lines(err) == [f"zfree: interrupted; rerun the same command: finished runs are kept "
                                      f"(interrupted ones resume from their last checkpoint) ({sig.name})"]
        deadline = time.time() + 30
        while _marked(mark) and time.time() < deadline:
            time.sleep(0.2)
        assert _marked(mark) == []  # workers and kernels stopped
        (run,) = [p.parent for p in out.glob("runs/*/checkpoint")]
        with run_folder_lock(out, "sweep folder"), run_folder_lock(out / "runs", "runs folder"), run_folder_lock(run):
            pass  # every lock released
        assert (run / "checkpoint" / "COMPLETE").is_file() and not (run / "error.json").exists()
    finally:
        proc.kill()
        for pid in _marked(mark):  # only processes this test started (they carry its mark)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


#: a pool of one worker running a point, with two more in its call queue (then full); the point
#: forks a child (a kernel, which the worker's stop sentinel outlives) that takes half a second to
#: exit on SIGTERM, so the pool's manager thread sees the worker's death only once
#: ``terminate_tree`` has waited for the worker (what a loaded machine does now and then)
_FULL_QUEUE_STOP = """
import multiprocessing, os, signal, sys, time
from zfree_lab.experiment.executor import local_executor, stop_workers

def point(started):
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, lambda *a: (time.sleep(0.5), os._exit(0)))
        open(started, "w").close()
        time.sleep(300)
        os._exit(0)
    time.sleep(300)

if __name__ == "__main__":
    ex = local_executor(1)
    futs = [ex.submit(point, sys.argv[1])]
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.05)
    futs += [ex.submit(point, sys.argv[1]) for _ in range(2)]  # a beta point and its control, queued
    while not futs[2].running():  # in the call queue, which is now full
        time.sleep(0.05)
    t0 = time.time()
    stop_workers(ex, futs)
    print(f"stopped in {time.time() - t0:.1f} s", [f.done() for f in futs], multiprocessing.active_children())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork and PR_SET_PDEATHSIG")
@pytest.mark.timeout(120)
def test_stop_workers_with_a_full_call_queue_returns(tmp_path):
    """The hang of a sweep interrupted with a control queued: psutil (``terminate_tree``) reaped
    the killed worker, multiprocessing then took it for alive for ever, and the pool's shutdown
    spun trying to put a stop sentinel into its full call queue."""
    proc = subprocess.Popen([sys.executable, "-c", _FULL_QUEUE_STOP, str(tmp_path / "started")], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("stop_workers hung with a full call queue")
    finally:
        with contextlib.suppress(ProcessLookupError):  # the script, its worker and the worker's child, if left
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0 and "Traceback" not in err, err[-3000:]
    m = re.fullmatch(r"stopped in ([\d.]+) s \[True, True, True\] \[\]\n", out)
    assert m and float(m[1]) < 10, out  # every point ended, the worker gone (and known to be)


def _full_on_call(n: int):
    """A stand-in for safetensors' save_model that writes the first ``n - 1`` calls and then
    raises ENOSPC, as a full disk does."""
    from safetensors.torch import save_model

    calls = []

    def save(model, filename, *a, **kw):
        calls.append(filename)
        if len(calls) >= n:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), filename)
        return save_model(model, filename, *a, **kw)

    return save


#: what safetensors says of a full disk: before 0.8 (Rust's Debug form), and from 0.8 on (issue 61: a traceback,
#: the one-line handler did not recognise it)
SAFETENSORS_ENOSPC = {
    "safetensor_error": 'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left '
                        'on device" })',
    "safetensor_error_0.8": "Error while serializing: I/O error: No space left on device (os error 28)"}


@pytest.mark.parametrize("how", ["oserror", *SAFETENSORS_ENOSPC])
def test_disk_full_checkpoint_is_one_line_and_error_json(tiny_run, tmp_path, capsys, monkeypatch, how):
    import safetensors

    import zfree_lab.run.run_folder as rf

    data, base = tiny_run
    run, cfg = tmp_path / "run", tmp_path / "c.json"
    cfg.write_text(json.dumps(tiny_base_flat(data, base, checkpoint_every=1)))
    save = _full_on_call(3)  # steps 0 and 1 checkpointed, step 2's hits the full disk
    if how in SAFETENSORS_ENOSPC:  # what safetensors raises itself: no OSError, no file named
        inner = save

        def save(model, filename, *a, **kw):  # noqa: F811
            try:
                return inner(model, filename, *a, **kw)
            except OSError:
                raise safetensors.SafetensorError(SAFETENSORS_ENOSPC[how]) from None
    import zfree_lab.run.checkpoint_parts as parts  # the model tensors are written there (issue 24)
    monkeypatch.setattr(parts, "save_model", save)
    assert main(["train", "--config", str(cfg), "--out", str(run)]) == 2
    line = one_error_line(capsys)
    assert f"cannot write the checkpoint of step 2 in {run} (No space left on device" in line, line
    assert "last good checkpoint is kept" in line and "--resume" in line and "error.json" in line
    err = json.loads((run / "error.json").read_text())
    assert err["step"] == 2 and err["errno"] == errno.ENOSPC
    assert not list(run.glob(".checkpoint.tmp-*")) and not (run / "summary.json").exists()
    from zfree_lab.run.checkpoint_io import load_plain_state, verify_checkpoint_dir

    verify_checkpoint_dir(run / "checkpoint")  # the last good one, complete
    assert load_plain_state(run / "checkpoint")["state"]["step"] == 1
    monkeypatch.undo()  # space freed: the run resumes from it and finishes
    assert main(["train", "--resume", str(run)]) == 0 and (run / "summary.json").exists()


def test_torn_metrics_line_is_dropped_on_resume(tiny_run, tmp_path):
    from zfree.config import TrainConfig
    from zfree_lab.run.run_folder import TIMING_KEYS
    from zfree_lab.run.training import train_cvae

    data, base = tiny_run
    cfg = TrainConfig.from_flat(tiny_base_flat(data, base, checkpoint_every=1))
    run, ref_run = tmp_path / "run", tmp_path / "ref"
    train_cvae(cfg, run, progress=False, stop_after=2)
    f = run / "metrics.jsonl"
    with open(f, "a") as fh:  # a process killed mid-append
        fh.write('{"step": 4, "loss/val/reconstruction_loss": 1.2, "task/corr')
    with pytest.warns(UserWarning, match=re.escape(str(f))):
        got = train_cvae(cfg, run, progress=False)
    want = train_cvae(cfg, ref_run, progress=False)
    assert {k: v for k, v in got.items() if k not in TIMING_KEYS} == {k: v for k, v in want.items() if k not in TIMING_KEYS}
    assert [json.loads(line)["step"] for line in f.read_text().splitlines()] == [0, 2, 4]


def test_torn_line_elsewhere_names_the_file_and_line(tmp_path):
    from zfree.core.errors import InputError
    from zfree.core.io import read_jsonl

    f = tmp_path / "metrics.jsonl"
    f.write_text('{"step": 0}\n{"step": 2, "lo\n{"step": 4}\n')
    with pytest.raises(InputError, match=re.escape(f"{f}:2: not a JSON line")):
        read_jsonl(f, drop_torn_tail=True)


def test_report_without_a_finished_run_is_one_line(tmp_path, capsys):
    err = tmp_path / "study" / "runs" / "plain_beta1_abcd" / "error.json"
    err.parent.mkdir(parents=True)
    err.write_text(json.dumps({"error": "FileNotFoundError: x"}))
    assert main(["report", str(tmp_path / "study")]) == 2
    line = one_error_line(capsys)
    assert "no finished run to report" in line and "1 failed" in line
    assert sorted(p.name for p in (tmp_path / "study").iterdir()) == ["runs"]  # nothing written


@pytest.fixture
def finished_sweep(tiny_run, tmp_path):
    from zfree.config import TrainConfig
    from zfree_lab.run.training import train_cvae

    data, base = tiny_run
    sweep = tmp_path / "sweep"
    train_cvae(TrainConfig.from_flat(tiny_base_flat(data, base, steps=2, eval_every=2)), sweep / "runs" / "one",
               progress=False)
    return sweep


def test_report_on_a_read_only_folder_is_one_line(finished_sweep, capsys, monkeypatch):
    import tempfile

    import zfree.core.io as io

    before = snapshot(finished_sweep)

    def read_only(*a, dir=None, **kw):  # as root, chmod does not stop a write: the file system's answer
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dir))

    monkeypatch.setattr(io.tempfile, "mkstemp", read_only)
    monkeypatch.setattr(io.tempfile, "mkdtemp", read_only)
    assert main(["report", str(finished_sweep)]) == 2
    line = one_error_line(capsys)
    assert f"cannot write in {finished_sweep.resolve()}" in line and "Read-only file system" in line, line
    assert snapshot(finished_sweep) == before
    monkeypatch.setattr(io.tempfile, "mkstemp", tempfile.mkstemp)
    if os.geteuid() != 0:  # a real read-only folder, where the permissions bind
        os.chmod(finished_sweep, 0o555)
        try:
            assert main(["report", str(finished_sweep)]) == 2
            assert "cannot write in" in one_error_line(capsys)
        finally:
            os.chmod(finished_sweep, 0o755)


# (explore's sweep_dir is None, chosen by choose_study: test_a_notebook_chooses_its_study_without_an_edit)
@pytest.mark.parametrize("notebook", ["study_report", "rate_distortion", "effective_beta", "rho_recon",
                                      "training_dynamics", "switch_on", "sweep_beta_vs_recon_weight",
                                      "labels_and_samples"])
def test_missing_sweep_dir_says_no_such_folder(tmp_path, notebook):
    """What each notebook's first code cell calls with its ``sweep_dir`` (the shipped default does
    not exist in a fresh clone): "no such folder", not an AttributeError deep in pandas."""
    from zfree_lab.experiment.results import collect_runs, load_sweep

    src = (Path(__file__).parents[1] / "notebooks" / f"{notebook}.py").read_text()
    (default,) = re.findall(r'^sweep_dir = "([^"]+)"', src, flags=re.M)
    missing = tmp_path / "nb" / default  # relative to a notebook folder with no runs/ beside it
    load = collect_runs if "collect_runs(Path(sweep_dir)" in src else load_sweep
    arg = Path(missing) / "runs" if load is collect_runs else missing
    with pytest.raises(FileNotFoundError, match=re.escape(f"no such folder: {missing.resolve()}")):
        load(arg)


def test_explore_notebook_on_a_missing_folder_says_so(tmp_path):
    """The shipped explore.ipynb, executed with its ``sweep_dir`` pointing nowhere (as in a fresh
    clone): the cell's error is "no such folder: ...", not pandas' AttributeError."""
    import papermill as pm

    from zfree.core.paths import NOTEBOOKS

    missing = tmp_path / "runs" / "study-default"
    with pytest.raises(pm.PapermillExecutionError) as e:
        pm.execute_notebook(str(NOTEBOOKS / "explore.ipynb"), str(tmp_path / "explore.ipynb"),
                            parameters={"sweep_dir": str(missing), "interactive": False}, kernel_name="python3",
                            progress_bar=False, cwd=str(tmp_path))
    assert e.value.ename == "NoStudyError" and f"no such folder: {missing}" in e.value.evalue
    assert "make smoke" in e.value.evalue  # the one-minute study, one command away
    out = json.loads((tmp_path / "explore.ipynb").read_text())
    tb = [o for c in out["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"][0]["traceback"]
    assert len(tb) == 1 and tb[0].startswith("NoStudyError: no such folder")  # one line, not a traceback


def test_a_notebook_chooses_its_study_without_an_edit(tmp_path, monkeypatch):
    """Issue 36 item 4-5: sweep_dir None opens $ZFREE_STUDY, else the most recently finished study under
    the repository's runs/; with none, one line offering the smoke study."""
    import os

    import zfree.core.paths as paths
    from zfree_lab.experiment.study_folders import NoStudyError, choose_study

    root = tmp_path / "repo"
    for name, when in (("study-old", 1_000_000), ("study-new", 2_000_000), ("empty", None)):
        (root / "runs" / name / "runs" / "r1").mkdir(parents=True)
        if when is not None:
            s = root / "runs" / name / "runs" / "r1" / "summary.json"
            s.write_text("{}")
            os.utime(s, (when, when))
    monkeypatch.setattr(paths, "ROOT", root)
    monkeypatch.delenv("ZFREE_STUDY", raising=False)
    assert choose_study(None) == root / "runs" / "study-new"
    monkeypatch.setenv("ZFREE_STUDY", str(root / "runs" / "study-old"))
    assert choose_study(None) == root / "runs" / "study-old" and choose_study(root / "runs" / "empty") == root / "runs" / "empty"
    monkeypatch.delenv("ZFREE_STUDY")
    monkeypatch.setattr(paths, "ROOT", tmp_path / "fresh clone")
    with pytest.raises(NoStudyError, match=r"no study found under .*fresh clone/runs: `make smoke` \(about a minute\)") as e:
        choose_study(None)
    assert e.value._render_traceback_() == [f"NoStudyError: {e.value}"] and isinstance(e.value, FileNotFoundError)


@pytest.mark.parametrize("raised, code", [(KeyboardInterrupt(), 130), ("SIGTERM", 143)], ids=["ctrl-c", "SIGTERM"])
def test_interrupted_study_is_one_line(tmp_path, capsys, monkeypatch, raised, code):
    """`zfree study` interrupted anywhere (here: in place of the whole study) says how to go on."""
    import zfree_lab.experiment.study as study
    from zfree.core.errors import Interrupted

    def interrupted(*a, **kw):
        raise Interrupted(signal.SIGTERM) if raised == "SIGTERM" else raised

    monkeypatch.setattr(study, "run_study", interrupted)
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)  # SIG_IGN in a background job
    assert main(["study", "--preset", "smoke", "--out", str(tmp_path)]) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err and _stderr_lines(err) == [
        "zfree: interrupted; rerun the same command: finished runs are kept (interrupted ones resume from their "
        f"last checkpoint) ({'SIGTERM' if code == 143 else 'SIGINT'})"]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before  # the handlers are restored


def test_disk_full_metrics_append_is_one_line_and_error_json(tiny_run, tmp_path, capsys, monkeypatch):
    import zfree_lab.run.run_folder as rf
    from zfree.core.io import append_jsonl

    data, base = tiny_run
    run, cfg = tmp_path / "run", tmp_path / "c.json"
    cfg.write_text(json.dumps(tiny_base_flat(data, base)))
    calls = []

    def full(path, row):  # the step-2 row finds the disk full
        calls.append(row["step"])
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        append_jsonl(path, row)

    monkeypatch.setattr(rf, "append_jsonl", full)
    assert main(["train", "--config", str(cfg), "--out", str(run)]) == 2
    line = one_error_line(capsys)
    assert "cannot write the metrics row of step 2" in line and "No space left on device" in line, line
    assert json.loads((run / "error.json").read_text())["step"] == 2
    monkeypatch.undo()
    assert main(["train", "--resume", str(run)]) == 0 and (run / "summary.json").exists()
