"""Sweep specs validate before anything runs; a failing point is recorded and does not stop the
others; a rerun resumes without redoing finished points; submitit's local executor runs a sweep."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.tiny import make_tiny_run
from tests.tiny_sweep import tiny_base_flat
from zfree.core.paths import SPECS
from zfree_lab.experiment.executor import run_points
from zfree_lab.experiment.spec import expand_grid
from zfree_lab.experiment.sweeps import load_spec

SHIPPED = sorted(SPECS.glob("*.yaml"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_run(tmp_path_factory.getbasetemp() / "tiny_sweep")


def test_specs_are_shipped():
    assert {p.stem for p in SHIPPED} >= {"beta_vs_recon_weight", "smoke"}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_spec_expands_to_valid_configs(path):
    spec = load_spec(path, check_paths=False)  # the shipped base run may not be built on a fresh clone
    points = spec.points()
    assert points and len({p.run_id for p in points}) == len(points)
    assert all(Path(p.params["data_dir"]).is_absolute() for p in points)


def _write(tmp_path, spec: dict) -> Path:
    f = tmp_path / "spec.yaml"
    f.write_text(yaml.safe_dump(spec))
    return f


@pytest.mark.parametrize("spec, match", [
    ({"grid": {"beta": [0.1]}, "colour": 1}, "colour"),
    ({"grid": {}}, "grid"),
    ({"grid": {"betta": [0.1]}}, "betta"),
    ({"grid": {"beta": [-1.0]}}, "beta"),
    ({"grid": {"weighting": ["example"]}}, "epsilon"),
    ({"grid": {"beta": {"logspace": [1, 2, 3]}}}, "geomspace"),
    ({"grid": {"beta": [0.1]}, "executor": "dask"}, "executor"),
])
def test_bad_spec_fails_before_anything_runs_naming_the_field(tmp_path, spec, match):
    with pytest.raises(ValueError, match=match):
        load_spec(_write(tmp_path, spec), check_paths=False)
    assert not (tmp_path / "runs").exists()


def test_missing_base_dir_is_named(tmp_path, tiny):
    data, _ = tiny
    f = _write(tmp_path, {"base": {"data_dir": str(data), "base_dir": str(tmp_path / "nope")}, "grid": {"beta": [0.1]}})
    with pytest.raises(FileNotFoundError, match="base_dir"):
        load_spec(f)


def test_a_spec_naming_no_data_or_base_runs_on_the_shipped_benchmark_from_any_folder(tmp_path, monkeypatch):
    """The tutorial's spec shape (no data_dir, no base_dir): every point gets the config's defaults resolved to
    the shipped benchmark and base run, not the relative defaults a run's kernel would look for in its own run
    folder (where every point failed: "runs/<sweep>/runs/<point>/data/synth/default/train.jsonl does not exist")."""
    from zfree.core.paths import ROOT

    monkeypatch.chdir(tmp_path)  # a folder holding no data/
    spec = load_spec(_write(tmp_path, {"base": {"steps": 10}, "grid": {"beta": [0.03, 1.0]}}))
    for pt in spec.points():
        assert pt.params["data_dir"] == str((ROOT / "data/synth/default").resolve())
        assert pt.params["base_dir"] == str((ROOT / "data/base/default").resolve())
        assert (Path(pt.params["data_dir"]) / "train.jsonl").is_file()
    (tmp_path / "data/synth/mine").mkdir(parents=True)  # a relative path the user names still wins, from the cwd
    spec = load_spec(_write(tmp_path, {"base": {"data_dir": "data/synth/mine"}, "grid": {"beta": [0.03]}}))
    assert {pt.params["data_dir"] for pt in spec.points()} == {str((tmp_path / "data/synth/mine").resolve())}


def test_a_misspelt_grid_axis_names_the_closest_field_not_all_of_them(tmp_path):
    with pytest.raises(ValueError, match=r"grid\.betta: unknown config field 'betta' \(did you mean 'beta'\?\); "
                                         r"`zfree train --fields` lists the \d+ fields") as e:
        load_spec(_write(tmp_path, {"grid": {"betta": [0.1, 1.0]}}), check_paths=False)
    assert "lr_new" not in str(e.value)


def test_dict_axes_and_ranges_expand(tmp_path):
    spec = load_spec(_write(tmp_path, {"grid": {"objective": [{"weighting": "plain"},
                                                              {"weighting": "example", "epsilon": 0.1}],
                                                "beta": {"geomspace": [0.01, 1.0, 3]}}}), check_paths=False)
    got = sorted((p.params["weighting"], p.params["epsilon"], p.params["beta"]) for p in spec.points())
    assert got == sorted([(w, e, b) for w, e in (("plain", 0.0), ("example", 0.1)) for b in (0.01, 0.1, 1.0)])
    assert len(expand_grid(tiny_base_flat("d", "b"), {"beta": [0.1, 0.1]})) == 1  # one config runs once


def test_failing_point_is_recorded_others_finish_and_rerun_resumes(tmp_path, tiny):
    """A point whose base folder is missing fails before its kernel starts (the executor's check,
    the trainer's own message), is recorded, and the other point finishes; a rerun skips the finished
    point and retries the failed one. (A failure inside a kernel: test_faults, the notebook kept.)"""
    data, base = tiny
    good = expand_grid(tiny_base_flat(data, base), {"weighting": ["distribution"]})
    bad = expand_grid(tiny_base_flat(data, tmp_path / "no_base_run"), {"weighting": ["plain"]})
    points = good + bad
    runs = tmp_path / "runs"
    statuses = run_points(points, runs, workers=2, progress=False)
    assert [s["status"] for s in statuses] == ["finished", "failed"]
    err = json.loads((runs / bad[0].run_id / "error.json").read_text())
    assert err["error"].startswith("FileNotFoundError: ") and str(tmp_path / "no_base_run" / "model") in err["error"]
    assert not (runs / bad[0].run_id / "train_cvae.ipynb").exists()  # no kernel was started for it
    stamps = {p.run_id: (runs / p.run_id / "summary.json").stat().st_mtime_ns for p in good}
    statuses = run_points(points, runs, workers=2, progress=False)
    assert [s["status"] for s in statuses] == ["skipped", "failed"]
    assert {p.run_id: (runs / p.run_id / "summary.json").stat().st_mtime_ns for p in good} == stamps


@pytest.mark.slow  # moved to the slow tier (issue 23's tests kept the default tier under 10 min)
def test_submitit_local_executor_runs_a_two_point_sweep_through_the_cli(tmp_path, tiny):
    from zfree_lab.cli import main

    data, base = tiny
    flat = {k: v for k, v in tiny_base_flat(data, base).items() if k in ("data_dir", "base_dir", "steps", "batch_size",
                                                                       "eval_every", "eval_rows", "decode_rows")}
    f = _write(tmp_path, {"name": "two", "base": flat, "grid": {"beta": [0.3, 1.0]}, "executor": "submitit",
                          "executor_options": {"cluster": "local", "timeout_min": 10}})
    out = tmp_path / "sweep"
    assert main(["sweep", str(f), "--out", str(out), "--no-report"]) == 0
    runs = pd.read_parquet(out / "runs.parquet")
    assert sorted(runs["beta"]) == [0.3, 1.0] and (out / "runs.csv").exists() and (out / "submitit").is_dir()
    assert json.loads((out / "spec.json").read_text())["run_ids"] == sorted(runs["run_id"], key=lambda r: "1.0" in r)


@pytest.mark.parametrize("path", [p for p in SHIPPED if load_spec(p, check_paths=False).executor == "submitit"],
                         ids=lambda p: p.stem)
def test_shipped_submitit_specs_pass_only_options_submitit_knows(path):
    """Every executor option of a shipped submitit spec (besides ``cluster``, which picks the
    executor) is one AutoExecutor.update_parameters accepts: a generic name or slurm_<SlurmExecutor name>."""
    submitit = pytest.importorskip("submitit")
    from submitit.slurm.slurm import SlurmExecutor

    opts = load_spec(path, check_paths=False).executor_options
    generic, slurm = submitit.AutoExecutor._valid_parameters(), SlurmExecutor._valid_parameters()
    bad = [k for k in opts if k != "cluster" and k not in generic
           and not (k.startswith("slurm_") and k[len("slurm_"):] in slurm)]
    assert not bad, f"{path.name}: unknown submitit options {bad}"


def test_gpu_spec_runs_one_gpu_per_point_on_the_automatic_device():
    spec = load_spec(SPECS / "slurm_gpu.yaml", check_paths=False)
    assert spec.executor_options["gpus_per_node"] == 1 and spec.executor_options["cluster"] == "slurm"
    points = spec.points()
    assert len(points) == 3 * 5 * 3
    assert {p.params["device"] for p in points} == {"auto"} and {p.params["precision"] for p in points} == {"bf16"}


def test_a_log_gets_one_line_per_finished_run_a_terminal_the_bar(tmp_path, capsys, monkeypatch):
    """Progress written to a file or pipe (nohup, SLURM, CI) is one line per finished run, with no carriage
    return: the bar's updates had made one long line of a study's log. A terminal keeps tqdm's bar."""
    import io
    import sys
    from concurrent.futures import ThreadPoolExecutor

    from zfree_lab.experiment.executor import run_points
    from zfree_lab.experiment.spec import Point

    points = [Point(f"p{i}", {}) for i in range(3)]
    ran = lambda p, runs, nb: {"run_id": p.run_id, "status": "failed" if p.run_id == "p1" else "finished"}  # noqa: E731
    with ThreadPoolExecutor(1) as ex:
        run_points(points, tmp_path / "runs", executor=ex, run_fn=ran, progress=True)
    err = capsys.readouterr().err
    assert "\r" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("runs: ")]
    assert [ln.split(" (")[0] for ln in lines] == ["runs: 1 of 3 done", "runs: 2 of 3 done", "runs: 3 of 3 done"], err
    assert sorted(ln.split("(")[1].split(",")[0] for ln in lines) == ["p0: finished", "p1: failed", "p2: finished"]

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    with ThreadPoolExecutor(1) as ex:
        run_points(points, tmp_path / "runs2", executor=ex, run_fn=ran, progress=True)
    assert "\r" in term.getvalue() and "runs: 1 of 3 done" not in term.getvalue()
