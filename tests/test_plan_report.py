"""Issue 35, item 2: the report opens with what was run against what was asked. ``timings.json``
(``zfree_lab.experiment.timings``: one session per invocation, each phase written when it ends, a rerun
appended) written by ``run_experiment``; the section (``zfree_lab.report.plan_report``): the budget, the
estimate, the cuts in order, the measured phases beside the estimate, and a plain smoke-test warning."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from zfree.core.errors import ConfigError

from zfree_lab.experiment import timings as T
from zfree_lab.report import plan_report as P

ESTIMATE = {"runs": 5, "workers": 1, "estimated_s": 1320.0, "estimated_peak_bytes": 10.6 * 2**30, "budget_s": 1800.0,
            "grid_budget_s": 1800.0 - 360.0 - P.REPORT_S, "micro_batch": 0,
            "cuts": ["evaluated rows 300 -> 100", "evaluations at step 0 and the end only",
                     "beta points [0.333, 1.0] x beta* -> [0.333] x beta*", "weightings ['distribution', 'example', "
                     "'plain', 'token'] -> ['distribution', 'example']", "batch 32 -> 8 rows a step",
                     "steps x 0.03 (unaided 500 -> 14, aided 1000 -> 28)", "label oracles ['pos', 'lexfile'] -> ['pos']"],
            "lines": ["estimate: 5 runs on 1 worker(s): about 22.0 min"], "train": {"steps": 14, "batch_size": 8}}


def test_phase_clock_writes_each_phase_as_it_ends_and_a_rerun_appends_a_session(tmp_path, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(T.time, "time", lambda: now[0])
    first = T.PhaseClock(tmp_path, started=1000.0)
    now[0] = 1060.0
    first.done("preparation")
    now[0] = 1360.0
    first.done("probes")
    now[0] = 3292.0
    first.done("grid", points={"finished": 5})  # interrupted before its report: the phases done are kept
    (s,) = T.read_timings(tmp_path)
    assert (s["preparation_s"], s["probes_s"], s["grid_s"], s["total_s"]) == (60.0, 300.0, 1932.0, 2292.0)
    assert "report_s" not in s and "finished" not in s and s["points"] == {"finished": 5}
    rerun = T.PhaseClock(tmp_path, started=5000.0)
    now[0] = 5010.0
    rerun.done("preparation")
    sessions = T.read_timings(tmp_path)
    assert len(sessions) == 2 and sessions[0] == s and sessions[1]["preparation_s"] == 10.0
    with pytest.raises(ValueError, match="phase 'training' is not one of"):
        rerun.done("training")
    assert T.read_timings(tmp_path / "nowhere") == []


def test_a_session_killed_mid_grid_keeps_its_grid_time_up_to_its_last_finished_point(tmp_path, monkeypatch):
    """A study killed outright (SIGKILL: no ``finally`` runs) used to record only its preparation, so a study
    resumed over three sessions reported 2.4 min where its runs had trained 165 min; the grid's time is
    now written as each point ends (``PhaseClock.progress``), ``running`` saying the phase was under way."""
    from zfree_lab.experiment import pipeline as PL
    from zfree_lab.experiment.study import PRESETS

    now = [1000.0]
    monkeypatch.setattr(T.time, "time", lambda: now[0])
    monkeypatch.setattr(PL.time, "time", lambda: now[0])
    for name, fake in {"prepare": lambda spec, out, **kw: object(), "_grid": lambda spec, prep: ({}, None),
                       "_notes": lambda *a: None, "_points": lambda *a: []}.items():
        monkeypatch.setattr(PL, name, fake)

    class Killed(BaseException):  # stands for SIGKILL: the test stops the session where the kill would
        pass

    def two_points_then_killed(points, runs_dir, *, on_done, **kw):
        for t, status in ((1600.0, "finished"), (1600.0, "skipped"), (4000.0, "finished")):
            now[0] = t
            on_done({"status": status})
            (s,) = T.read_timings(tmp_path / "s")  # on disk at once, as a kill would leave it
            assert s["running"] == "grid" and s["grid_s"] == t - 1000.0 and s["total_s"] == t - 1000.0
        now[0] = 5000.0
        raise Killed

    monkeypatch.setattr(PL, "run_points", two_points_then_killed)
    monkeypatch.setattr(PL.PhaseClock, "done", lambda self, phase, **kw: None)  # a killed process writes nothing more
    with pytest.raises(Killed):
        PL.run_experiment(PRESETS["smoke"], tmp_path / "s", progress=False)
    (s,) = T.read_timings(tmp_path / "s")
    assert s["grid_s"] == 3000.0 and s["points"] == {"finished": 2, "skipped": 1} and s["running"] == "grid"
    table = P.phase_table(None, [s])
    (head,) = [c for c in table.columns if c.startswith("measured")]
    assert head == "measured [min], ended during its grid" and table.loc["grid (runs, controls, oracles)", head] == "50.0"
    monkeypatch.undo()
    clock = T.PhaseClock(tmp_path / "t", started=0.0)
    clock.progress("grid", points={"finished": 1})
    clock.done("grid", points={"finished": 2})
    (s,) = T.read_timings(tmp_path / "t")
    assert "running" not in s and s["points"] == {"finished": 2}
    with pytest.raises(ValueError, match="phase 'training' is not one of"):
        clock.progress("training")


def test_run_experiment_records_every_phase_and_the_grid_even_when_interrupted(tmp_path, monkeypatch):
    """The pipeline's wiring, its steps replaced by stand-ins: preparation, probes, grid and report
    each written to timings.json; an interrupt in the grid still records the grid's time."""
    from zfree_lab.experiment import pipeline as PL
    from zfree_lab.experiment.study import PRESETS

    plan = type("Plan", (), {"spec": PRESETS["smoke"], "workers": 1, "record": {"runs": 0}})
    monkeypatch.setattr(PL, "prepare", lambda spec, out, **kw: object())
    planned = []
    monkeypatch.setattr(PL, "plan", lambda *a, **kw: planned.append(kw["started"]) or plan)
    monkeypatch.setattr(PL, "_grid", lambda spec, prep: ({}, None))
    monkeypatch.setattr(PL, "_notes", lambda *a: None)
    monkeypatch.setattr(PL, "_points", lambda *a: [])
    monkeypatch.setattr(PL, "_summary", lambda *a: 0)
    monkeypatch.setattr(PL, "render_report", lambda out, progress=True, aggregated=False, locked=False: out / "report.html")
    monkeypatch.setattr(PL, "run_points", lambda *a, **kw: [{"status": "finished"}, {"status": "skipped"}])
    began = PL.time.time() - 17.0  # the process started 17 s ago (zfree study passes its process's start)
    PL.run_experiment(PRESETS["smoke"], tmp_path / "s", estimate=True, progress=False, started=began)
    (s,) = T.read_timings(tmp_path / "s")
    assert {f"{p}_s" for p in T.PHASES} <= set(s) and s["finished"] and s["points"] == {"finished": 1, "skipped": 1}
    assert s["startup_s"] >= 17.0 and s["total_s"] >= s["startup_s"] + s["preparation_s"]
    assert planned == [began]  # the budget counts the start-up: the grid gets what is left after it
    PL.run_experiment(PRESETS["smoke"], tmp_path / "py", estimate=True, progress=False)  # from Python: no start-up
    assert "startup_s" not in T.read_timings(tmp_path / "py")[0] and planned[-1] > began + 17.0

    def interrupted(*a, **kw):
        raise KeyboardInterrupt
    monkeypatch.setattr(PL, "run_points", interrupted)
    with pytest.raises(KeyboardInterrupt):
        PL.run_experiment(PRESETS["smoke"], tmp_path / "s", progress=False)
    last = T.read_timings(tmp_path / "s")[-1]
    assert "grid_s" in last and "probes_s" not in last and "report_s" not in last and "finished" not in last

    # a refused budget: the probes' time and the refusal are kept, the session ends there
    def refuse(*a, **kw):
        raise ConfigError("--budget 30 min: the split, reference and probes took 11.1 min; give a larger budget")
    monkeypatch.setattr(PL, "plan", refuse)
    with pytest.raises(ConfigError):
        PL.run_experiment(PRESETS["smoke"], tmp_path / "r", estimate=True, progress=False)
    (r,) = T.read_timings(tmp_path / "r")
    assert "preparation_s" in r and "probes_s" in r and "grid_s" not in r and "finished" not in r
    assert r["refused"].startswith("--budget 30 min: the split, reference and probes took 11.1 min")


def _sessions():
    return [{"id": "a", "started": "2025-01-01T10:00:00+00:00", "preparation_s": 120.0, "probes_s": 240.0,
             "grid_s": 1932.0, "report_s": 70.0, "total_s": 2362.0, "points": {"finished": 9}, "finished": True}]


def test_plan_section_names_the_budget_the_estimate_and_every_cut_in_order():
    runs_all = pd.DataFrame({"wall_s": [155.0] * 9})  # issue 35: 23.3 min of wall_s in a 32.2 min grid
    md = P.plan_markdown(ESTIMATE, _sessions(), runs_all)
    assert "a budget of 30.0 min" in md and "5 runs on 1 worker(s), about 22.0 min for the grid" in md
    at = [md.index(P.md_text(c)) for c in ESTIMATE["cuts"]]
    assert at == sorted(at) and "1. evaluated rows 300 &#45;&#62; 100" in md and "7. label oracles" in md
    assert "39.4 min in all against the 30.0 min budget (+31 %)" in md  # 2362 s against 1800 s
    assert "39.6 min in all, over 2 sessions" in P.plan_markdown(ESTIMATE, [*_sessions(), {"total_s": 12.0}], runs_all)
    assert "sum to 23.2 min over 9 runs" in md and "the grid phase took 32.2 min on 1 worker(s): 8.9 worker-min went " \
        "outside the runs' `wall_s`" in md
    assert "outside" not in P.plan_markdown(ESTIMATE, _sessions(), pd.DataFrame({"wall_s": [300.0] * 9}))
    t = P.phase_table(ESTIMATE, _sessions())
    assert list(t.columns) == ["budget [min]", "estimate [min]", "measured [min]"]
    assert t.loc["grid (runs, controls, oracles)"].tolist() == ["23.0", "22.0", "32.2"]
    assert t.loc["report (tables, report.html)", "estimate [min]"] == f"{P.REPORT_S / 60:.1f}"
    assert t.loc["probes (the estimate)", "budget [min]"] == "6.0 with the start-up and preparation"
    assert t.loc["grid points", "measured [min]"] == "9 finished"
    two = P.phase_table(ESTIMATE, [*_sessions(), {"started": "later", "preparation_s": 6.0, "total_s": 6.0}])
    assert two.columns[-1] == "measured [min], session 2 (later)" and two.loc["probes (the estimate)"].iloc[-1] == "–"
    iso = P.phase_table(ESTIMATE, [*_sessions(), {"started": "2026-12-05T16:31:32+00:00", "total_s": 6.0}])
    assert iso.columns[-1] == "measured [min], session 2 (2026-12-05 16:31 UTC)"  # a head with spaces wraps
    assert t.loc["start-up (Python, imports)"].tolist() == ["–", "–", "–"]  # a session from before the start-up was timed
    assert P.plan_markdown(None, [], runs_all) == "" and P.phase_table(None, []) is None


def test_smoke_warning_when_the_runs_trained_fewer_than_the_stated_steps():
    runs = pd.DataFrame({"steps": [14, 28]})
    w = P.smoke_warning(runs, ESTIMATE)
    assert "A smoke test, not a result" in w and "trained 14–28 steps (the budget cut them: " in w
    assert "(the budget cut them: " + P.md_text(ESTIMATE["cuts"][5]) + "), fewer than 50." in w
    assert "10 steps (as the study asked), fewer than 50" in P.smoke_warning(pd.DataFrame({"steps": [10]}))
    assert "1 of 2 runs trained 10 steps" in P.smoke_warning(pd.DataFrame({"steps": [10, 500]}))
    assert P.smoke_warning(pd.DataFrame({"steps": [50, 500]}), ESTIMATE) == ""


def test_plan_section_reads_the_study_folder(tmp_path):
    (tmp_path / "runs" / "r1").mkdir(parents=True)
    (tmp_path / "runs" / "r1" / "summary.json").write_text(json.dumps({"wall_s": 60.0, "steps": 14}))
    assert P.plan_section(tmp_path, pd.DataFrame({"steps": [500]})) == ("", None)
    (tmp_path / "estimate.json").write_text(json.dumps(ESTIMATE))
    md, table = P.plan_section(tmp_path, pd.DataFrame({"steps": [14]}))
    assert md.startswith("## What was run against what was asked") and "A smoke test, not a result" in md
    assert "Cut to fit the budget, in this order" in md and list(table.columns) == ["budget [min]", "estimate [min]"]


def test_the_measured_total_says_when_the_report_being_rendered_is_not_in_it():
    """The session that renders the report has no report time yet: its total stops before the report (the
    command's own closing line counts it), so the line says so; a session whose report ended reads as before."""
    runs_all = pd.DataFrame({"wall_s": [60.0]})
    done = {"total_s": 600.0, "grid_s": 400.0, "report_s": 100.0, "finished": True}
    rendering = {"total_s": 500.0, "grid_s": 400.0}
    first = P.plan_markdown(ESTIMATE, [done], runs_all)
    assert "**Measured**: 10.0 min in all against" in first and "not counted" not in first
    line = P.plan_markdown(ESTIMATE, [done, rendering], runs_all)
    assert ("18.3 min in all, over 2 sessions (each rerun is one) up to this report (its rendering not counted) "
            "against the 30.0 min budget") in line


def test_a_study_grown_with_more_seeds_says_so_beside_its_first_estimate(tmp_path):
    (tmp_path / "estimate.json").write_text(json.dumps(ESTIMATE))
    assert P.grown_markdown(tmp_path) == ""  # no plan
    first = {"request": {"spec": {"seeds": None}}, "run_ids": ["a0", "b0"]}
    second = {"request": {"spec": {"seeds": [0, 1]}}, "run_ids": ["a0", "a1", "b0", "b1"]}
    (tmp_path / "plan.json").write_text(json.dumps({**first, "fitted": {}}))
    assert P.grown_markdown(tmp_path) == ""  # a plan that did not grow
    (tmp_path / "plan.json").write_text(json.dumps({"request": {"spec": {"seeds": [0, 1, 2]}}, "fitted": {},
                                                    "run_ids": [f"{r}{i}" for r in "ab" for i in range(3)],
                                                    "grown_from": [first, second]}))
    line = P.grown_markdown(tmp_path)
    assert line.startswith("**Grown with more seeds**: 2 runs (its own seed) → 4 runs (seeds 0, 1) → 6 runs (seeds 0, 1, 2)")
    md, _ = P.plan_section(tmp_path, pd.DataFrame({"steps": [500]}))
    assert line in md and md.index("**Estimate**") < md.index(line)


def test_the_budget_line_counts_only_this_runs_sessions():
    """Issue 59 item 4: two attempts refused by their budget (each ended at its probes) are not what
    the plan that ran spent: the measured total against the budget is this run's sessions alone,
    the refused ones named apart, and their columns marked."""
    refused = [{"id": f"r{i}", "started": f"t{i}", "preparation_s": 60.0, "probes_s": 400.0, "total_s": 460.0,
                "refused": "--budget 30 min: ..."} for i in (1, 2)]
    ran = {**_sessions()[0], "total_s": 1692.0}  # 28.2 min
    md = P.plan_markdown({**ESTIMATE, "budget_s": 39 * 60.0}, [*refused, ran], pd.DataFrame({"wall_s": [155.0] * 9}))
    assert "**Measured**: 28.2 min in all against the 39.0 min budget (-28 %)" in md
    assert "not counted: 2 earlier attempt(s) the budget refused before this plan (15.3 min, their probes kept)" in md
    t = P.phase_table(ESTIMATE, [*refused, ran])
    assert t.columns[2].endswith(", refused by its budget") and not t.columns[-1].endswith("refused by its budget")


def test_a_missing_oracle_says_which_cut_removed_it():
    """Issue 59 item 4: where the budget cut every label oracle, the oracle section names that cut
    (not "no label with two or more values"); where it cut some, it names the labels that lost theirs."""
    est = {**ESTIMATE, "cuts": ["evaluated rows 300 -> 100", "label oracles ['category', 'length'] -> ['category'] "
                                "(at 10 steps the grid needs 30.1 min, 20.0 are left)",
                                "label oracles ['category'] -> none",
                                "steps x 0.40 (unaided 50 -> 20, aided 100 -> 40)"]}
    md = P.oracle_cut_markdown(est, pd.DataFrame())
    assert md.startswith("**No label oracle in this study: the budget cut them** (cut 2 of 4, <code>")
    assert "cut 3 of 4, <code>label oracles" in md and "two or more values" not in md
    assert "What z could gain from <code>category</code>, <code>length</code> went unmeasured" in md
    partial = {**est, "cuts": est["cuts"][:2]}
    some = P.oracle_cut_markdown(partial, pd.DataFrame({"label": ["category"]}))
    assert some.startswith("⚠ The budget cut the label oracle of <code>length</code> (cut 2 of 2")
    assert P.oracle_cut_markdown(ESTIMATE, pd.DataFrame()).startswith("⚠ The budget cut the label oracle of "
                                                                      "<code>lexfile</code> (cut 7 of 7")
    assert P.oracle_cut_markdown({"cuts": ["batch 32 -> 8 rows a step"]}, pd.DataFrame()) == ""
    assert P.oracle_cut_markdown(None, pd.DataFrame()) == ""


def test_multi_reference_bleu_only_where_the_data_has_multiple_references(tmp_path):
    """Issue 59 item 4: the multi-reference section needs an x with two or more y among the
    validation rows, on conditional data; unconditional rows (one empty x) have none."""
    from zfree_lab.report.labels_report import multiple_references

    def study(name, xs, conditioning="conditional"):
        d = tmp_path / name
        d.mkdir()
        (d / "val.jsonl").write_text("".join(json.dumps({"x": x, "y": f"y{i}"}) + "\n" for i, x in enumerate(xs)))
        (d / "notes.json").write_text(json.dumps({"notes": [], "conditioning": conditioning}))
        return d
    assert multiple_references(study("e2e", ["mr1", "mr1", "mr2"]))
    assert not multiple_references(study("unique", ["a", "b", "c"]))
    assert not multiple_references(study("uncond", ["", "", ""], "unconditional"))
    assert multiple_references(tmp_path / "nothing")  # cannot tell: the section stays


def test_rate_mi_and_codes_used_stand_together():
    """Issue 59 item 4: the run tables show the rate (KL), the mutual information and the codes
    used side by side (a rate on one code carries nothing)."""
    from zfree_lab.report import report as R

    summary = pd.DataFrame({"run_id": ["a"], "weighting": ["plain"], "aid": ["hard_em_then_soft"], "beta": [1.0],
                            "kl_prior_loss": [1.22], "mutual_information": [0.026], "codes_used": [1],
                            "measured_use_fraction": [0.0]})
    cols = list(R.run_table(summary, R.USE_COLUMNS).columns)
    i = cols.index("KL [nats]")
    assert cols[i:i + 3] == ["KL [nats]", "MI [nats]", "codes used"]
    assert "codes used" not in R.QUALITY_COLUMNS.values()
    outcome = R.aided_tables(summary)[1]
    j = list(outcome.columns).index("KL [nats]")
    assert list(outcome.columns)[j:j + 3] == ["KL [nats]", "MI [nats]", "codes used"]


def test_unconditional_data_is_said_at_the_top(tmp_path):
    """Issue 59 item 4: on unconditional data the report's first lines say so (the split's note:
    x dropped, y modelled alone), above the plan section; conditional data says nothing there."""
    (tmp_path / "runs").mkdir()
    note = "unconditional: x is one constant prompt in every row (dropped), so the study models y alone"
    (tmp_path / "notes.json").write_text(json.dumps({"notes": [note, "labels ['category']: ..."],
                                                     "conditioning": "unconditional"}))
    (tmp_path / "estimate.json").write_text(json.dumps(ESTIMATE))
    md, _ = P.plan_section(tmp_path, pd.DataFrame({"steps": [500]}))
    assert md.startswith("**Unconditional data.** x is one constant prompt")  # not "Unconditional data. unconditional: x"
    assert md.index("**Unconditional data.**") < md.index("## What was run against what was asked")
    (tmp_path / "notes.json").write_text(json.dumps({"notes": [], "conditioning": "conditional"}))
    assert P.plan_section(tmp_path, pd.DataFrame({"steps": [500]}))[0].startswith("## What was run")


def test_zfree_study_counts_its_process_start_up_in_the_budget(tmp_path, monkeypatch):
    """Issue 59: `/usr/bin/time` gave 31:37 where the report said 31.3 min: the ~18 s of interpreter start and
    imports before the study's clock began were in neither the budget nor the measured time. ``zfree study``
    now passes its process's start (psutil) to the pipeline, for the own-model and the preset path alike."""
    import psutil
    from types import SimpleNamespace

    import zfree_lab.experiment.own_study as own_study
    import zfree_lab.experiment.study as study
    from zfree_lab.cli import main

    calls: list = []
    monkeypatch.setattr(own_study, "run_experiment", lambda *a, **kw: calls.append(kw)
                        or SimpleNamespace(html=tmp_path / "report.html", out=tmp_path))
    monkeypatch.setattr(study, "run_study", lambda *a, **kw: calls.append(kw) or tmp_path / "report.html")
    data = tmp_path / "d.jsonl"
    data.write_text('{"x": "a", "y": "b"}\n')
    import sys

    model = tmp_path / "m"  # a model folder, never loaded (an empty one is refused before anything else)
    model.mkdir()
    (model / "config.json").write_text("{}")
    for argv in (["study", "--model", str(model), "--data", str(data), "--out", str(tmp_path / "o")],
                 ["study", "--preset", "smoke", "--out", str(tmp_path / "p")]):
        monkeypatch.setattr(sys, "argv", ["zfree", *argv])  # as the `zfree` script calls it: main() reads sys.argv
        assert main() == 0
    assert [kw["started"] for kw in calls] == [psutil.Process().create_time()] * 2


def test_the_same_command_over_a_finished_study_names_its_report_instead_of_rendering_it_again(tmp_path, monkeypatch,
                                                                                              capsys):
    """A rerun that trained nothing, report.html newer than every run file, base record and the report's
    code: the report is named "up to date", not rendered again (it took 3 min on a finished study);
    a run file written after it, a missing report or a point that trained renders it."""
    import os

    from zfree_lab.experiment import pipeline as PL
    from zfree_lab.experiment.study_folders import report_is_current

    study = tmp_path / "s"
    (study / "runs" / "r1").mkdir(parents=True)
    (study / "base").mkdir()
    for f in (study / "runs" / "r1" / "summary.json", study / "base" / "reference.json"):
        f.write_text("{}")
        os.utime(f, ns=(10**18, 10**18))  # long before the report below
    rendered = []
    monkeypatch.setattr(PL, "_summary", lambda out: 1)
    monkeypatch.setattr(PL, "render_report", lambda out, **kw: rendered.append(out) or out / "report.html")
    clock = T.PhaseClock(study, 0.0)
    skipped = [{"run_id": "r1", "status": "skipped"}]

    assert not report_is_current(study)  # no report yet: rendered
    PL._finish("s", study, 1, skipped, clock, 0.0, progress=False, render=True)
    assert rendered == [study]
    (study / "report.html").write_text("<html/>")  # written now: after the runs and after the installed code
    assert not report_is_current(study)  # a render writes report.ipynb beside it
    (study / "report.ipynb").write_text("{}")
    assert report_is_current(study)
    res = PL._finish("s", study, 1, skipped, clock, 0.0, progress=True, render=True)
    assert rendered == [study] and res.html == study / "report.html"
    assert f"report: {study / 'report.html'} (up to date: nothing trained since it was rendered; `zfree report" \
        in capsys.readouterr().out
    PL._finish("s", study, 1, [{"run_id": "r1", "status": "finished"}], clock, 0.0, progress=False, render=True)
    assert rendered == [study, study]  # a point trained: rendered whatever the times
    later = (study / "report.html").stat().st_mtime_ns + 10**9
    for f in (study / "base" / "reference.json", study / "runs" / "r1" / "summary.json"):
        os.utime(f, ns=(later, later))  # a record written after the report: not current
        assert not report_is_current(study)
        os.utime(f, ns=(10**18, 10**18))
    assert report_is_current(study)
    (study / "runs" / "r1" / ".zfree.lock").write_text("pid")  # a lock file's writes are not the run's
    assert report_is_current(study)
    (study / "report.html").unlink()  # a link there (planted, or a copy's) is never current: rendering replaces it
    (study / "report.html").symlink_to(tmp_path / "elsewhere.html")
    (tmp_path / "elsewhere.html").write_text("precious")
    assert not report_is_current(study)
