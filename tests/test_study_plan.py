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
from zfree_lab.experiment.study_plan import (PLAN_FILE, apply_fitted, check_request, differences, fitted_of,
                                         load_plan, request_of, write_plan)

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
