"""``zfree status STUDY`` (``zfree_lab.experiment.study_status``): how far a study folder has got, from the
folder alone — finished, running, failed and waiting runs, the base's fine-tune from its real checkpoint,
and the time left — and a one-line exit 2 for a folder that is no study."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from zfree.core.io import atomic_write_json
from zfree_lab.cli import main
from zfree_lab.experiment.study_status import STALE_S, format_status, study_status


@pytest.fixture()
def study(tmp_path):
    """A study folder as ``zfree study`` leaves it mid-way: plan.json with four runs (2 workers, an
    estimate of 400 s for the grid), one finished in 120 s, one failed, one running at step 30 of 120, one
    not started."""
    s = tmp_path / "study"
    runs = s / "runs"
    ids = ["plain_beta0.3_aaaa", "control_plain_bbbb", "distribution_beta0.3_cccc", "oracle-x_dddd"]
    atomic_write_json(s / "plan.json", {"run_ids": ids, "workers": 2, "made": "2026-12-06 04:58:11",
                                        "estimate": {"estimated_s": 400.0, "runs": 4}})
    atomic_write_json(runs / ids[0] / "summary.json", {"wall_s": 120.0})
    atomic_write_json(runs / ids[1] / "error.json", {"run_id": ids[1], "error": "ValueError: beta must be >= 0"})
    atomic_write_json(runs / ids[2] / "progress.json", {"step": 30, "steps": 120, "phase": "soft", "eta_s": 90.0})
    return s


def test_each_run_is_read_in_the_plans_order_with_its_state(study):
    st = study_status(study)
    assert [r["state"] for r in st["runs"]] == ["finished", "failed", "running", "waiting"]
    assert st["counts"] == {"finished": 1, "running": 1, "failed": 1, "waiting": 1}
    running = st["runs"][2]
    assert (running["step"], running["steps"], running["phase"]) == (30, 120, "soft") and running["age_s"] < 600
    assert "beta must be >= 0" in st["runs"][1]["error"]
    # left: the waiting run and 90 of the running run's 120 steps, at the finished run's 120 s, over 2 workers
    assert st["per_run_from"] == "the median of 1 finished run"
    assert st["remaining_s"] == pytest.approx((1 + 90 / 120) * 120.0 / 2)
    text = format_status(st)
    assert "runs: 1 finished, 1 running, 1 failed, 1 waiting (of 4)" in text
    assert "running  distribution_beta0.3_cccc: step 30 of 120 (soft)" in text
    assert "FAILED   control_plain_bbbb: ValueError: beta must be >= 0" in text
    assert "remaining: about 1 min 45 s on 2 worker(s) (2 min 00 s a run, from the median of 1 finished run)" in text


def test_the_time_a_run_takes_is_the_median_of_the_finished_runs(study):
    """One finished run that shared a loaded machine (8x the others) moves the figure no more than any other."""
    ids = json.loads((study / "plan.json").read_text())["run_ids"]
    os.remove(study / "runs" / ids[1] / "error.json")
    for rid, wall in ((ids[1], 100.0), (ids[3], 960.0)):
        atomic_write_json(study / "runs" / rid / "summary.json", {"wall_s": wall})
    st = study_status(study)  # finished: 120, 100 and 960 s
    assert st["per_run_s"] == 120.0 and st["per_run_from"] == "the median of 3 finished runs"
    assert st["remaining_s"] == pytest.approx((90 / 120) * 120.0 / 2)


def test_without_a_finished_run_the_plans_estimate_sizes_the_rest_and_a_silent_run_is_flagged(study):
    os.remove(study / "runs" / "plain_beta0.3_aaaa" / "summary.json")
    prog = study / "runs" / "distribution_beta0.3_cccc" / "progress.json"
    old = time.time() - STALE_S - 60
    os.utime(prog, (old, old))
    st = study_status(study)
    assert st["per_run_from"] == "the plan's estimate" and st["per_run_s"] == pytest.approx(400.0 * 2 / 4)
    assert "nothing written since: stopped?" in format_status(st)


def test_the_base_fine_tune_is_read_from_its_real_checkpoint(tmp_path, monkeypatch):
    """An own-model study fine-tuning its base: no plan yet, the fine-tune stopped after its checkpoint of
    step 4 (written by the real ``train_text_base``)."""
    from test_base_checkpoint import CFG, _rows, _stop_after
    from zfree_lab.run.base_training import train_text_base
    from zfree_lab.run.locks import LOCK_NAME

    s = tmp_path / "own"
    s.mkdir()
    (s / LOCK_NAME).touch()
    rows = _rows()
    for name, part in (("train", rows[:32]), ("val", rows[32:])):
        (s / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    _stop_after(monkeypatch, 5)
    with pytest.raises(KeyboardInterrupt):
        train_text_base(s, s / "base_ft", CFG, progress=False, checkpoint_dir=s / "base_ft.checkpoint")
    st = study_status(s)
    ft = st["finetune"]
    assert st["preparing"] and ft["state"] == "running" and (ft["step"], ft["steps"]) == (4, 6)
    assert ft["val_c_base"] > 0 and ft["s_per_step"] > 0
    assert st["remaining_s"] is None  # no plan, no finished run: nothing says how long a run takes
    text = format_status(st)
    assert "preparing: no plan yet" in text and "base fine-tune: step 4 of 6 at its last checkpoint" in text


def test_the_command_prints_the_status_or_the_record_and_refuses_a_folder_that_is_no_study(study, tmp_path, capsys):
    assert main(["status", str(study)]) in (0, None)
    assert "runs: 1 finished" in capsys.readouterr().out
    assert main(["status", str(study), "--json"]) in (0, None)
    assert json.loads(capsys.readouterr().out)["counts"]["failed"] == 1
    (tmp_path / "other").mkdir()
    assert main(["status", str(tmp_path / "other")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "is not a study or sweep folder" in err and str(tmp_path / "other") in err


def test_the_command_loads_no_torch_so_it_answers_at_once_beside_a_busy_study(study):
    """``zfree status`` reads files only: in a fresh interpreter it imports neither torch, transformers,
    pandas nor matplotlib (it imported torch through the spec's boundary helper: about a minute on a
    machine busy with the study it reads)."""
    import subprocess
    import sys

    code = ("import sys; from zfree_lab.cli import main; rc = main(['status', sys.argv[1]]); "
            "print('HEAVY', sorted(m for m in ('torch', 'transformers', 'pandas', 'matplotlib', 'scipy', 'sklearn') "
            "if m in sys.modules)); sys.exit(rc or 0)")
    r = subprocess.run([sys.executable, "-c", code, str(study)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0 and "runs: 1 finished" in r.stdout, r.stdout + r.stderr[-2000:]
    assert "HEAVY []" in r.stdout, r.stdout


def _stale(path):
    old = time.time() - STALE_S - 60
    os.utime(path, (old, old))


def test_live_processes_are_read_from_the_lock_files_a_final_evaluation_is_not_called_stopped(study):
    """The study's and each run's process are read from their real locks (``run_folder_lock``): a run
    silent for longer than ``STALE_S`` at its last step whose kernel lives is at its final evaluation;
    once its lock is released (or its holder's pid is dead) its process is gone; a holder on another host
    falls back to the silence rule; a run whose lock is held before its first step is starting."""
    import socket
    import subprocess
    import sys

    from zfree_lab.run.locks import LOCK_NAME, run_folder_lock

    runs = study / "runs"
    run = runs / "distribution_beta0.3_cccc"
    atomic_write_json(run / "progress.json", {"step": 120, "steps": 120, "phase": "soft", "eta_s": 0.0})
    _stale(run / "progress.json")
    import datetime

    with run_folder_lock(runs, "runs folder"), run_folder_lock(run), run_folder_lock(runs / "oracle-x_dddd"):
        st = study_status(study)
        text = format_status(st)
    assert st["process"]["pid"] == os.getpid() and st["process"]["alive"] is True
    # while the study's process runs, the clock time it should end at (the machine's zone)
    ends = datetime.datetime.fromtimestamp(st["at"] + st["remaining_s"])
    assert f"worker(s), ends about {ends:%a %H:%M} " in text
    assert f"study process: pid {os.getpid()}, since" in text
    assert "running  distribution_beta0.3_cccc: step 120 of 120 (soft)" in text and "final evaluation" in text
    assert "stopped?" not in text and "process is gone" not in text
    assert "running  oracle-x_dddd: starting (no step written yet)" in text
    assert st["counts"]["running"] == 2 and st["counts"]["waiting"] == 0

    st = study_status(study)  # every lock released: the study and its running run have no process
    text = format_status(st)
    assert st["process"] is None and st["runs"][2]["alive"] is False
    assert "study process: none running — `zfree study` with the same arguments resumes the study" in text
    assert "distribution_beta0.3_cccc: step 120 of 120 (soft)" in text and "its process is gone" in text
    assert "final evaluation" not in text and st["counts"] == {"finished": 1, "running": 1, "failed": 1, "waiting": 1}
    assert "remaining: about" in text and "ends about" not in text  # no process: it ends when resumed

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (run / LOCK_NAME).write_text(json.dumps({"pid": int(dead.stdout), "host": socket.gethostname()}))
    assert study_status(study)["runs"][2]["alive"] is False  # a holder killed with its record left behind

    (run / LOCK_NAME).write_text(json.dumps({"pid": os.getpid(), "host": "another-node"}))
    st = study_status(study)
    assert st["runs"][2]["alive"] is None and "nothing written since: stopped?" in format_status(st)
    os.utime(run / "progress.json")
    assert "stopped?" not in format_status(study_status(study))


def test_a_runs_folder_reads_as_its_study_and_a_run_folder_as_that_run(study, capsys):
    runs = study / "runs"
    assert study_status(runs)["study"] == str(study) and study_status(runs)["counts"]["failed"] == 1
    for rid in ("plain_beta0.3_aaaa", "control_plain_bbbb", "distribution_beta0.3_cccc"):
        atomic_write_json(runs / rid / "config.json", {"steps": 120})
    lines = {rid: format_status(study_status(runs / rid))
             for rid in ("plain_beta0.3_aaaa", "control_plain_bbbb", "distribution_beta0.3_cccc")}
    assert lines["plain_beta0.3_aaaa"] == f"run {runs / 'plain_beta0.3_aaaa'}: finished in 2 min 00 s"
    assert lines["control_plain_bbbb"] == f"run {runs / 'control_plain_bbbb'}: failed: ValueError: beta must be >= 0"
    assert lines["distribution_beta0.3_cccc"].startswith(
        f"run {runs / 'distribution_beta0.3_cccc'}: running, step 30 of 120 (soft), last written ")
    assert main(["status", str(runs / "plain_beta0.3_aaaa"), "--json"]) in (0, None)
    assert json.loads(capsys.readouterr().out)["run"]["state"] == "finished"


def test_metrics_shows_each_runs_last_complete_evaluation_only_when_asked(study, capsys):
    runs = study / "runs"
    done, running = runs / "plain_beta0.3_aaaa", runs / "distribution_beta0.3_cccc"
    row = {"step": 120, "loss/val/baseline_normalized_reconstruction_loss": 0.9731,
           "loss/val/kl_prior_loss": 0.41234, "latent/mutual_information": 0.38, "latent/codes_used": 2,
           "readout/use_shuffled": 0.1234, "structure/probe_accuracy": 0.9}
    (done / "metrics.jsonl").write_text(json.dumps({"step": 0}) + "\n" + json.dumps(row) + "\n")
    # the running run's writer is mid-line: its torn row is skipped, the step-60 row is the last complete one
    (running / "metrics.jsonl").write_text(json.dumps({**row, "step": 60}) + "\n" + '{"step": 90, "loss/val')
    assert "last evaluation" not in format_status(study_status(study))
    assert all("last_eval" not in r for r in study_status(study)["runs"])
    st = study_status(study, metrics=True)
    assert st["runs"][0]["last_eval"] == {k: v for k, v in row.items() if k != "structure/probe_accuracy"}
    assert st["runs"][2]["last_eval"]["step"] == 60 and "last_eval" not in st["runs"][1]
    text = format_status(st)
    assert ("  finished plain_beta0.3_aaaa\n      last evaluation (step 120): rho_recon 0.9731, rate 0.4123 nats, "
            "MI 0.38 nats, codes 2, use (z shuffled) 0.1234 nats/example") in text
    assert "distribution_beta0.3_cccc: step 30 of 120 (soft)" in text and "last evaluation (step 60)" in text
    atomic_write_json(done / "config.json", {"steps": 120})
    assert main(["status", str(done), "--metrics"]) in (0, None)
    out = capsys.readouterr().out
    assert out.startswith(f"run {done}: finished in 2 min 00 s\n      last evaluation (step 120): rho_recon 0.9731")
    (done / "metrics.jsonl").unlink()
    assert "no evaluation yet" in format_status(study_status(done, metrics=True))


def test_a_running_runs_time_left_counts_its_evaluations_from_the_finished_runs_share_of_training(study):
    """Finished runs that spent a quarter of their wall time in training steps: a run at step 120 of 120
    (its final evaluation) still has half of the other three quarters to go, not nothing; one at step 30 of
    120 has that plus three quarters of its steps; the printed line says how a run's time splits."""
    ids = json.loads((study / "plan.json").read_text())["run_ids"]
    os.remove(study / "runs" / ids[1] / "error.json")
    for rid, wall, train in ((ids[0], 120.0, 30.0), (ids[1], 100.0, 25.0), (ids[3], 960.0, 240.0)):
        atomic_write_json(study / "runs" / rid / "summary.json", {"wall_s": wall, "compute/train_wall_s": train})
    st = study_status(study)
    assert st["train_share"] == pytest.approx(0.25)
    assert st["remaining_s"] == pytest.approx((0.375 + 0.25 * 90 / 120) * 120.0 / 2)
    assert "25 % of it in training steps, the rest loading, evaluations and outputs" in format_status(st)
    atomic_write_json(study / "runs" / ids[2] / "progress.json", {"step": 120, "steps": 120, "phase": "soft"})
    assert study_status(study)["remaining_s"] == pytest.approx(0.375 * 120.0 / 2)


def test_run_left_without_a_share_is_the_steps_left_and_with_one_adds_the_time_outside_them():
    from zfree_lab.experiment.study_status import run_left, train_share

    assert run_left({"step": 30, "steps": 120}, None) == pytest.approx(0.75)
    assert run_left({"step": 0, "steps": 120}, 0.4) == pytest.approx(1.0)  # nothing done yet
    assert run_left({"step": None, "steps": None}, 0.4) == pytest.approx(1.0)  # starting
    assert run_left({"step": 60, "steps": 120}, 0.4) == pytest.approx(0.3 + 0.2)
    assert train_share([{"state": "finished", "run_s": 100.0}]) is None  # a summary without the training's time
    assert train_share([{"state": "finished", "run_s": 100.0, "train_wall_s": 130.0}]) == 1.0  # clipped


def test_a_runs_time_is_its_whole_execution_not_the_trainers_wall_time(tmp_path, monkeypatch):
    """On the smoke preset `zfree status` said 25 s a run where runs took about 4.5 min: summary.json's
    ``wall_s`` leaves out the kernel's start and loading. A study's point records its whole time
    (run_time.json, from the executor's clock) and status sizes the rest by it; a run without one (trained
    by ``zfree train`` or an earlier version) falls back to ``wall_s``."""
    import nbformat

    from zfree_lab.experiment import executor
    from zfree_lab.experiment.spec import Point

    calls = []  # the executor's clock: 1000 s at the point's start, 1270 s at every later read

    def clock():
        calls.append(1)
        return 1000.0 if len(calls) == 1 else 1270.0

    monkeypatch.setattr(executor.time, "time", clock)

    def kernel(nb, out, **kw):  # the notebook trained the run (25 s of the trainer's time) and was written
        atomic_write_json(Path(out).parent / "config.json", {})
        atomic_write_json(Path(out).parent / "summary.json", {"wall_s": 25.0, "compute/train_wall_s": 5.0})
        Path(out).write_text(nbformat.writes(nbformat.v4.new_notebook()))

    monkeypatch.setattr(executor, "execute", kernel)
    study = tmp_path / "study"
    from zfree.core.paths import NOTEBOOKS

    nb = str(NOTEBOOKS / "train_cvae.ipynb")
    assert executor.run_point(Point("a_1111", {}), str(study / "runs"), nb)["status"] == "finished"
    assert json.loads((study / "runs" / "a_1111" / "run_time.json").read_text())["seconds"] == 270.0
    atomic_write_json(study / "runs" / "b_2222" / "summary.json", {"wall_s": 90.0})  # no run_time.json
    atomic_write_json(study / "plan.json", {"run_ids": ["a_1111", "b_2222", "c_3333"], "workers": 1})
    st = study_status(study, now=2000.0)
    assert [r["run_s"] for r in st["runs"][:2]] == [270.0, 90.0]
    assert st["per_run_s"] == pytest.approx(180.0) and st["remaining_s"] == pytest.approx(180.0)
    assert st["train_share"] == pytest.approx(5.0 / 270.0)  # the whole time is the denominator
    assert format_status(study_status(study / "runs" / "a_1111")).endswith("a_1111: finished in 4 min 30 s")


def test_a_progress_file_written_after_now_was_read_is_not_dated_in_the_future(study):
    """On a loaded machine `zfree status` took minutes and printed "last written -1 min 19 s ago": a run
    rewrote progress.json after ``now`` was read. Its age reads 0, and a negative duration prints as 0."""
    from zfree_lab.experiment.study_status import _dur

    prog = study / "runs" / "distribution_beta0.3_cccc" / "progress.json"
    st = study_status(study, now=prog.stat().st_mtime - 41.0)
    assert st["runs"][2]["age_s"] == 0.0 and "last written 0 min 00 s ago" in format_status(st)
    assert _dur(-41) == "0 min 00 s" and _dur(61) == "1 min 01 s"


def test_a_study_whose_runs_all_ended_says_how_many_failed_not_that_every_run_is_done(study):
    """A sweep whose every point failed read "study process: none (every run is done)": failed runs are ended,
    not done, and the same command retries them."""
    runs = study / "runs"
    for rid in ("distribution_beta0.3_cccc", "oracle-x_dddd"):
        (runs / rid / "progress.json").unlink(missing_ok=True)
        atomic_write_json(runs / rid / "summary.json", {"wall_s": 100.0})
    text = format_status(study_status(study))
    assert ("study process: none (every run ended: 3 finished, 1 failed; the same command again retries the failed "
            "ones)") in text and "every run is done" not in text
    (runs / "control_plain_bbbb" / "error.json").unlink()
    atomic_write_json(runs / "control_plain_bbbb" / "summary.json", {"wall_s": 100.0})
    assert "study process: none (every run is done)" in format_status(study_status(study))


def test_the_time_left_is_over_the_runs_training_at_once_where_a_resume_took_more_workers_than_the_plan(study):
    """A study planned at 1 worker (its estimate's memory plan) and resumed with `--workers 2` trains 2 runs at once:
    `zfree status` said "on 1 worker(s)" and twice the time left."""
    from zfree_lab.run.locks import run_folder_lock

    plan = json.loads((study / "plan.json").read_text())
    atomic_write_json(study / "plan.json", {**plan, "workers": 1})
    runs = study / "runs"
    one = study_status(study)
    assert one["workers"] == 1
    with run_folder_lock(runs, "runs folder"), run_folder_lock(runs / "distribution_beta0.3_cccc"), \
            run_folder_lock(runs / "oracle-x_dddd"):
        st = study_status(study)
        text = format_status(st)
    assert st["workers"] == 2 and " on 2 worker(s), ends about " in text
    assert st["remaining_s"] < one["remaining_s"]


def test_a_finished_study_says_where_its_report_stands_and_a_rendering_one_says_so(study):
    """A new user's `zfree status` said "6 finished … study process: pid N" for the two minutes the report
    rendered, and "every run is done" after it with no word of the report: now the process line says it is
    rendering, and a study whose runs all ended names its report (none yet / up to date / older than its runs)."""
    from zfree_lab.experiment.timings import PhaseClock
    from zfree_lab.run.locks import run_folder_lock

    runs = study / "runs"
    for rid in ("control_plain_bbbb", "distribution_beta0.3_cccc", "oracle-x_dddd"):
        for f in ("progress.json", "error.json"):
            (runs / rid / f).unlink(missing_ok=True)
        atomic_write_json(runs / rid / "summary.json", {"wall_s": 100.0})
    clock = PhaseClock(study)
    clock.progress("report")
    with run_folder_lock(runs, "runs folder"):
        text = format_status(study_status(study))
    assert f"study process: pid {os.getpid()}, since" in text and text.splitlines()[2].endswith(" — rendering the report")
    assert "report:" not in text  # the process runs: its closing line names the report
    text = format_status(study_status(study))
    assert "rendering" not in text and f"report: none yet: `zfree report {study}` renders it" in text
    (study / "report.html").write_text("<html/>")
    (study / "report.ipynb").write_text("{}")
    assert f"report: {study / 'report.html'} (up to date)" in format_status(study_status(study))
    later = time.time() + 5
    os.utime(runs / "oracle-x_dddd" / "summary.json", (later, later))  # a run written after it
    assert (f"report: {study / 'report.html'} is older than its runs or zfree's report code: `zfree report {study}` "
            "renders it again") in format_status(study_status(study))
