"""Study and run folders cannot be turned against their user: nothing in them is imported or
executed, no write follows a symlink out of them, their names are never format strings, and a
torn executed notebook does not count as a finished run (``zfree_lab.experiment.notebook_exec``)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.tiny import tiny_flat
from zfree.config import TrainConfig
from zfree_lab.run.locks import LOCK_NAME
from zfree.core.paths import NOTEBOOKS
from zfree_lab.experiment.executor import RUN_NOTEBOOK, is_finished, run_point
from zfree_lab.experiment.spec import Point, run_id

#: module names a kernel or a notebook imports, planted in a folder zfree writes to
PLANTED = ("ipykernel_launcher", "pandas", "zfree")


def plant(folder: Path, marks: Path) -> None:
    """Modules that leave a mark (and stop the process) if anything imports them from ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in PLANTED:
        (folder / f"{name}.py").write_text(f"open({str(marks / name)!r}, 'w').write('ran')\nraise SystemExit(3)\n")


def outside_target(tmp_path: Path, name: str) -> Path:
    target = tmp_path / "outside" / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("precious")
    return target


def test_a_run_in_a_hostile_folder_runs_nothing_of_it_and_writes_through_no_link(tiny_run, tmp_path):
    """A run folder whose name holds braces, %, $, quotes and a newline, with planted modules and its executed
    notebook a symlink to a file elsewhere: the run finishes, nothing planted ran, the file elsewhere
    is untouched and the notebook is a whole regular file in the run folder."""
    data, base = tiny_run
    marks = tmp_path / "marks"
    marks.mkdir()
    runs = tmp_path / "st_{seed}_{a}%s$HOME'q\n\"z" / "runs"
    flat = TrainConfig.from_flat(tiny_flat(data, base, steps=2, eval_every=2, device="cpu")).to_flat()
    point = Point(run_id(flat), flat)
    run_dir = runs / point.run_id
    plant(run_dir, marks)
    (run_dir / LOCK_NAME).touch()  # planted into a run folder zfree owns (a foreign one is refused, issue 61)
    target = outside_target(tmp_path, "victim.ipynb")
    (run_dir / RUN_NOTEBOOK).symlink_to(target)
    res = run_point(point, str(runs), str(NOTEBOOKS / "train_cvae.ipynb"))
    assert res["status"] == "finished", res
    assert not list(marks.iterdir()), f"planted modules ran: {sorted(p.name for p in marks.iterdir())}"
    assert target.read_text() == "precious"
    nb = run_dir / RUN_NOTEBOOK
    assert nb.is_file() and not nb.is_symlink() and json.loads(nb.read_text())["cells"]
    assert (run_dir / "summary.json").is_file() and not list(tmp_path.glob("st_*/runs/*/.*partial*"))
    assert not (tmp_path / "st_0").exists()  # the braces were not formatted into another folder


#: every file a study (re)writes at its top level (a rerun of a finished study writes each again)
STUDY_FILES = (".zfree.lock", "controls.json", "summary.csv", "runs.csv", "runs.parquet", "timings.json", "gains.csv",
               "available_gain.csv", "per_example.parquet")


def test_a_report_of_a_hostile_study_runs_nothing_of_it_and_writes_through_no_link(smoke_study, tmp_path):
    from tests.smoke_study import agg_backend
    from zfree_lab.experiment.study import run_study

    study = tmp_path / "study{x}"
    shutil.copytree(smoke_study, study)
    marks = tmp_path / "marks"
    marks.mkdir()
    plant(study, marks)
    targets = {}
    for name in ("report.ipynb", "report.html", ".report.src.ipynb", ".report.tmp.ipynb", *STUDY_FILES):
        (study / name).unlink(missing_ok=True)
        targets[name] = outside_target(tmp_path, name)
        (study / name).symlink_to(targets[name])
    with agg_backend(), pytest.warns(UserWarning, match=r"controls.json: unreadable .*written anew") as seen:
        html = run_study("smoke", study, progress=False)  # a rerun: every run is reused, every study file rewritten
    assert any("timings.json: unreadable" in str(w.message) for w in seen)
    assert not list(marks.iterdir()), f"planted modules ran: {sorted(p.name for p in marks.iterdir())}"
    assert {n: t.read_text() for n, t in targets.items() if t.read_text() != "precious"} == {}
    for name in ("report.ipynb", "report.html", *STUDY_FILES):
        assert (study / name).is_file() and not (study / name).is_symlink(), name
    assert "<html" in html.read_text()[:2000].lower()


def test_a_torn_executed_notebook_is_not_a_finished_run(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "summary.json").write_text("{}")
    assert is_finished(run)  # a run folder trained outside papermill (no notebook)
    (run / RUN_NOTEBOOK).write_text('{"cells": [{"cell_type": "code", "sour')  # a full disk's leftovers
    assert not is_finished(run)
    (run / RUN_NOTEBOOK).write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    assert is_finished(run)
    # a notebook that failed after training wrote summary.json (a figure cell): run again, not skipped
    (run / "error.json").write_text(json.dumps({"error": "ImportError: cannot import name 'x'"}))
    assert not is_finished(run)


def test_a_failed_execution_leaves_no_torn_notebook(tmp_path, monkeypatch):
    """papermill dying while it writes (disk full) leaves neither a torn notebook nor its partial file."""
    import papermill as pm

    from zfree_lab.experiment import notebook_exec

    def torn(nb, out, **kw):
        Path(out).write_text('{"cells": [')
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pm, "execute_notebook", torn)
    with pytest.raises(OSError, match="No space left"):
        notebook_exec.execute(NOTEBOOKS / "train_cvae.ipynb", tmp_path / "out.ipynb")
    assert not list(tmp_path.iterdir())


def test_label_names_from_data_reach_the_gains_figure_as_literal_text(tmp_path):
    """Label names that are invalid mathtext (the report stopped with a ParseSyntaxException) or valid
    mathtext (typeset as a fraction) are drawn as the characters they are, in the oracle annotations
    and in the legend; the figure saves."""
    import matplotlib.pyplot as plt
    import pandas as pd

    from zfree_lab.report.plotting_study import plot_gains

    names = ["$x_$", r"$\alpha^$", r"$\frac{a}{b}$"]
    oracles = pd.DataFrame([{"label": n, "H": 1.0 + i, "H_lo": 0.9 + i, "H_hi": 1.1 + i, "delta_R": 0.5, "delta_R_lo": 0.4,
                             "delta_R_hi": 0.6, "distinguishable": True} for i, n in enumerate(names)])
    runs = pd.DataFrame([{"weighting": "plain", "beta": 0.1, "aid": "none", "latent_kind": "discrete", "z_gain": 0.2,
                          "z_gain_lo": 0.1, "z_gain_hi": 0.3, "rate": 0.5}])
    fig = plot_gains(runs, oracles)
    fig.savefig(tmp_path / "gains.png")
    drawn = [t.get_text() for t in fig.axes[1].texts]
    assert all(n in drawn for n in names) and not any(t.get_parse_math() for t in fig.axes[1].texts)
    plt.close(fig)


def test_label_keys_with_slashes_keep_their_metric_columns():
    """A label key may hold any character JSON allows: its NMI, Hungarian and probe columns reach the
    per-label table and summary.csv (they were dropped where the key held a slash)."""
    import pandas as pd

    from zfree_lab.experiment.results import summary_with_labels
    from zfree_lab.report.labels_report import label_metric_of, label_table

    assert label_metric_of("structure/alignment_nmi/a/b") == ("alignment_nmi", "a/b")
    assert label_metric_of("structure/probe_accuracy/../../x") == ("probe_accuracy", "../../x")
    assert label_metric_of("structure/alignment_nmi") is None and label_metric_of("structure/n_rows/a/b") is None
    runs = pd.DataFrame([{"run_id": "r", "weighting": "plain", "beta": 0.1, "aid": "none",
                          **{f"structure/{m}/{k}": 0.5 for m in ("alignment_nmi", "hungarian_accuracy", "probe_accuracy")
                             for k in ("a/b", "../../x", "plain")}}])
    table = label_table(runs)
    for key in ("a/b", "../../x", "plain"):
        assert {f"{key} alignment nmi", f"{key} hungarian accuracy", f"{key} probe accuracy"} <= set(table.columns)
    summary = summary_with_labels(runs, [])
    assert {"structure/alignment_nmi/a/b", "structure/probe_accuracy/../../x"} <= set(summary.columns)


@pytest.mark.parametrize("value", ["0", "-3", "two"])
def test_workers_below_one_are_refused_before_any_work(value, tmp_path, capsys):
    from zfree_lab.cli import main

    with pytest.raises(SystemExit) as e:
        main(["study", "--preset", "smoke", f"--workers={value}", "--out", str(tmp_path / "o")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("zfree study: error: argument --workers:") and value in err[-1]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("summary, says", [
    ("[1, 2]", "not a run summary (a JSON object expected, got a list)"),
    ('{"weighting": "plain", "beta": "0.3", "steps": 4}', "not a run summary ('beta' is '0.3'; expected a int or float)"),
    ('{"weighting": "plain", "beta": 0.3, "steps": "4"}', "not a run summary ('steps' is '4'; expected a int)"),
    ("{torn", "not JSON")])
def test_a_hand_made_summary_of_the_wrong_shape_is_one_line_naming_it(tmp_path, summary, says):
    """Issue 34 (weak cases): a summary.json that is not a run's (a list, a key of the wrong type) was an
    AttributeError / TypeError traceback in every reader; now one line naming the file and the key."""
    from zfree.core.errors import InputError
    from zfree_lab.experiment.results import collect_runs

    run = tmp_path / "study" / "runs" / "plain_beta0.3_abcd1234"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(summary)
    with pytest.raises(InputError, match=re.escape(f"{run / 'summary.json'}: {says}")):
        collect_runs(tmp_path / "study" / "runs")


def test_a_missing_or_torn_run_table_is_one_line_naming_it(tmp_path):
    """A run without its per_example.parquet (or a torn one) said `zfree: error: <path>` with no reason."""
    import pandas as pd

    from zfree.core.errors import InputError
    from zfree.core.io import read_table

    missing = tmp_path / "run" / "per_example.parquet"
    with pytest.raises(InputError, match=re.escape(f"{missing}: missing; the folder {missing.parent} is not whole")):
        read_table(missing)
    missing.parent.mkdir()
    missing.write_bytes(b"PAR1 torn")
    with pytest.raises(InputError, match=re.escape(f"{missing}: unreadable (")):
        read_table(missing)
    pd.DataFrame({"id": ["a"], "kl": [0.5]}).to_parquet(missing)
    assert list(read_table(missing, columns=["kl"]).columns) == ["kl"]
    with pytest.raises(InputError, match="unreadable"):
        read_table(missing, columns=["beta_eff"])


#: every file a run writes in its folder whose name is known before it runs (TensorBoard's event file
#: and W&B's folder carry a time stamp in their names: they can only be new files)
#: and that a run does not read first (config.json, summary.json and checkpoint/ say whether and
#: where a run resumes: a planted one is read, ``test_a_planted_run_config_that_is_not_json_is_one_line``)
RUN_FILES = (".zfree.lock", "metrics.jsonl", "curve.jsonl", "progress.json", "per_example.parquet", "samples.parquet",
             "multiref.parquet", "latent_meaning.json", "latent_meaning.parquet", "error.json")


def test_no_file_a_run_writes_follows_a_symlink_out_of_its_folder(tiny_run, tmp_path):
    """Every file of a run folder planted as a symlink to a file elsewhere: the run trains to its
    end, every target keeps its text, and every file it wrote is a regular file. ``checkpoint/`` as a
    symlink to a folder elsewhere is refused in one line, nothing written into it."""
    from zfree.core.errors import CheckpointError
    from zfree_lab.run.training import train_cvae

    data, base = tiny_run
    cfg = TrainConfig.from_flat(tiny_flat(data, base, steps=2, eval_every=1, device="cpu"))
    run_dir = tmp_path / "run"
    targets = {}
    for name in RUN_FILES:
        targets[name] = outside_target(tmp_path, name.replace("/", "_"))
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).symlink_to(targets[name])
    summary = train_cvae(cfg, run_dir, progress=False)
    assert (run_dir / "summary.json").is_file() and summary
    assert {n: t.read_text() for n, t in targets.items() if t.read_text() != "precious"} == {}
    written = [p for p in run_dir.rglob("*") if not p.is_dir()]
    assert {"summary.json", "metrics.jsonl", "per_example.parquet"} <= {p.name for p in written}
    # what this run did not write (here: no failure, no multi-reference data) stays as planted, untouched
    links = {str(p.relative_to(run_dir)) for p in written if p.is_symlink()}
    assert links <= set(RUN_FILES) - {"metrics.jsonl", "curve.jsonl", "progress.json", "per_example.parquet"}

    outside_dir = tmp_path / "outside_checkpoint"
    outside_dir.mkdir()
    (outside_dir / "precious.txt").write_text("precious")
    run2 = tmp_path / "run2"
    run2.mkdir()
    (run2 / LOCK_NAME).touch()  # a run folder zfree owns (a foreign one is refused, issue 61)
    (run2 / "checkpoint").symlink_to(outside_dir, target_is_directory=True)
    with pytest.raises(CheckpointError, match="checkpoint is not a complete checkpoint"):  # refused, in one line
        train_cvae(cfg, run2, progress=False)
    assert sorted(p.name for p in outside_dir.iterdir()) == ["precious.txt"]


def test_a_planted_run_config_that_is_not_json_is_one_line(tiny_run, tmp_path):
    from zfree.core.errors import InputError
    from zfree_lab.run.training import train_cvae

    data, base = tiny_run
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").symlink_to(outside_target(tmp_path, "victim.txt"))
    (run_dir / "summary.json").write_text("{}")
    with pytest.raises(InputError, match=r"^\S*config.json: not a run config \(not JSON: .*\); move it away"):
        train_cvae(TrainConfig.from_flat(tiny_flat(data, base, steps=2, device="cpu")), run_dir, progress=False)
    assert (tmp_path / "outside" / "victim.txt").read_text() == "precious"


def test_a_full_disk_during_zfree_report_is_one_line_and_keeps_the_last_report(tmp_path_factory, tmp_path,
                                                                                  monkeypatch, capsys):
    """``zfree report`` on a study whose disk fills while the report notebook is written: exit 2 with
    one line naming the error and the file, the earlier report.html untouched, no torn notebook."""
    import errno

    import papermill as pm

    from tests.tiny_sweep import make_tiny_sweep
    from zfree_lab.cli import main

    study = tmp_path / "study"
    shutil.copytree(make_tiny_sweep(tmp_path_factory), study)
    (study / "report.html").write_text("<html>the last report</html>")

    def full(nb, out, **kw):
        Path(out).write_text('{"cells": [')
        raise OSError(errno.ENOSPC, "No space left on device", str(out))

    monkeypatch.setattr(pm, "execute_notebook", full)
    capsys.readouterr()  # what building the sweep printed
    code = main(["report", str(study)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("zfree: error:") and "No space left on device" in err[0]
    assert (study / "report.html").read_text() == "<html>the last report</html>"
    assert not [p.name for p in study.iterdir() if p.suffix == ".ipynb" or ".tmp" in p.name]


@pytest.mark.parametrize("where", ["notebook", "tables"])
def test_a_full_disk_during_zfree_report_names_the_study_folder(tmp_path_factory, tmp_path, monkeypatch, capsys, where):
    """Issue 61: a full disk during the report (a write() error names no file: papermill writing the
    notebook, pandas the tables) was one line without a file or folder; now it names the study folder,
    says the last complete report is kept and how to go on."""
    import errno

    import papermill as pm

    import zfree_lab.experiment.render as render
    from tests.tiny_sweep import make_tiny_sweep
    from zfree_lab.cli import main

    study = tmp_path / "study"
    shutil.copytree(make_tiny_sweep(tmp_path_factory), study)
    (study / "report.html").write_text("<html>the last report</html>")

    def full(*a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")  # as write() raises it: no file name

    monkeypatch.setattr(pm, "execute_notebook", full) if where == "notebook" else monkeypatch.setattr(
        render, "aggregate", full)
    capsys.readouterr()
    assert main(["report", str(study)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"zfree: error: cannot write the report in {study.resolve()} (No space "
                                               f"left on device)"), err
    assert "the last complete report.html is kept" in err[0] and f"zfree report {study.resolve()}" in err[0]
    assert (study / "report.html").read_text() == "<html>the last report</html>"


# ---------------------------------------------------------------------------- issue 61: folders zfree does not own

#: a folder of someone else's, with the names of files a run writes
FOREIGN = {"summary.json": '{"accuracy": 0.93}\n', "metrics.jsonl": '{"step": 1, "loss": 2.0}\n',
           "curve.jsonl": "{}\n", "progress.json": '{"epoch": 3}\n', "samples.parquet": "not parquet", "notes.txt": "mine"}


@pytest.mark.parametrize("files", [{"summary.json": FOREIGN["summary.json"]}, FOREIGN], ids=["summary", "run-files"])
def test_zfree_train_refuses_a_non_empty_folder_it_does_not_own(tiny_run, tmp_path, capsys, files):
    """``--out`` a folder holding someone else's summary.json: `zfree train` exited 0 printing ``{}`` and
    trained nothing; a folder of someone else's metrics.jsonl, curve.jsonl, ...: overwritten without a
    word. Now one line naming the folder, exit 2, and every file byte-identical, nothing added."""
    from zfree_lab.cli import main

    data, base = tiny_run
    out = tmp_path / "theirs"
    out.mkdir()
    for name, text in files.items():
        (out / name).write_text(text)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(tiny_flat(data, base, steps=2, eval_every=2, device="cpu")))
    assert main(["train", "--config", str(config), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"zfree: error: {out} is not empty and not a zfree run folder ("), err
    assert {p.name: p.read_text() for p in out.iterdir()} == files


def test_own_folders_still_train_resume_and_are_reused(tiny_run, tmp_path):
    """What zfree owns keeps working: an empty folder trains; a stopped run resumes, also as a run
    folder from before the lock file (config.json, no .zfree.lock); a finished run is returned as it is;
    `zfree train --model/--data` trains in the folder it split the data into, and its rerun reuses it."""
    from zfree_lab.cli import main
    from zfree_lab.run.locks import LOCK_NAME
    from zfree_lab.run.training import train_cvae

    data, base = tiny_run
    cfg = TrainConfig.from_flat(tiny_flat(data, base, steps=4, eval_every=2, device="cpu"))
    run = tmp_path / "empty"
    run.mkdir()
    train_cvae(cfg, run, progress=False, stop_after=2)
    assert not (run / "summary.json").exists() and (run / "config.json").exists()
    (run / LOCK_NAME).unlink()  # as a run folder of an older zfree
    done = train_cvae(cfg, run, progress=False)
    assert [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())] == [0, 2, 4]
    assert train_cvae(cfg, run, progress=False) == done
    own = tmp_path / "own"
    argv = ["train", "--model", str(base / "model"), "--data", str(data / "train.jsonl"), "--out", str(own),
            "--set", "steps=2", "--set", "eval_every=2", "--set", "device=cpu"]
    assert main(argv) == 0 and (own / "summary.json").exists() and (own / "train.jsonl").exists()
    stamp = (own / "summary.json").stat().st_mtime_ns
    assert main(argv) == 0 and (own / "summary.json").stat().st_mtime_ns == stamp


def test_zfree_study_refuses_a_non_empty_folder_it_does_not_own(tiny_run, tmp_path, capsys):
    """`zfree study --out` a folder of someone else's (no .zfree.lock, plan.json or spec.json): the study
    wrote its split, timings.json and base/ among the user's files before failing or finishing; now one
    line naming the folder, exit 2, every file byte-identical and nothing added."""
    from zfree_lab.cli import main

    data, _ = tiny_run
    out = tmp_path / "theirs"
    out.mkdir()
    files = {**FOREIGN, "summary.csv": "a,b\n1,2\n", "report.html": "<html>mine</html>"}
    for name, text in files.items():
        (out / name).write_text(text)
    (tmp_path / "no-model").mkdir()  # a model folder (a missing or empty one is refused first) but never loaded
    (tmp_path / "no-model" / "config.json").write_text("{}")
    argv = ["study", "--model", str(tmp_path / "no-model"), "--data", str(data / "train.jsonl"), "--out", str(out),
            "--no-estimate"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"zfree: error: {out} is not empty and not a zfree study folder ("), err
    assert {p.name: p.read_text() for p in out.iterdir()} == files


def test_a_study_folder_of_zfree_passes_the_owner_check(tmp_path):
    """What marks a study folder as zfree's own (its lock, plan.json, a sweep's spec.json) passes; so do a
    missing and an empty folder."""
    from zfree_lab.run.locks import STUDY_MARKS, check_own_folder

    check_own_folder(tmp_path / "missing", "study folder", STUDY_MARKS)
    check_own_folder(tmp_path, "study folder", STUDY_MARKS)
    for mark in STUDY_MARKS:
        own = tmp_path / mark.strip(".")
        own.mkdir()
        (own / mark).write_text("{}")
        (own / "summary.csv").write_text("a\n1\n")
        check_own_folder(own, "study folder", STUDY_MARKS)


@pytest.mark.parametrize("cmd,package", [("train", "zfree"), ("study", "zfree"), ("train", "zfree_lab")])
def test_out_inside_the_installed_package_is_refused(tiny_run, tmp_path, capsys, cmd, package):
    """`--out` inside the package (src/zfree in a clone, site-packages/zfree from a wheel) wrote 15 run
    files among its modules; now one line naming the folder, exit 2, nothing created there. The same
    inside the application's package (zfree_lab), which the library does not name."""
    import importlib

    from zfree_lab.cli import main

    data, base = tiny_run
    out = Path(importlib.import_module(package).__file__).resolve().parent / "data" / "zfree-test-out"
    assert not out.exists()
    config = tmp_path / "config.json"
    config.write_text(json.dumps(tiny_flat(data, base, steps=2, eval_every=2, device="cpu")))
    argv = (["train", "--config", str(config), "--out", str(out)] if cmd == "train" else
            ["study", "--model", str(tmp_path / "no-model"), "--data", str(data / "train.jsonl"), "--out", str(out),
             "--no-estimate"])
    try:
        code = main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1, err
        assert err[0].startswith(f"zfree: error: --out {out}: inside the installed {package} package ("), err
        assert not out.exists()
    finally:
        shutil.rmtree(out, ignore_errors=True)
