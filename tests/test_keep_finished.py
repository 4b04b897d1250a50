"""analysis/studies/keep_finished.py: a study's finished runs kept without weights, notebooks or machine paths, and
restored into a new study folder, which then trains none of them and reports the same gains."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from tests.scripts import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "analysis" / "studies" / "keep_finished.py"


@pytest.fixture(scope="module")
def kf():
    return load_script(SCRIPT, "keep_finished")


def test_kept_runs_restored_into_a_new_study_are_not_trained_again(smoke_study, kf, tmp_path, capsys):
    from zfree_lab.experiment.study import run_study

    study = tmp_path / "study"  # a copy: the session's smoke study is shared with other tests
    shutil.copytree(smoke_study, study, ignore=shutil.ignore_patterns(".zfree.lock"))
    done = sorted(p.parent.name for p in (study / "runs").glob("*/summary.json"))
    assert done
    kept = tmp_path / "kept"
    assert kf.main(["keep", str(study), str(kept)]) == 0
    assert f"kept {len(done)} finished run(s)" in capsys.readouterr().out
    assert sorted(p.name for p in (kept / "runs").iterdir()) == done
    for run in (kept / "runs").iterdir():
        names = {p.name for p in run.iterdir()}
        assert {"config.json", "summary.json", "per_example.parquet", "metrics.jsonl"} <= names
        assert not {"checkpoint", "train_cvae.ipynb"} & names and not any(n.startswith("events.") for n in names)
        assert not any(kf.MACHINE_PATH.search(p.read_bytes()) for p in run.iterdir() if p.suffix in kf.TEXT)
    assert kf.keep(study, kept) == (0, [])  # nothing new to keep

    new = tmp_path / "on a new machine"
    assert kf.restore(kept, new) == len(done)
    stamps = {p.parent.name: p.stat().st_mtime_ns for p in (new / "runs").glob("*/summary.json")}
    run_study("smoke", new, progress=False, render=False)  # the report is not what is tested here
    assert {p.parent.name: p.stat().st_mtime_ns for p in (new / "runs").glob("*/summary.json")} == stamps
    assert sorted(p.name for p in (new / "runs").iterdir() if p.is_dir()) == done  # no run trained again
    assert not list((new / "runs").glob("*/checkpoint"))
    cols = ["run_id", "z_gain", "reconstruction_loss", "kl_prior_loss"]
    before, after = (pd.read_csv(d / "summary.csv").sort_values("run_id")[cols].reset_index(drop=True)
                     for d in (study, new))
    pd.testing.assert_frame_equal(after, before)
    assert kf.restore(kept, new) == 0  # a run the study has is never touched


def test_a_run_not_finished_is_not_kept_the_studys_own_path_travels_and_another_machine_path_is_refused(kf, tmp_path, capsys):
    study, kept = tmp_path / "study", tmp_path / "kept"
    for name, files in {"running": {"summary.json": "{}", ".notebook-running": ""},
                        "failed": {"summary.json": "{}", "error.json": "{}"},
                        "torn": {"summary.json": "{}", "train_cvae.ipynb": '{"cells": ['},
                        "training": {"metrics.jsonl": "{}\n"},
                        "done": {"summary.json": "{}", "config.json": '{"data_dir": "../../data"}',
                                 "train_cvae.ipynb": json.dumps({"cells": []}), "events.out.tfevents.1": "x",
                                 ".train_cvae.ipynb.ab12.partial.ipynb": "/work/x"}}.items():
        (study / "runs" / name).mkdir(parents=True)
        for f, text in files.items():
            (study / "runs" / name / f).write_text(text)
    (study / "runs" / "done" / "summary.json").write_text(json.dumps({"_reference": {"source_dir": str(study / "base")}}))
    assert kf.keep(study, kept) == (1, [])
    assert sorted(p.name for p in (kept / "runs" / "done").iterdir()) == ["config.json", "summary.json"]
    kept_summary = json.loads((kept / "runs" / "done" / "summary.json").read_text())
    assert kept_summary == {"_reference": {"source_dir": f"{kf.STUDY_TOKEN}/base"}}  # the study's own path, portable
    new = tmp_path / "new machine" / "study"
    assert kf.restore(kept, new) == 1
    assert json.loads((new / "runs" / "done" / "summary.json").read_text()) == {
        "_reference": {"source_dir": str(new.resolve() / "base")}}  # as if the run had been made there
    (study / "runs" / "later").mkdir()
    (study / "runs" / "later" / "summary.json").write_text('{"base_dir": "/work/x/base"}')
    (study / "runs" / "next").mkdir()
    (study / "runs" / "next" / "summary.json").write_text("{}")
    assert kf.main(["keep", str(study), str(kept)]) == 1  # the refused run named, the one after it kept
    err = capsys.readouterr().err
    assert "later/summary.json: names a machine path (/work/...); not kept" in err and err.count("\n") == 1
    assert (kept / "runs" / "next" / "summary.json").is_file()
    assert not (kept / "runs" / "later").exists() and not (kept / "runs" / "later.part").exists()


def test_restore_refuses_a_folder_that_is_not_a_studys(kf, tmp_path):
    (tmp_path / "kept" / "runs" / "r").mkdir(parents=True)
    (tmp_path / "kept" / "runs" / "r" / "summary.json").write_text("{}")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match="other: exists and is not a study folder"):
        kf.restore(tmp_path / "kept", tmp_path / "other")
    assert not (tmp_path / "other" / "runs").exists()


def test_the_scripts_copies_of_zfree_names_agree_with_zfree(kf):
    """The script runs with the standard library only, so it repeats a few of zfree's names: they must not drift."""
    from tests.test_shipped_results import MACHINE_PATH
    from zfree_lab.experiment.executor import RUN_NOTEBOOK, RUNNING_MARK
    from zfree_lab.run.locks import STUDY_MARKS

    assert (kf.NOTEBOOK, kf.RUNNING_MARK, kf.MARKS) == (RUN_NOTEBOOK, RUNNING_MARK, STUDY_MARKS)
    assert kf.MACHINE_PATH.pattern == MACHINE_PATH.pattern
