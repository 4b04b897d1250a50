"""The explorers, driven headlessly: set a widget's value, read what it selected and drew."""

from __future__ import annotations

import shutil
from concurrent.futures import Future

import numpy as np
import pytest

from tests.tiny_sweep import make_tiny_sweep
from zfree.io import atomic_write_json, read_json
from zfree.widgets import LaunchPanel, SweepExplorer


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
        shutil.copytree(self.template, dst)
        s = read_json(f"{dst}/summary.json")
        atomic_write_json(f"{dst}/summary.json", {**s, **point.params})
        self.submitted.append(point)
        f = Future()
        f.set_result({"run_id": point.run_id, "status": "finished"})
        return f

    def shutdown(self, wait=True):
        pass


def test_launch_panel_expands_its_grid_runs_it_and_refreshes_the_explorer(sweep, tmp_path):
    target = tmp_path / "sweep"
    shutil.copytree(sweep, target)
    e = SweepExplorer(target)
    template = e.results.runs["run_dir"].iloc[0]
    ex = CopyExecutor(template)
    panel = LaunchPanel(e.results.config(e.results.runs["run_id"].iloc[0]), target, explorer=e, make_executor=lambda: ex)
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
    assert len(e.results.runs) == 6 + 8 and 0.01 in e.beta.options[0] or 0.01 in [v for _, v in e.beta.options]
    assert panel.label.value.startswith("done: 8/8")


def test_launch_panel_reports_an_invalid_grid_without_running(sweep, tmp_path):
    panel = LaunchPanel({"beta_schedule": "bogus"}, tmp_path, make_executor=lambda: pytest.fail("must not run"))
    panel.weightings.value = ("plain",)
    assert panel.launch() is None and panel.label.value.startswith("invalid") and "beta_schedule" in panel.label.value
