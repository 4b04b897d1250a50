"""``zfree status STUDY``: how far a study or sweep folder has got, read from the folder alone.

A study on a real model runs for hours (a seeded SmolLM2 factorial: tens of runs of 40-60 minutes on one
CPU thread) and resumes across sessions; this says, without loading a model or touching a file, what is
finished, what is running (its step, phase and when it last wrote), what failed (its error), what waits,
how far the base's fine-tune got (``base_ft.checkpoint``, ``zfree_lab.run.base_checkpoint``), and about
how long the rest takes: the finished runs' median whole time (``executor.RUN_TIME``: the kernel's start
and loading included; else the plan's estimate) per run
waiting, over the plan's workers (or the runs training at once, where more), with the share of it the training steps took (the rest is loading,
evaluations and outputs, which on a real model can be most of a run: fewer ``eval_rows`` shorten it).
A run is finished by ``executor.is_finished``, the rule the study itself skips runs by. Whether the study and each running run still have a live process is read from
their lock files (``locks.lock_owner``: the holder's pid, checked on this host), so a run at its final
evaluation, which writes nothing for minutes, is told from one whose process is gone.
"""

from __future__ import annotations

import shlex
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

from zfree.core.errors import CheckpointError, InputError
from zfree.core.io import read_json_object, read_jsonl
from zfree_lab.experiment.executor import RUN_TIME, is_finished
from zfree_lab.run.checkpoint_io import read_plain_structure
from zfree_lab.experiment.study_folders import FINETUNE_CHECKPOINT, FINETUNE_DIR, finetune_roots, report_is_current
from zfree_lab.experiment.timings import read_timings
from zfree_lab.run.locks import LOCK_NAME, lock_owner

#: a running run whose progress.json is older than this is said to have written nothing for that long
#: (its process may have stopped: a study resumes it when run again)
STALE_S = 15 * 60


def _alive(folder: Path) -> bool | None:
    """Whether a live process holds ``folder``'s lock: True, False (its holder is gone, or the lock file
    is there and released), or None (no lock file, or a holder on another host: not known here)."""
    owner = lock_owner(folder)
    if owner is not None:
        return owner["alive"]
    return False if (folder / LOCK_NAME).is_file() else None


#: the last evaluation's readouts ``zfree status --metrics`` shows: (metric key, label, unit)
EVAL_KEYS = (("loss/val/baseline_normalized_reconstruction_loss", "rho_recon", ""),
             ("loss/val/kl_prior_loss", "rate", " nats"), ("latent/mutual_information", "MI", " nats"),
             ("latent/codes_used", "codes", ""), ("readout/use_shuffled", "use (z shuffled)", " nats/example"))


def last_eval(run_dir: Path) -> dict[str, Any] | None:
    """The last complete row of the run's metrics.jsonl (``read_jsonl``; a row being appended is dropped),
    reduced to its ``step`` and the keys of ``EVAL_KEYS`` it has; None when there is no row yet or the file
    cannot be read."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a writer mid-line is normal while a run is going
            rows = read_jsonl(run_dir / "metrics.jsonl", drop_torn_tail=True)
    except (OSError, InputError):
        return None
    row = rows[-1] if rows else None
    return {k: row[k] for k in ("step", *(k for k, _, _ in EVAL_KEYS)) if k in row} if isinstance(row, dict) else None


def run_state(run_dir: Path, now: float) -> dict[str, Any]:
    """One run's state: ``finished`` (``is_finished``), ``failed`` (error.json: its ``error``),
    ``running`` (a live holder of its lock and no progress.json yet: ``phase`` "starting" and ``step``
    None; else progress.json: ``step``, ``steps``, ``phase``, ``eta_s``, ``age_s``, the seconds since
    it was written, and ``alive``, ``_alive`` of its folder) or ``waiting`` (no folder or nothing written yet). A
    finished run's ``wall_s`` and ``train_wall_s`` (summary.json: the trainer's time, its training steps'), and
    ``run_s``: its whole time from ``executor.RUN_TIME`` (the kernel's start and loading included), else ``wall_s``
    (a run trained by ``zfree train``, or by a version before that file)."""
    rid = run_dir.name
    if not run_dir.is_dir():
        return {"run_id": rid, "state": "waiting"}
    if is_finished(run_dir):
        summary = read_json_object(run_dir / "summary.json") or {}
        whole = (read_json_object(run_dir / RUN_TIME) or {}).get("seconds")
        return {"run_id": rid, "state": "finished", "wall_s": summary.get("wall_s"),
                "train_wall_s": summary.get("compute/train_wall_s"),
                "run_s": whole if isinstance(whole, (int, float)) and whole > 0 else summary.get("wall_s")}
    err = read_json_object(run_dir / "error.json")
    if err is not None:
        return {"run_id": rid, "state": "failed", "error": str(err.get("error", ""))[:300]}
    prog = run_dir / "progress.json"
    rec = read_json_object(prog)
    if rec is None:  # a live holder of its lock: started, no step written yet (loading, reference scoring)
        return ({"run_id": rid, "state": "running", "step": None, "steps": None, "phase": "starting",
                 "eta_s": None, "age_s": None, "alive": True} if _alive(run_dir) else {"run_id": rid, "state": "waiting"})
    return {"run_id": rid, "state": "running", "step": rec.get("step"), "steps": rec.get("steps"),
            "phase": rec.get("phase"), "eta_s": rec.get("eta_s"), "age_s": max(0.0, now - prog.stat().st_mtime),
            "alive": _alive(run_dir)}


def finetune_state(study: Path, now: float) -> dict[str, Any] | None:
    """The base's fine-tune (``finetune_base``: ``base_ft/`` beside the study's train.jsonl, in the study
    folder or its data/): ``done`` with its c_base, ``running`` with the step of its last checkpoint, the
    steps asked, the last validation c_base and the seconds per step so far, or None (no fine-tune)."""
    for root in finetune_roots(study):
        ref = read_json_object(root / FINETUNE_DIR / "reference" / "reference.json")
        if ref is not None:
            return {"state": "done", "c_base": ref.get("c_base")}
        ckpt = root / FINETUNE_CHECKPOINT / "checkpoint"
        key = read_json_object(ckpt / "key.json")
        try:
            s = read_plain_structure(ckpt, "state")  # the tensors (Adam's moments) stay on disk
        except CheckpointError:
            s = None
        if isinstance(s, dict) and key is not None:
            history = s.get("history") or []
            step = s.get("step") or 0
            return {"state": "running", "step": step, "steps": key.get("config", {}).get("max_steps"),
                    "val_c_base": history[-1].get("val_c_base") if history else None,
                    "s_per_step": (s.get("elapsed_s") or 0) / step if step else None,
                    "age_s": max(0.0, now - (ckpt / "state.json").stat().st_mtime)}
    return None


def _with_eval(r: dict[str, Any], run_dir: Path, metrics: bool) -> dict[str, Any]:
    if metrics and r["state"] in ("finished", "running"):
        r["last_eval"] = last_eval(run_dir)
    return r


def study_status(study: Path | str, now: float | None = None, metrics: bool = False) -> dict[str, Any]:
    """The status record of ``study`` (a folder ``zfree study`` or ``zfree sweep`` wrote): ``runs`` (one
    ``run_state`` per planned run, in plan order; the folders under runs/ when there is no plan.json),
    ``counts`` per state, ``preparing`` (no plan and no run yet: the base, its reference, a fine-tune and
    the estimate's probes come first), ``process`` (the study's lock holder, ``locks.lock_owner`` of runs/
    or else of the study folder: None when none holds them), ``finetune`` (``finetune_state``), ``phase`` (timings.json's phase under way while the process runs:
    "report" while it renders), ``report`` (report.html's path and ``report_is_current``; None without one), ``at`` (``now``), ``workers`` and ``remaining_s``: the fine-tune's
    steps left at its own pace, then the runs left (a running run's share by ``run_left``, with
    ``train_share`` of the finished runs) at ``per_run_s`` over the workers (None when nothing says
    how long a run takes): the median whole time (``run_s``) of the finished runs (a mean let one run that shared a busy
    machine, at 8x the others' time, double the figure), else the plan's estimate. InputError naming the
    folder when it holds neither plan.json, runs/ nor zfree's lock file (a folder ``zfree study`` has started). A study's runs/ folder reads as
    the study; one run's folder (config.json, no plan) gives ``{"run": run_state, "path"}`` instead.
    ``metrics``: each finished or running run also carries ``last_eval`` (``last_eval``): interim results,
    so off by default (a look at a preregistered study's readouts before its analysis is a look at its data)."""
    study = Path(study)
    now = time.time() if now is None else now
    if study.name == "runs" and (study.parent / "plan.json").is_file():
        study = study.parent  # the study's runs/ folder: the study
    plan = read_json_object(study / "plan.json")
    runs_dir = study / "runs"
    if plan is None and (study / "config.json").is_file() and not runs_dir.is_dir():
        run = _with_eval(run_state(study, now), study, metrics)
        return {"study": None, "run": run, "path": str(study)}  # one run's folder
    if plan is None and not runs_dir.is_dir() and not (study / LOCK_NAME).exists():
        raise InputError(f"{study} is not a study or sweep folder (no plan.json, no runs/, no {LOCK_NAME})")
    ids = list((plan or {}).get("run_ids")
               or (sorted(p.name for p in runs_dir.iterdir() if p.is_dir()) if runs_dir.is_dir() else []))
    runs = [_with_eval(run_state(runs_dir / rid, now), runs_dir / rid, metrics) for rid in ids]
    counts = {s: sum(r["state"] == s for r in runs) for s in ("finished", "running", "failed", "waiting")}
    workers = max(1, int((plan or {}).get("workers") or 1))
    walls = [r["run_s"] for r in runs if r["state"] == "finished" and r.get("run_s")]
    est = ((plan or {}).get("estimate") or {})
    per_run = (statistics.median(walls) if walls else  # the median: one run slowed by a loaded machine or a stop
               est["estimated_s"] * workers / est["runs"] if est.get("estimated_s") and est.get("runs") else None)
    share = train_share(runs)
    left = counts["waiting"] + sum(run_left(r, share) for r in runs if r["state"] == "running")
    ft = finetune_state(study, now)
    ft_left = ((ft["steps"] - ft["step"]) * ft["s_per_step"]
               if ft and ft["state"] == "running" and ft.get("steps") and ft.get("s_per_step") else 0.0)
    process = lock_owner(runs_dir) or lock_owner(study)
    # a resumed study takes the --workers it is given, not the plan's: the runs training at once say how many
    live = sum(r["state"] == "running" and r.get("alive") is True for r in runs) if process else 0
    in_use = max(workers, live)
    sessions = read_timings(study) if process and process.get("alive") else []
    report = study / "report.html"
    return {"study": str(study), "made": (plan or {}).get("made"), "preparing": plan is None and not runs,
            "process": process, "phase": sessions[-1].get("running") if sessions else None,
            "report": {"path": str(report), "current": report_is_current(study)} if report.is_file() else None,
            "runs": runs, "counts": counts,
            "finetune": ft, "workers": in_use, "per_run_s": per_run,
            "per_run_from": (f"the median of {len(walls)} finished run{'s' * (len(walls) > 1)}" if walls
                             else "the plan's estimate" if per_run else None),
            "train_share": share,
            "remaining_s": None if per_run is None else ft_left + left * per_run / in_use, "at": now}


def train_share(runs: list[dict[str, Any]]) -> float | None:
    """The median share of a finished run's time spent in its training steps (summary.json's
    ``compute/train_wall_s`` over ``run_s``, its whole time, clipped to [0, 1]); None when no finished run
    records both. The rest is the kernel's start, loading, the reference, the evaluations and the final
    outputs (samples, multi-reference, the notebook's figures)."""
    shares = [min(1.0, max(0.0, r["train_wall_s"] / r["run_s"])) for r in runs
              if r["state"] == "finished" and r.get("run_s") and isinstance(r.get("train_wall_s"), (int, float))]
    return statistics.median(shares) if shares else None


def run_left(r: dict[str, Any], share: float | None) -> float:
    """The share of a run still to go for a running run ``r`` (``run_state``) at step s of n: 1 − s/n
    without ``share``; with it (``train_share``), the time outside the steps is counted half before the
    first step (loading, the reference, the step-0 evaluation) and half after the last (the final
    evaluation and outputs), so a run at its final evaluation still has (1 − share)/2 to go."""
    step, steps = r.get("step") or 0, max(1, r.get("steps") or 1)
    if share is None:
        return 1 - step / steps
    rest = (1 - share) / 2
    return rest + share * (1 - step / steps) + (rest if step == 0 else 0.0)


def _dur(s: float | None) -> str:
    """Seconds as "1 h 05 min" or "3 min 07 s"; a negative one (a file written after ``now`` was read, on a
    slow machine) as 0."""
    if s is None:
        return "?"
    s = max(0, int(round(s)))
    return f"{s // 3600} h {s % 3600 // 60:02d} min" if s >= 3600 else f"{s // 60} min {s % 60:02d} s"


def _run_note(r: dict[str, Any], resume: str = "`zfree study` again") -> str:
    """What a running run's line adds: its process gone, its final evaluation, or (its process not known
    here) a silence longer than ``STALE_S``; ``resume``: the command that resumes it."""
    if r.get("alive") is False:
        return f" — its process is gone: {resume} resumes it"
    if r.get("alive") and r.get("step") is not None and r.get("step") == r.get("steps"):
        return " — final evaluation (it writes its results at the end)"
    if r.get("alive") is None and r["age_s"] > STALE_S:
        return f" — nothing written since: stopped? {resume} resumes it"
    return ""


def _process_line(st: dict[str, Any]) -> str:
    """The study process: its pid and start when it runs, or that none does while runs are left."""
    p, c = st.get("process"), st["counts"]
    if p and p["alive"] is not False:
        where = "" if p["alive"] else f" on {p.get('host')} (another host: not checked from here)"
        doing = " — rendering the report" if st.get("phase") == "report" else ""
        return f"study process: pid {p['pid']}{where}, since {p.get('since', '?')}{doing}"
    if c["waiting"] or c["running"] or st.get("preparing"):
        return "study process: none running — `zfree study` with the same arguments resumes the study"
    if c["failed"]:  # a rerun tries the failed runs again
        return (f"study process: none (every run ended: {c['finished']} finished, {c['failed']} failed; the same "
                "command again retries the failed ones)")
    return "study process: none (every run is done)"


def _eval_line(r: dict[str, Any]) -> str:
    """``last_eval`` as one indented line ("" without it)."""
    if "last_eval" not in r:
        return ""
    ev = r["last_eval"]
    if not ev:
        return "\n      no evaluation yet"
    parts = [f"{label} {ev[k]:.4g}{unit}" for k, label, unit in EVAL_KEYS if isinstance(ev.get(k), (int, float))]
    return f"\n      last evaluation (step {ev.get('step', '?')}): " + (", ".join(parts) or "none of the readouts")


def _format_run(st: dict[str, Any]) -> str:
    """One run folder's record (``study_status`` of a run's folder) as lines."""
    r = st["run"]
    return _run_line(st, r) + _eval_line(r)


def _run_line(st: dict[str, Any], r: dict[str, Any]) -> str:
    head = f"run {st['path']}: {r['state']}"
    if r["state"] == "finished":
        return head + (f" in {_dur(r['run_s'])}" if r.get("run_s") else "")
    if r["state"] == "failed":
        return f"{head}: {r['error']}"
    if r["state"] == "running" and r["step"] is None:
        return head + " (starting: no step written yet)"
    if r["state"] == "running":
        return (f"{head}, step {r['step']} of {r['steps']} ({r['phase']}), last written {_dur(r['age_s'])} ago"
                + _run_note(r, "`zfree train --resume` (or its study)"))
    return head + " (nothing written yet)"


def format_status(st: dict[str, Any]) -> str:
    """``study_status``'s record as the lines ``zfree status`` prints."""
    if "run" in st:
        return _format_run(st)
    c = st["counts"]
    lines = [f"study {st['study']}" + (f" (plan made {st['made']})" if st.get("made") else "")]
    if st.get("preparing"):
        lines.append("preparing: no plan yet (the base, its reference, a fine-tune and the estimate's probes "
                     "come before the runs)")
    else:
        lines.append(f"runs: {c['finished']} finished, {c['running']} running, {c['failed']} failed, "
                     f"{c['waiting']} waiting (of {len(st['runs'])})")
    ft = st.get("finetune")
    if ft and ft["state"] == "done":
        lines.append(f"base fine-tune: done (c_base {ft['c_base']:.4f} nats/token)")
    elif ft:
        val = f", val c_base {ft['val_c_base']:.4f}" if ft.get("val_c_base") is not None else ""
        lines.append(f"base fine-tune: step {ft['step']} of {ft['steps']} at its last checkpoint{val}, "
                     f"{ft['s_per_step'] or 0:.1f} s a step, written {_dur(ft['age_s'])} ago (resumes from there)")
    lines.append(_process_line(st))
    for r in st["runs"]:
        if r["state"] == "running":
            lines.append((f"  running  {r['run_id']}: starting (no step written yet)" if r["step"] is None else
                          f"  running  {r['run_id']}: step {r['step']} of {r['steps']} ({r['phase']}), "
                          f"last written {_dur(r['age_s'])} ago{_run_note(r)}") + _eval_line(r))
        elif r["state"] == "finished" and "last_eval" in r:
            lines.append(f"  finished {r['run_id']}" + _eval_line(r))
        elif r["state"] == "failed":
            lines.append(f"  FAILED   {r['run_id']}: {r['error']}")
    if st["remaining_s"] is not None and (c["waiting"] or c["running"]):
        share = st.get("train_share")
        split = ("" if share is None else
                 f"; {100 * share:.0f} % of it in training steps, the rest loading, evaluations and outputs")
        ends = ""  # the clock time only while the study's process runs (else it ends when resumed, plus this)
        if (st.get("process") or {}).get("alive") and st.get("at") is not None:
            ends = f", ends about {time.strftime('%a %H:%M %Z', time.localtime(st['at'] + st['remaining_s']))}"
        lines.append(f"remaining: about {_dur(st['remaining_s'])} on {st['workers']} worker(s){ends} "
                     f"({_dur(st['per_run_s'])} a run, from {st['per_run_from']}{split})")
    elif c["finished"] and not (st.get("process") or {}).get("alive"):  # every run ended: where its report stands
        rep, again = st.get("report"), f"`zfree report {shlex.quote(st['study'])}`"
        lines.append("report: none yet: " + again + " renders it" if rep is None else
                     f"report: {rep['path']} (up to date)" if rep["current"] else
                     f"report: {rep['path']} is older than its runs or zfree's report code: {again} renders it again")
    return "\n".join(lines)
