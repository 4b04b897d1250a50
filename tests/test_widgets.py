"""The explorers, driven headlessly: set a widget's value, read what it selected and drew."""

from __future__ import annotations

import shutil
import time
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest

from tests.tiny_sweep import make_tiny_sweep
from zfree.core.io import atomic_write_json, read_json
from zfree_lab.report.figstyle import wrap_panels
from zfree_lab.report.widgets import LaunchPanel, SweepExplorer


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return make_tiny_sweep(tmp_path_factory)


def test_explorer_redraws_every_figure_and_filters(sweep):
    e = SweepExplorer(sweep)
    assert len(e.results.runs) == 6 and set(e.weighting.options) == {"all", "plain", "distribution", "example"}
    for kind in e.FIGURES:
        e.figure_kind.value = kind
        assert e.figure is not None, kind
    e.figure_kind.value = "rate_distortion"
    e.weighting.value = "distribution"
    assert set(e.selected["weighting"]) == {"distribution"}
    labels = [ln.get_label() for ln in e.figure.axes[0].lines if not ln.get_label().startswith("_")]
    assert "distribution" in labels and "plain" not in labels


def test_a_redraw_says_it_is_drawing_before_the_figure_changes(sweep):
    """A new user's explorer kept the old figure 10-40 s after the figure dropdown changed (a loaded machine), with
    nothing saying a new one was being drawn: the status line says so first, then counts the runs shown."""
    e = SweepExplorer(sweep)
    said = []
    e.status.observe(lambda ch: said.append((ch["new"], len(e.out.outputs) and e.out.outputs[0]["data"]["image/png"])),
                     names="value")
    before = e.out.outputs[0]["data"]["image/png"]
    other = next(k for k in e.FIGURES if k != e.figure_kind.value)  # another figure than the one shown
    e.figure_kind.value = other
    drawing = [i for i, (v, _) in enumerate(said) if f"drawing the {other} figure" in v]
    assert drawing and said[drawing[0]][1] == before  # said while the old figure is still up
    assert said[-1][0].startswith("6 finished runs") and e.out.outputs[0]["data"]["image/png"] != before


def test_the_figure_reaches_the_output_as_a_png_under_any_backend(sweep):
    """The tests run under MPLBACKEND=Agg, where display(fig) would show only "<Figure size ...>"."""
    import base64

    import matplotlib

    assert matplotlib.get_backend().lower() == "agg"
    e = SweepExplorer(sweep)
    (out,) = e.out.outputs
    assert base64.b64decode(out["data"]["image/png"]).startswith(b"\x89PNG"), out["data"].get("text/plain")


def test_a_redraw_from_another_thread_replaces_the_figure(sweep):
    """The launch panel refreshes the explorer from its own thread: the new figure must reach the
    Output there too (capturing with `with out:` works on the kernel's main thread only)."""
    import threading

    e = SweepExplorer(sweep, figure="dynamics")
    before = e.out.outputs[0]["data"]["image/png"]
    e._hold = True
    e.figure_kind.value = "rate_distortion"
    e._hold = False
    t = threading.Thread(target=e.refresh)
    t.start()
    t.join()
    (out,) = e.out.outputs
    assert out["data"]["image/png"] != before


def test_every_explorer_figure_draws_each_glyph(sweep):
    """No text of an explorer figure holds a combining mark (matplotlib draws ℓ + U+0304 with the bar
    through the ℓ: mathtext's \\bar is used instead) or a character its font lacks."""
    import io
    import unicodedata
    import warnings

    from matplotlib.text import Text

    e = SweepExplorer(sweep)
    for kind in e.FIGURES:
        e.figure_kind.value = kind
        texts = [t.get_text() for t in e.figure.findobj(Text)]
        assert not [t for t in texts if any(unicodedata.combining(ch) for ch in t)], kind
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*missing from font.*")
            e.figure.savefig(io.BytesIO(), format="png")


def test_sliders_select_the_runs_drawn(sweep):
    e = SweepExplorer(sweep, figure="dynamics")
    e.beta.value = 1.0
    e.weight.value = 1.0  # plain's row
    assert list(e.selected["weighting"]) == ["plain"] and list(e.selected["beta"]) == [1.0]
    e.figure_kind.value = "effective_beta"
    e.beta.value = 0.3
    assert set(e.selected["beta"]) == {0.3} and len(e.selected) == 3  # one run per weighting
    e.figure_kind.value = "phase"
    hl = [c for c in e.figure.axes[0].collections if c.get_offsets().shape == (1, 2) and c.get_edgecolor().size
          and np.allclose(c.get_edgecolor()[0][:3], (1, 0, 0))]
    np.testing.assert_allclose(hl[0].get_offsets()[0], [0.3, 1.0])


class CopyExecutor:
    """Stands in for the process pool: 'runs' a point by copying a finished run under its id."""

    def __init__(self, template):
        self.template, self.submitted = template, []

    def submit(self, fn, point, runs_dir, notebook):
        dst = f"{runs_dir}/{point.run_id}"
        if Path(dst).exists():
            raise FileExistsError(dst)  # as a refused job: the panel must report it
        shutil.copytree(self.template, dst)
        s = read_json(f"{dst}/summary.json")
        atomic_write_json(f"{dst}/summary.json", {**s, **point.params})
        self.submitted.append(point)
        f = Future()
        f.set_result({"run_id": point.run_id, "status": "finished"})
        return f

    def shutdown(self, wait=True):
        pass


def test_launch_panel_runs_into_its_own_folder_and_the_explorer_shows_both(sweep, tmp_path):
    target = tmp_path / "sweep"
    shutil.copytree(sweep, target)
    e = SweepExplorer([target, target / "launched"])
    assert e.source.layout.display == "none"  # one source so far: no single-option dropdown
    template = e.results.runs["run_dir"].iloc[0]
    ex = CopyExecutor(template)
    panel = LaunchPanel(e.results.config(e.results.runs["run_id"].iloc[0]), target / "launched", explorer=e,
                        make_executor=lambda: ex)
    panel.log_beta.value = (-2.0, -1.0)
    panel.n_beta.value = 2
    panel.weightings.value = ("plain", "example")
    panel.seeds.value = 2
    points = panel.points()
    assert len(points) == 8
    assert {p.params["epsilon"] for p in points if p.params["weighting"] == "example"} == {panel.epsilon.value}
    assert sorted({p.params["beta"] for p in points}) == [0.01, 0.1]
    panel.launch(wait=True)
    assert panel.progress.value == panel.progress.max == 8 and len(ex.submitted) == 8
    assert len(list((target / "runs").glob("*/summary.json"))) == 6  # the study's own runs untouched
    assert len(list((target / "launched" / "runs").glob("*/summary.json"))) == 8
    assert len(e.results.runs) == 6 + 8 and 0.01 in [v for _, v in e.beta.options]
    assert list(e.source.options) == ["all", "launched", "study"] and e.source.layout.display is None
    e.source.value = "launched"
    assert set(e.selected["run_id"]) <= {p.run_id for p in points} and len(e.selected)
    assert panel.label.value.startswith("done: 8/8")
    panel.n_beta.value = 1  # issue 36 item 6: one β is the template's, not the slider's lower end
    template_beta = e.results.config(e.results.runs["run_id"].iloc[0])["beta"]
    assert panel.betas() == [template_beta] and "(the template's)" in panel.beta_readout.value
    panel.launch(wait=False)  # a new launch starts from an empty label, not the last "done"
    assert not panel.label.value.startswith("done: 8/8")
    panel.thread.join()
    assert panel.label.value.startswith("done: 4/4") and {s["status"] for s in panel.statuses} == {"finished"}
    panel.n_beta.value, panel.log_beta.value = 2, (-2.0, -1.0)
    panel.launch(wait=True)
    # the same 8 points again: finished points are skipped, never resubmitted (run_points)
    assert panel.label.value.startswith("done: 8/8") and len(ex.submitted) == 8 + 4
    assert {s["status"] for s in panel.statuses} == {"skipped"}


def test_launch_panel_shows_the_config_diff_and_lets_the_aid_be_chosen(sweep, tmp_path):
    e = SweepExplorer(sweep)
    template = {**e.results.config(e.results.runs["run_id"].iloc[0]), "aid": "hard_em_then_soft",
                "hard_em_max_steps": 400}
    panel = LaunchPanel(template, tmp_path, steps=50)
    panel.weightings.value = ("plain",)
    diff = panel.diff(panel.points()).set_index("field")
    assert diff.loc["aid", "template"] == "hard_em_then_soft" and diff.loc["aid", "launched"] == "none"
    assert diff.loc["steps", "launched"] == "50" and "beta" in diff.index
    assert ">aid</td>" in panel.plan.value and "⚠" not in panel.plan.value
    panel.aid.value = "hard_em_then_soft"
    assert "aid" not in panel.diff(panel.points())["field"].tolist() and "handover_step None" in panel.plan.value
    panel.aid.value = "hard_em_then_soft: HARD_EM_RECIPE"
    diff = panel.diff(panel.points()).set_index("field")
    assert diff.loc["hard_em_max_steps", "launched"] == "800" and diff.loc["n_latent", "launched"] == "6"
    assert set(panel.aid.options) >= {"none", "hard_em_then_soft", "beta0_warmup", "random_init_jsd"}
    panel.aid.value = "hard_em_then_soft: SWITCH_ON_RECIPE"  # the default study's aid
    diff = panel.diff(panel.points()).set_index("field")
    assert diff.loc["posterior_features", "launched"] == "optimal" and diff.loc["batch_size", "launched"] == "32"


def sleepy_run(point, runs_dir, notebook):
    """A stand-in for run_point: the smaller β finishes at once, the other runs for minutes."""
    d = Path(runs_dir) / point.run_id
    d.mkdir(parents=True, exist_ok=True)
    if point.params["beta"] > 0.05:
        time.sleep(300)
    atomic_write_json(d / "summary.json", {"beta": point.params["beta"]})
    return {"run_id": point.run_id, "status": "finished"}


def test_stop_ends_the_workers_and_keeps_the_finished_runs(sweep, tmp_path):
    """Issue 36 item 3: six points on two workers, stop pressed with two finished, two running and two
    not started: the panel is launchable again within seconds (it sat in as_completed forever when the
    points not started were cancelled before the pool went down), every point has a status."""
    from zfree_lab.experiment.executor import local_executor

    e = SweepExplorer(sweep)
    panel = LaunchPanel(e.results.config(e.results.runs["run_id"].iloc[0]), tmp_path, run_fn=sleepy_run,
                        make_executor=lambda: local_executor(2))
    panel.log_beta.value, panel.n_beta.value, panel.weightings.value = (-2.0, 0.0), 6, ("plain",)
    panel.launch()
    for _ in range(600):
        if len(panel.statuses) >= 2:
            break
        time.sleep(0.1)
    time.sleep(0.5)  # the two slow points started
    procs = list(panel._ex._processes.values())
    t0 = time.time()
    panel.stop(timeout=20)
    assert not panel.thread.is_alive() and time.time() - t0 < 20
    assert not any(p.is_alive() for p in procs)
    assert panel.label.value == "stopped: 2/6 finished", panel.label.value
    assert _bar(panel) == (2, 6, "warning", "stopped")  # the finished share, not every status
    assert sorted(s["status"] for s in panel.statuses) == ["finished"] * 2 + ["stopped"] * 4  # started or not
    assert len(list((tmp_path / "runs").glob("*/summary.json"))) == 2
    assert not panel.button.disabled and panel.stop_button.disabled


def test_explorer_offers_only_what_the_data_has(sweep, tmp_path):
    e = SweepExplorer(sweep, figure="rate_distortion")
    assert e.latent_kind.layout.display == "none" and "latent kind: discrete" in e.note.value
    assert e.beta.disabled and "not read" in e.beta_note.value  # rate-distortion draws every run
    e.figure_kind.value = "dynamics"
    e.weighting.value = "plain"
    assert not e.beta.disabled and e.weight.disabled and "one value" in e.weight_note.value
    one = tmp_path / "one_beta_each"  # plain at one β, distribution at another
    (one / "runs").mkdir(parents=True)
    runs = e.results.runs
    for w, b in (("plain", 0.3), ("distribution", 1.0)):
        rid = runs[(runs["weighting"] == w) & (runs["beta"] == b)]["run_id"].iloc[0]
        shutil.copytree(sweep / "runs" / rid, one / "runs" / rid)
    e1 = SweepExplorer(one, figure="effective_beta")
    assert len(e1.beta.options) == 2 and e1.beta.disabled and "one β per weighting" in e1.beta_note.value


def test_wrap_panels_lays_many_panels_out_in_rows():
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 8, squeeze=False)
    wrap_panels(fig, ncols=4)
    rows = sorted({round(ax.get_position().y0, 3) for ax in axes[0]})
    cols = sorted({round(ax.get_position().x0, 3) for ax in axes[0]})
    assert len(rows) == 2 and len(cols) == 4 and tuple(fig.get_size_inches()) == (4.4 * 4, 3.8 * 2)
    plt.close(fig)


def test_launch_panel_reports_an_invalid_grid_without_running(sweep, tmp_path):
    panel = LaunchPanel({"beta_schedule": "bogus"}, tmp_path, make_executor=lambda: pytest.fail("must not run"))
    panel.weightings.value = ("plain",)
    assert panel.launch() is None and panel.label.value.startswith("invalid") and "beta_schedule" in panel.label.value


def test_a_real_launch_from_a_moved_study_finishes(sweep, tmp_path):
    """The panel's template is a run's config.json, whose folders are stored relative to that run;
    a run launched one folder deeper, from a copy of the study, must find them (every launch failed
    with 'zfree:data/... does not exist' or '../../data/train.jsonl does not exist')."""
    moved = tmp_path / "moved study"
    shutil.copytree(sweep, moved)
    e = SweepExplorer(moved)
    run_id = e.results.runs["run_id"].iloc[0]
    cfg_file = moved / "runs" / run_id / "config.json"
    cfg = read_json(cfg_file)
    for key, name in (("data_dir", "data"), ("base_dir", "base")):  # data and base inside the study, as own studies keep them
        shutil.copytree(cfg[key] if Path(cfg[key]).is_absolute() else cfg_file.parent / cfg[key], moved / name)
        cfg[key] = f"../../{name}"
    atomic_write_json(cfg_file, cfg)
    template = e.results.config(run_id)
    assert template["data_dir"] == str((moved / "data").resolve()) and template["base_dir"] == str((moved / "base").resolve())
    panel = LaunchPanel(template, moved / "launched", explorer=e, workers=1, steps=2)
    panel.log_beta.value, panel.n_beta.value, panel.weightings.value = (-1.0, -1.0), 1, ("plain",)
    panel.launch(wait=True)
    assert panel.label.value.startswith("done: 1/1"), panel.label.value
    (launched,) = list((moved / "launched" / "runs").glob("*/summary.json"))
    assert read_json(launched)["steps"] == 2


def test_a_failed_launch_says_failed_with_its_reason_and_folder(sweep, tmp_path):
    e = SweepExplorer(sweep)
    template = {**e.results.config(e.results.runs["run_id"].iloc[0]), "data_dir": str(tmp_path / "no such data")}
    panel = LaunchPanel(template, tmp_path / "launched", workers=1, steps=2)
    panel.log_beta.value, panel.n_beta.value, panel.weightings.value = (-1.0, -1.0), 1, ("plain",)
    panel.launch(wait=True)
    label = panel.label.value
    assert label.startswith("failed: 0/1 ok; 1 failed, first ") and "does not exist" in label, label
    assert "error.json" in label and "done" not in label


def test_an_empty_grid_plans_0_runs_and_is_not_launched(sweep, tmp_path):
    """Issue 60: with every weighting deselected the plan kept "1 run(s)" (describe died on an IndexError in
    warnings, seen only in the server log) and launch ended "done: 0/0 ok". Now the plan says 0 runs and why,
    the button is disabled, and launch refuses in the status line without starting an executor."""
    e = SweepExplorer(sweep)
    panel = LaunchPanel(e.results.config(e.results.runs["run_id"].iloc[0]), tmp_path,
                        make_executor=lambda: pytest.fail("must not run"))
    assert not panel.button.disabled
    panel.weightings.value = ()
    assert panel.plan.value == "<b>0 runs:</b> no weighting is selected; select at least one to launch"
    assert panel.button.disabled
    assert panel.launch() is None and panel.thread is None
    assert panel.label.value == "nothing to launch: 0 runs (no weighting is selected; select at least one to launch)"
    panel.weightings.value = ("plain",)
    assert panel.plan.value.startswith("<div>3 run(s) into") and not panel.button.disabled


class HangExecutor:
    """Stands in for an executor whose runs never end: every future pending until ``stop`` (the
    executor's own stop, as a SLURM executor's ``scancel``: ``stop_workers`` calls it) cancels them."""

    def __init__(self):
        self.submitted = []

    def submit(self, fn, point, runs_dir, notebook):
        self.submitted.append(Future())
        return self.submitted[-1]

    def stop(self):
        for f in self.submitted:
            f.cancel()
            f.set_running_or_notify_cancel()  # as an executor does: as_completed then sees it

    def shutdown(self, wait=True):
        pass


class FailExecutor:
    """Stands in for a pool whose every run fails (as run_point records a failure)."""

    def submit(self, fn, point, runs_dir, notebook):
        f = Future()
        f.set_result({"run_id": point.run_id, "status": "failed", "error": "ValueError: boom"})
        return f

    def shutdown(self, wait=True):
        pass


def _bar(panel):
    return panel.progress.value, panel.progress.max, panel.progress.bar_style, panel.progress.description


def test_the_bar_shows_the_finished_share_and_the_state_after_a_stop(sweep, tmp_path):
    """Issue 60: stopped with 0/6 finished, the bar was full (it counted every status, cancelled ones
    too). It shows 0 of 6 now, coloured and labelled "stopped"; a new launch starts it plain again."""
    e = SweepExplorer(sweep)
    ex = HangExecutor()
    panel = LaunchPanel(e.results.config(e.results.runs["run_id"].iloc[0]), tmp_path, make_executor=lambda: ex)
    panel.log_beta.value, panel.n_beta.value, panel.weightings.value = (-2.0, 0.0), 6, ("plain",)
    panel.launch()
    for _ in range(200):
        if len(panel._futures) == 6:
            break
        time.sleep(0.05)
    assert _bar(panel) == (0, 6, "", "runs")
    panel.stop(timeout=20)
    assert not panel.thread.is_alive() and panel.label.value == "stopped: 0/6 finished", panel.label.value
    assert sorted(s["status"] for s in panel.statuses) == ["cancelled"] * 6
    assert _bar(panel) == (0, 6, "warning", "stopped")
    panel.make_executor = lambda: CopyExecutor(e.results.runs["run_dir"].iloc[0])
    panel.launch(wait=True)
    assert panel.label.value == "done: 6/6 ok" and _bar(panel) == (6, 6, "success", "done")


def test_the_bar_shows_the_finished_share_and_the_state_after_a_failure(sweep, tmp_path):
    """Issue 60: after a failure the bar was full as after a success; it shows what finished (none
    here) and the state, red."""
    e = SweepExplorer(sweep)
    panel = LaunchPanel(e.results.config(e.results.runs["run_id"].iloc[0]), tmp_path,
                        make_executor=FailExecutor)
    panel.log_beta.value, panel.n_beta.value, panel.weightings.value = (-2.0, 0.0), 2, ("plain",)
    panel.launch(wait=True)
    assert panel.label.value.startswith("failed: 0/2 ok; 2 failed, first "), panel.label.value
    assert _bar(panel) == (0, 2, "danger", "failed")
