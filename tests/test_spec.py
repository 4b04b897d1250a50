"""One ExperimentSpec for presets, YAML sweeps and own-model grids; one pipeline for all three;
the launch panel on the sweeps' executor loop; OWN_AID as HARD_EM_RECIPE with its differences."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import zfree_lab.experiment.pipeline as pipeline
import zfree_lab.report.launch_panel as launch_panel
import zfree_lab.report.widgets as widgets
from tests.scripts import load_script
from tests.tiny_sweep import make_tiny_sweep
from zfree.core.paths import SPECS
from zfree.objective.remedies import HARD_EM_RECIPE, OWN_AID
from zfree_lab.experiment.own_study import OWN_PRESETS, load_own_spec, run_own_study
from zfree_lab.experiment.pipeline import ExperimentResult
from zfree_lab.experiment.spec import BoundaryGrid, ExperimentSpec, expand_grid
from zfree_lab.experiment.spec_file import spec_from_dict
from zfree_lab.experiment.study import PRESETS, run_study
from zfree_lab.experiment.sweeps import load_spec, run_sweep

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

    for mod in ("zfree_lab.experiment.study", "zfree_lab.experiment.own_study", "zfree_lab.experiment.sweeps"):
        monkeypatch.setattr(f"{mod}.run_experiment", fake)
    assert pipeline.run_experiment is not fake  # the wrappers' own reference is what is replaced
    run_study("smoke", tmp_path / "a", progress=False)
    for name in ("d.jsonl", "v.jsonl"):  # the data files are checked (regular, within the limits) up front
        (tmp_path / name).write_text('{"x": "a", "y": "b"}\n')
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

    monkeypatch.setattr(launch_panel, "run_points", fake_run_points)
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


# --- seeds (issue 23, item 1) -------------------------------------------------------------------

def test_seeds_run_every_point_once_per_seed_each_with_its_own_control():
    from zfree_lab.experiment.controls import with_controls

    spec = ExperimentSpec("s", grid={"beta": [0.1, 0.3]}, train={"steps": 10}, seeds=(0, 1, 2))
    pts = spec.points()
    assert [(p.params["beta"], p.params["seed"]) for p in pts] == [(b, s) for b in (0.1, 0.3) for s in (0, 1, 2)]
    assert len({p.run_id for p in pts}) == 6
    _, links = with_controls(pts, None)
    controls = {links["controls"][p.run_id]: p.params["seed"] for p in pts}
    assert sorted(controls.values()) == [0, 1, 2]  # beta is reset in a control: one per seed, shared by the betas
    assert spec_from_dict(spec.to_dict()) == spec
    assert ExperimentSpec("s", grid={"beta": [0.1]}).points()[0].params["seed"] == 0  # no seeds: the point's own


@pytest.mark.parametrize("seeds, match", [((), "non-empty"), ((0, 0), "distinct"), ((-1,), ">= 0"), ((True,), "integers")])
def test_bad_seeds_are_one_line_errors(seeds, match):
    from zfree.core.errors import ConfigError

    with pytest.raises(ConfigError, match=match):
        ExperimentSpec("s", grid={"beta": [0.1]}, seeds=seeds)
    with pytest.raises(ConfigError, match="both set the seed"):
        ExperimentSpec("s", grid={"seed": [0, 1]}, seeds=(0,))


def test_yaml_seeds_key(tmp_path):
    from zfree.core.errors import ConfigError

    from tests.test_faults import write_spec

    f = write_spec(tmp_path, {"name": "sd", "grid": {"beta": [0.2]}, "seeds": [3, 4], "controls": False})
    spec = load_spec(f, check_paths=False)
    assert [p.params["seed"] for p in spec.points()] == [3, 4]
    bad = write_spec(tmp_path, {"name": "sd", "grid": {"beta": [0.2]}, "seeds": "0,1"})
    with pytest.raises(ConfigError, match=r"spec.yaml: seeds='0,1' must be a list"):
        load_spec(bad, check_paths=False)


def test_leaderboard_presets_hold_every_remedy_at_equal_steps_batch_and_rates():
    from zfree.objective.remedies import check_remedy_fields
    from zfree.config import TrainConfig

    for name in ("leaderboard", "leaderboard-e2e"):
        pts = PRESETS[name].points()
        keys = ("steps", "batch_size", "lr_backbone", "lr_new", "eval_every", "eval_rows")
        assert len({tuple(p.params[k] for k in keys) for p in pts}) == 1, name
        assert {p.params["seed"] for p in pts} == {0, 1, 2}
        for p in pts:
            check_remedy_fields(TrainConfig.from_flat(p.params))
    remedies = {p.params["remedy"] for p in PRESETS["leaderboard"].points()}
    # every entry but the aggressive encoder (the full grid's: tests below) on the CPU tier
    assert {"none", "free_bits", "ae+free_bits", "cyclical", "optimus", "switch_on", "gaussian", "bn_vae",
            "delta_vae"} <= remedies


def test_the_full_leaderboard_slurm_spec_written_at_use_holds_every_remedy(tmp_path):
    """The spec is generated at use (not committed): what its generator writes loads and expands to every
    remedy entry x every weighting with a beta* inside and outside the boundary x 3 seeds."""
    from zfree.core.paths import ROOT

    gen = ROOT / "analysis" / "sweeps" / "make_leaderboard_spec.py"
    m = load_script(gen, "make_leaderboard_spec")
    out = tmp_path / "leaderboard_full_slurm.yaml"
    out.write_text(m.text())
    pts = load_spec(out).points()
    from zfree.objective.remedies import REMEDIES

    assert {p.params["remedy"] for p in pts} == set(REMEDIES)
    assert len(pts) == len(REMEDIES) * 2 * len(m.BETA_STAR) * 3


def test_a_boundary_grid_takes_single_points_beside_its_cross_product():
    """The factorial's distribution + aid at 3 beta* (issue 58): an ``extra`` point beside weightings x
    factors x aids, at its own weighting's beta*; a bad triple is refused naming the field."""
    import pandas as pd

    from zfree.core.errors import ConfigError
    from zfree_lab.experiment.spec import BoundaryGrid, own_grid
    from zfree.reference.reference import Reference

    ref = Reference(2.0, pd.DataFrame({"n_tokens": [20.0, 30.0], "b": [1.5, 2.5]}), {})
    g = BoundaryGrid(weightings=("plain", "distribution"), beta_factors=(1 / 3,), aids=("none", "hard_em"),
                     aided={"aid": "hard_em_then_soft"}, extra=(("distribution", 3.0, "hard_em"),))
    variants, table = own_grid(g, ref)
    assert len(variants) == 5
    dist = next(t for t in table if t["weighting"] == "distribution")
    third, three = dist["betas"]
    assert three == pytest.approx(9 * third, rel=1e-3)  # 3 beta* against beta*/3
    assert variants[-1]["aid"] == "hard_em_then_soft" and variants[-1]["beta"] == three
    with pytest.raises(ConfigError, match="extra"):
        BoundaryGrid(extra=(("distribution", 0, "hard_em"),))


def test_a_presets_own_base_fine_tuning_reaches_the_study(tmp_path, monkeypatch):
    """factorial-smollm2 is preregistered in the entangled setting (``base: {kind: pretrained, finetune_steps:
    300}``): through ``zfree study --preset factorial-smollm2 --model M --data F`` its spec reaches the pipeline
    with those 300 steps (the own-model path replaced the base and ran it zero-shot); ``--finetune-steps``
    overrides them (0: none), ``--finetune-base`` alone on a zero-shot preset fine-tunes 300 steps."""
    from zfree_lab.cli import main as cli_main
    from zfree_lab.experiment.own_study import OWN_PRESETS

    seen = []

    def fake(spec, out, **kw):
        seen.append(spec)
        return ExperimentResult(Path(out), [], Path(out) / "report.html")

    monkeypatch.setattr("zfree_lab.experiment.own_study.run_experiment", fake)
    data = tmp_path / "d.jsonl"
    data.write_text('{"x": "a", "y": "b"}\n')
    assert OWN_PRESETS["factorial-smollm2"].base.finetune_steps == 300
    for i, (extra, want) in enumerate([([], 300), (["--finetune-steps", "0"], 0), (["--finetune-steps", "40"], 40)]):
        argv = ["study", "--preset", "factorial-smollm2", "--model", "some/model", "--data", str(data),
                "--out", str(tmp_path / f"f{i}"), "--no-estimate", *extra]
        assert cli_main(argv) == 0
        assert (seen[-1].base.kind, seen[-1].base.path, seen[-1].base.finetune_steps) == ("pretrained", "some/model",
                                                                                         want)
    for extra, want in [([], 0), (["--finetune-base"], 300), (["--finetune-base", "--finetune-steps", "7"], 7)]:
        (tmp_path / "m").mkdir(exist_ok=True)  # a model folder (a missing or empty one is refused first); never loaded
        (tmp_path / "m" / "config.json").write_text("{}")
        assert cli_main(["study", "--preset", "own_smoke", "--model", str(tmp_path / "m"), "--data", str(data),
                         "--out", str(tmp_path / f"o{len(seen)}"), "--no-estimate", *extra]) == 0
        assert seen[-1].base.finetune_steps == want
    from zfree_lab.experiment.own_study import own_base

    with pytest.raises(ValueError, match="finetune_steps=-1"):
        own_base(OWN_PRESETS["own"].base, "m", finetune_steps=-1)
