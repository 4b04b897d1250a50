"""Issue 35 items 1 and 6: a study folder's plan (``zfree_lab.experiment.study_plan``) and ``zfree study
--set``. The end-to-end rerun (reused plan, no probe, only the interrupted run trained again, another
budget refused) is in tests/test_own_study.py::test_one_command_from_model_and_jsonl_to_report."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from zfree.core.errors import ConfigError
from zfree_lab.cli import main
from zfree_lab.experiment.own_study import OWN_PRESETS, OWN_SPEC_KEYS, load_own_spec
from zfree_lab.experiment.spec import expand_grid
from zfree_lab.experiment.study_plan import (PLAN_FILE, apply_fitted, check_request, differences, extend_plan,
                                         fitted_of, load_plan, more_seeds, request_of, write_plan)

ROOT = Path(__file__).resolve().parents[1]


def test_a_fitted_spec_round_trips_through_the_plan(tmp_path):
    spec = OWN_PRESETS["own"]
    cut = dataclasses.replace(spec, train={**spec.train, "steps": 12, "batch_size": 8},
                              boundary=dataclasses.replace(spec.boundary, weightings=("distribution",),
                                                           beta_factors=(1 / 3,)), oracles=("style",))
    write_plan(tmp_path, request_of(spec, 1800.0), cut, 1, ["a", "b"], {"runs": 2})
    saved = load_plan(tmp_path)
    back = apply_fitted(spec, saved["fitted"])
    assert back == cut and saved["workers"] == 1 and saved["run_ids"] == ["a", "b"]
    check_request(tmp_path, saved, request_of(spec, 1800.0))  # the same request: accepted
    check_request(tmp_path, saved, request_of(dataclasses.replace(spec, workers=7), 1800.0))  # workers: no result changes


def test_another_request_is_refused_naming_what_differs(tmp_path):
    spec = OWN_PRESETS["own"]
    write_plan(tmp_path, request_of(spec, 1800.0), spec, 2, [], None)
    saved = load_plan(tmp_path)
    with pytest.raises(ConfigError, match=re.escape("budget_s: 1800.0 in plan.json, 3600.0 now")):
        check_request(tmp_path, saved, request_of(spec, 3600.0))
    other = dataclasses.replace(spec, overrides={"steps": 20})
    assert differences(saved["request"], request_of(other, 1800.0)) == ["spec.overrides.steps: null in plan.json, 20 now"]
    with pytest.raises(ConfigError, match="spec.overrides.steps"):
        check_request(tmp_path, saved, request_of(other, 1800.0))
    (tmp_path / PLAN_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match="plan.json: not a readable study plan"):
        load_plan(tmp_path)


def test_more_seeds_extend_the_plan_with_its_cuts_and_nothing_else_does(tmp_path):
    """``--seeds 0-2`` after ``--seeds 0`` (or after the preset's own seed) grows the plan: the cuts stay the
    plan's, the planned runs must be among the new grid's, and the plan keeps what it grew from. Fewer or
    other seeds, or more seeds with another change, are another request."""
    spec = OWN_PRESETS["own"]
    cut = dataclasses.replace(spec, train={**spec.train, "steps": 12})
    one = dataclasses.replace(spec, seeds=(0,))
    write_plan(tmp_path, request_of(one, None), cut, 2, ["a0", "b0"], {"runs": 2})
    saved = load_plan(tmp_path)
    three = request_of(dataclasses.replace(spec, seeds=(0, 1, 2)), None)
    assert more_seeds(saved, three) == ([0], [0, 1, 2])
    check_request(tmp_path, saved, three)  # accepted: more seeds
    assert more_seeds(saved, request_of(one, None)) is None  # the same request: reused, not extended
    for other, what in [(dataclasses.replace(spec, seeds=(1, 2)), "spec.seeds: [0] in plan.json, [1, 2] now"),
                        (dataclasses.replace(spec, seeds=None), "spec.seeds: [0] in plan.json, null now"),
                        (dataclasses.replace(spec, seeds=(0, 1), overrides={"steps": 20}), "spec.overrides.steps")]:
        assert more_seeds(saved, request_of(other, None)) is None
        with pytest.raises(ConfigError, match=re.escape(what)):
            check_request(tmp_path, saved, request_of(other, None))
    with pytest.raises(ConfigError, match=re.escape("does not hold the seed its 1 planned run(s) were made with "
                                                    "(e.g. b0)")):
        extend_plan(tmp_path, saved, three, apply_fitted(spec, saved["fitted"]), 2, ["a0", "a1", "c0"])
    assert load_plan(tmp_path) == saved  # refused before the plan is touched
    grown = apply_fitted(dataclasses.replace(spec, seeds=(0, 1, 2)), saved["fitted"])
    line = extend_plan(tmp_path, saved, three, grown, 2, ["a0", "a1", "a2", "b0", "b1", "b2"])
    assert "extended from seeds [0] to seeds [0, 1, 2] with its cuts, no probe: 4 new runs, 6 in all" in line
    now = load_plan(tmp_path)
    assert now["request"] == three and now["run_ids"] == ["a0", "a1", "a2", "b0", "b1", "b2"]
    assert apply_fitted(spec, now["fitted"]).train["steps"] == 12 and now["estimate"] == {"runs": 2}
    assert [g["request"] for g in now["grown_from"]] == [saved["request"]] and now["grown_from"][0]["run_ids"] == ["a0", "b0"]
    check_request(tmp_path, now, three)  # the grown plan is the request now
    # a plan without seeds ran the spec's own seed: extended by a list that holds it (checked by the run ids)
    write_plan(tmp_path, request_of(spec, None), cut, 2, ["a0"], None)
    assert more_seeds(load_plan(tmp_path), three) == (None, [0, 1, 2])


def test_relative_and_absolute_paths_are_one_request(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = OWN_PRESETS["own"]
    rel = dataclasses.replace(spec, data=dataclasses.replace(spec.data, path=Path("pairs.jsonl")))
    absolute = dataclasses.replace(spec, data=dataclasses.replace(spec.data, path=tmp_path / "pairs.jsonl"))
    assert differences(request_of(rel, None), request_of(absolute, None)) == []
    assert fitted_of(rel) == fitted_of(absolute)


def test_a_shipped_folder_is_requested_by_its_zfree_path_so_another_checkout_resumes(tmp_path):
    """A preset's ``zfree:data/base/deep`` is kept as ``zfree:`` in the request (it was the making checkout's
    absolute path, so a rerun of the study from another clone was refused: "planned for another request:
    spec.base.path"). A plan written that way still matches when its absolute path ends in the same
    ``data/base/deep``; another folder is refused."""
    spec = OWN_PRESETS["own"]
    shipped = dataclasses.replace(spec, base=dataclasses.replace(spec.base, kind="folder",
                                                                  path=ROOT / "data" / "base" / "deep"))
    request = request_of(shipped, None)
    assert request["spec"]["base"]["path"] == "zfree:data/base/deep"
    outside = dataclasses.replace(spec, data=dataclasses.replace(spec.data, path=tmp_path / "pairs.jsonl"))
    assert request_of(outside, None)["spec"]["data"]["path"] == str(tmp_path.resolve() / "pairs.jsonl")
    old = {**request, "spec": {**request["spec"], "base": {**request["spec"]["base"],
                                                           "path": "/work/studies/ckout3/data/base/deep"}}}
    write_plan(tmp_path, old, shipped, 1, [], None)
    check_request(tmp_path, load_plan(tmp_path), request)  # accepted: the same shipped folder
    for other in ("/work/studies/ckout3/data/base/near-bayes", "/work/studies/ckout3/data/base/deep/model",
                  "ckout3/data/base/deep"):
        moved = {**request, "spec": {**request["spec"], "base": {**request["spec"]["base"], "path": other}}}
        write_plan(tmp_path, moved, shipped, 1, [], None)
        with pytest.raises(ConfigError, match="spec.base.path"):
            check_request(tmp_path, load_plan(tmp_path), request)


def test_set_overrides_every_point_after_the_grid():
    base = {"data_dir": "d", "base_dir": "b", "steps": 100}
    grid = {"variant": [{"weighting": "plain", "steps": 400}, {"weighting": "distribution"}], "beta": [0.1, 0.3]}
    points = expand_grid(base, grid, {"steps": 7, "batch_size": 4})
    assert len(points) == 4 and all(p.params["steps"] == 7 and p.params["batch_size"] == 4 for p in points)
    assert len({p.run_id for p in points}) == 4


@pytest.mark.parametrize("assignment, field", [("steps=true", "steps"), ("no_such_field=1", "no_such_field")])
def test_study_set_is_typed_and_refused_in_one_line(tmp_path, capsys, assignment, field):
    out = tmp_path / "s"
    assert main(["study", "--preset", "smoke", "--set", assignment, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("zfree: error: ") and field in err[-1] and not out.exists()


def test_example_own_study_yaml_loads_and_comments_every_key():
    path = ROOT / "analysis" / "studies" / "own-study-example.yaml"
    spec = load_own_spec(path)
    text = path.read_text()
    assert all(re.search(rf"^{k}:", text, re.M) for k in OWN_SPEC_KEYS), [k for k in OWN_SPEC_KEYS
                                                                         if not re.search(rf"^{k}:", text, re.M)]
    assert spec.boundary.weightings == ("distribution", "example") and spec.train["steps"] == 200
