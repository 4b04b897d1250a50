"""One ExperimentSpec for presets, YAML sweeps and own-model grids; one pipeline for all three;
the launch panel on the sweeps' executor loop; OWN_AID as HARD_EM_RECIPE with its differences."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import zfree.experiment.pipeline as pipeline
import zfree.report.widgets as widgets
from tests.tiny_sweep import make_tiny_sweep
from zfree.core.paths import SPECS
from zfree.experiment.own_study import OWN_AID, OWN_PRESETS, load_own_spec, run_own_study
from zfree.experiment.pipeline import ExperimentResult
from zfree.experiment.spec import BoundaryGrid, ExperimentSpec, expand_grid, spec_from_dict
from zfree.experiment.study import HARD_EM_RECIPE, PRESETS, run_study
from zfree.experiment.sweeps import load_spec, run_sweep

SHIPPED = sorted(SPECS.glob("*.yaml"))


def test_presets_yaml_specs_and_own_grids_are_all_experiment_specs(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text(yaml.safe_dump({"weightings": ["plain"], "beta_factors": [0.5], "aids": ["none"],
                                 "train": {"steps": 3}, "val_size": 7}))
    specs = [*PRESETS.values(), *OWN_PRESETS.values(), *(load_spec(p, check_paths=False) for p in SHIPPED),
             load_own_spec(f)]
    assert all(type(s) is ExperimentSpec for s in specs)
    own = load_own_spec(f)
    assert (own.name, own.val_size, own.train, own.data.kind, own.base.kind) == ("mine", 7, {"steps": 3}, "jsonl",
                                                                                  "pretrained")
    assert own.boundary == BoundaryGrid(("plain",), (0.5,), ("none",), OWN_AID)
    assert {load_spec(p, check_paths=False).data.kind for p in SHIPPED} == {"fields"}


@pytest.mark.parametrize("spec", [*PRESETS.values(), *OWN_PRESETS.values(),
                                  *(load_spec(p, check_paths=False) for p in SHIPPED)], ids=lambda s: s.name)
def test_a_spec_round_trips_through_json(spec):
    back = spec_from_dict(json.loads(json.dumps(spec.to_dict())))
    assert back == spec
    if spec.boundary is None:
        assert [p.run_id for p in back.points()] == [p.run_id for p in spec.points()]


def test_the_smoke_preset_keeps_its_values():
    """The golden runs (tests/golden_runs.py) read these: data, base, train and grid."""
    p = PRESETS["smoke"]
    assert (p.data.kind, p.data.config.n_train, p.data.config.n_val, p.base.kind, p.base.config.max_steps) == (
        "synthetic", 600, 60, "trained", 150)
    assert p.grid == {"weighting": ["plain", "distribution"], "beta": [0.3]}
    assert len(expand_grid(p.train, p.grid)) == 2


def test_own_aid_is_the_hard_em_recipe_apart_from_the_stated_keys():
    differ = {k for k in HARD_EM_RECIPE if OWN_AID[k] != HARD_EM_RECIPE[k]}
    assert set(OWN_AID) == set(HARD_EM_RECIPE)
    assert differ == {"n_latent", "hard_em_max_steps", "handover_rows", "lr_new"}
    assert (OWN_AID["n_latent"], OWN_AID["hard_em_max_steps"], OWN_AID["handover_rows"], OWN_AID["lr_new"]) == (
        4, 200, 200, 1e-3)


def test_study_own_study_and_sweep_all_run_through_the_one_pipeline(tmp_path, monkeypatch):
    seen = []

    def fake(spec, out, **kw):
        seen.append((spec, kw))
        return ExperimentResult(Path(out), [], Path(out) / "report.html")

    for mod in ("zfree.experiment.study", "zfree.experiment.own_study", "zfree.experiment.sweeps"):
        monkeypatch.setattr(f"{mod}.run_experiment", fake)
    assert pipeline.run_experiment is not fake  # the wrappers' own reference is what is replaced
    run_study("smoke", tmp_path / "a", progress=False)
    run_own_study("some/model", tmp_path / "d.jsonl", tmp_path / "b", val=tmp_path / "v.jsonl", preset="own_smoke",
                  finetune=True, finetune_steps=5)
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"name": "s", "grid": {"beta": [0.1, 0.2]}}))
    run_sweep(load_spec(f, check_paths=False), tmp_path / "c", progress=False)
    (smoke, _), (own, own_kw), (sweep, sweep_kw) = seen
    assert smoke is PRESETS["smoke"]
    assert (own.data.kind, own.data.path, own.data.val, own.data.val_size) == ("jsonl", tmp_path / "d.jsonl",
                                                                              tmp_path / "v.jsonl", 12)
    assert (own.base.kind, own.base.path, own.base.finetune_steps) == ("pretrained", "some/model", 5)
    assert own.boundary == OWN_PRESETS["own_smoke"].boundary and own_kw["render"] is True
    assert sweep.data.kind == "fields" and sweep_kw["render"] is False
    assert json.loads((tmp_path / "c" / "spec.json").read_text())["run_ids"] == [p.run_id for p in sweep.points()]


def test_the_launch_panel_runs_through_the_shared_executor_loop(tmp_path_factory, tmp_path, monkeypatch):
    sweep = make_tiny_sweep(tmp_path_factory)
    calls = []

    def fake_run_points(points, runs_dir, **kw):
        calls.append((points, Path(runs_dir), kw))
        for p in points:
            kw["on_done"]({"run_id": p.run_id, "status": "finished"})
        return []

    monkeypatch.setattr(widgets, "run_points", fake_run_points)
    e = widgets.SweepExplorer(sweep)
    panel = widgets.LaunchPanel(e.results.config(e.results.runs["run_id"].iloc[0]), tmp_path / "launched",
                                make_executor=lambda: FakeExecutor())
    panel.weightings.value = ("plain",)
    panel.launch(wait=True)
    (points, runs_dir, kw), = calls
    assert [p.run_id for p in points] == [p.run_id for p in panel.points()] and runs_dir == tmp_path / "launched" / "runs"
    assert kw["run_fn"] is panel.run_fn and kw["stopping"] is panel._stopping and isinstance(kw["executor"], FakeExecutor)
    assert panel.label.value.startswith(f"done: {len(points)}/{len(points)}")


class FakeExecutor:
    def submit(self, fn, *args):
        raise AssertionError("the panel's loop is run_points': it submits nothing itself")

    def shutdown(self, wait=True):
        pass
