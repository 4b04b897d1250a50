"""The explore notebook's study chooser, driven headlessly: the dropdown lists the finished studies,
a choice (dropdown or path box) re-points the table, explorer and launch panel and writes nothing;
a folder that cannot be opened is one line and changes nothing."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.tiny_sweep import make_tiny_sweep
from zfree.core.io import atomic_write_json, read_json
from zfree_lab.experiment.results import SweepResults, collect_runs
from zfree_lab.experiment.study_folders import count_runs, find_studies
from zfree_lab.report.explore import ExploreLab, StudyChooser, runs_overview


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return make_tiny_sweep(tmp_path_factory)


def _files(root: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in root.rglob("*")}


def test_find_studies_lists_finished_folders_newest_first(tmp_path):
    """A finished study is a folder with summary.csv or a finished run (runs/*/summary.json)."""
    for name, files, when in (("runs-only", ["runs/r1/summary.json"], 3_000_000),
                              ("csv-only", ["summary.csv"], 2_000_000),
                              ("both", ["summary.csv", "runs/r1/summary.json"], 1_000_000),
                              ("unfinished", ["runs/r1/config.json"], 4_000_000)):
        for f in files:
            p = tmp_path / name / f
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text("{}")
            os.utime(p, (when, when))
    (tmp_path / "summary.csv").write_text("")  # a file beside the studies is not one
    assert find_studies(tmp_path) == [tmp_path / n for n in ("runs-only", "csv-only", "both")]
    assert find_studies(tmp_path / "missing") == []


@pytest.fixture
def two_studies(sweep, tmp_path):
    """runs/study-all (the tiny sweep's six runs) and runs/study-two (two of them, finished later)."""
    root = tmp_path / "runs"
    shutil.copytree(sweep, root / "study-all")
    two = root / "study-two" / "runs"
    for rid in sorted(p.name for p in (sweep / "runs").iterdir())[:2]:
        shutil.copytree(sweep / "runs" / rid, two / rid)
        os.utime(two / rid / "summary.json")  # now: the newest
    return root


def test_choosing_a_study_repoints_the_lab_and_writes_nothing(two_studies):
    root = two_studies
    lab = ExploreLab(root / "study-all", steps=3, workers=1, root=root)
    labels = [label for label, _ in lab.chooser.dropdown.options]
    assert labels == ["runs/study-two (2 runs)", "runs/study-all (6 runs)"], labels
    assert lab.chooser.dropdown.value == str((root / "study-all").resolve())
    assert len(lab.explorer.results.runs) == 6 and "6 finished runs" in lab.table.value
    before = _files(root)
    lab.chooser.dropdown.value = str((root / "study-two").resolve())
    two = (root / "study-two").resolve()
    assert lab.explorer.sweep_dirs == [two, two / "launched"] and len(lab.explorer.results.runs) == 2
    assert lab.panel.sweep_dir == two / "launched" and str(two / "launched" / "runs") in lab.panel.plan.value
    template_run = lab.explorer.results.runs["run_id"].iloc[0]
    assert lab.panel.base == lab.explorer.results.config(template_run)  # the chosen study's own run
    assert str(two) in lab.table.value and "2 finished runs" in lab.table.value and lab.chooser.error.value == ""
    assert int(lab.panel.steps.value) == 3  # the researcher's choices stay
    lab.chooser.path.value = str(root / "study-all")  # the path box opens a folder too (Enter)
    assert lab.explorer.sweep_dir == (root / "study-all").resolve() and lab.chooser.path.value == ""
    assert lab.chooser.dropdown.value == str((root / "study-all").resolve())
    assert _files(root) == before  # nothing written, nothing touched


@pytest.mark.parametrize("what, error", [("missing", "NoStudyError: no such folder"),
                                         ("not a study", "InputError: "),
                                         ("a launch running", "RuntimeError: a launch is running into")])
def test_a_folder_that_cannot_be_opened_is_one_line_and_changes_nothing(two_studies, what, error):
    root = two_studies
    lab = ExploreLab(root / "study-all", root=root)
    folder = root / "study-two"
    if what == "missing":
        folder = root / "no such study"
    elif what == "not a study":
        folder = root.parent / "plain folder"
        folder.mkdir()
    else:  # a launch in progress: the panel would write into the study the researcher left
        release = threading.Event()
        lab.panel.thread = threading.Thread(target=release.wait, daemon=True)
        lab.panel.thread.start()
    try:
        assert lab.chooser.choose(folder) is None
    finally:
        if what == "a launch running":
            release.set()
    assert f"cannot open {folder.resolve()}: {error}" in lab.chooser.error.value, lab.chooser.error.value
    if what == "not a study":
        assert "no runs/ inside" in lab.chooser.error.value
    assert "\n" not in lab.chooser.error.value
    assert lab.explorer.sweep_dir == (root / "study-all").resolve() and len(lab.explorer.results.runs) == 6
    assert lab.panel.sweep_dir == (root / "study-all" / "launched").resolve()
    assert lab.chooser.dropdown.value == str((root / "study-all").resolve())


def test_a_study_outside_runs_is_listed_first(two_studies, tmp_path_factory):
    """Named from the repository (the folder above runs/) when inside it, else in full."""
    inside, outside = two_studies.parent / "elsewhere" / "my study", tmp_path_factory.mktemp("outside") / "study"
    for folder, label in ((inside, "elsewhere/my study (2 runs)"), (outside, f"{outside.resolve()} (2 runs)")):
        shutil.copytree(two_studies / "study-two", folder)
        chooser = StudyChooser(folder, on_choose=lambda folder: None, root=two_studies)
        assert chooser.dropdown.options[0] == (label, str(folder.resolve()))
        assert len(chooser.dropdown.options) == 3 and chooser.dropdown.value == str(folder.resolve())


def test_the_dropdown_counts_the_runs_the_table_shows_and_names_the_controls_and_oracles(two_studies):
    """A study's z-free controls and label oracles are runs/*/summary.json too, but its run table and
    the explorer show only the CVAE runs: the dropdown's count is theirs, the others named beside it."""
    study = two_studies / "study-all"
    for rid, source in zip(sorted(p.name for p in (study / "runs").iterdir()), ("control", "control", "label:strategy")):
        s = study / "runs" / rid / "summary.json"
        atomic_write_json(s, {**read_json(s), "latent_source": source})
    assert count_runs(study / "runs") == {"cvae": 3, "control": 2, "oracle": 1, "given": 0}
    assert len(collect_runs(study / "runs")) == 3  # what the table and the explorer show
    chooser = StudyChooser(study, on_choose=lambda folder: None, root=two_studies)
    labels = sorted(label for label, _ in chooser.dropdown.options)  # (study-all is the newest now)
    assert labels == ["runs/study-all (3 runs; +2 controls, 1 oracle)", "runs/study-two (2 runs)"], labels
    assert count_runs(two_studies / "missing" / "runs")["cvae"] == 0


def test_the_studys_closing_line_names_its_controls_and_oracles_apart():
    """It said "(+ 4 z-free controls and label oracles)" for the smoke preset's 2 controls and 2 strategy
    oracles; now each kind with its own count, and nothing without given-z runs."""
    from zfree_lab.experiment.study_folders import given_line

    assert given_line({"cvae": 2, "control": 2, "oracle": 2, "given": 0}) == " (+ 2 z-free controls, 2 oracles)"
    assert given_line({"cvae": 1, "control": 1, "oracle": 0, "given": 1}) == " (+ 1 z-free control, 1 other given-z run)"
    assert given_line({"cvae": 3, "control": 0, "oracle": 0, "given": 0}) == ""


def test_the_run_table_shows_a_missing_value_as_a_dash(tmp_path):
    """NaN and None (a metric a run did not write, an aid an old run predates) read "–", as in the
    report's tables; the other values are shown as they are, rounded to 4 digits."""
    runs = pd.DataFrame({"run_id": ["a", "b"], "aid": ["none", None], "beta": [0.3, 1.0],
                         "alignment_nmi": [0.123456, np.nan], "task_correctness": [None, 0.5]})
    table = runs_overview(SweepResults(tmp_path, runs, [], None, None))
    assert table.to_dict("records") == [
        {"run": "a", "aid": "none", "β": 0.3, "NMI": 0.1235, "task correct": "–"},
        {"run": "b", "aid": "–", "β": 1.0, "NMI": "–", "task correct": 0.5}]
    html = table.to_html()
    assert "NaN" not in html and "None" not in html and html.count("–") == 3


def test_the_run_table_reads_as_the_report_headers_its_columns_the_data_keeps_its_keys(two_studies):
    """The lab's run table headed its columns with raw keys (``kl_prior_loss``,
    ``baseline_normalized_reconstruction_loss``): each now reads as the report names the same column
    (a short name, its unit where it has one), and only the display changes: the runs, summary.csv's
    columns, keep their keys."""
    from zfree_lab.report import report as R

    lab = ExploreLab(two_studies / "study-all", root=two_studies)
    runs = lab.explorer.results.runs
    table = runs_overview(lab.explorer.results)
    assert list(table.columns) == ["run", "weighting", "latent kind", "aid", "β", "mean w", "KL [nats]", "ρ_recon",
                                   "NMI", "task correct"]
    report = R.run_table(runs, {**R.USE_COLUMNS, **R.QUALITY_COLUMNS})  # the report's table of the same runs
    assert {"KL [nats]", "ρ_recon", "NMI", "task correct"} <= set(report.columns)
    assert table["KL [nats]"].tolist() == runs["kl_prior_loss"].round(4).tolist()  # renamed, not recomputed
    assert {"kl_prior_loss", "baseline_normalized_reconstruction_loss", "alignment_nmi", "recon_weight"} <= set(runs)
    for raw in ("run_id", "kl_prior", "baseline_normalized", "recon_weight", "alignment_nmi", ">beta<"):
        assert raw not in lab.table.value.replace("\u200b", ""), raw
    assert "<th>KL [nats]</th>" in lab.table.value and "<th>ρ_recon</th>" in lab.table.value


def test_the_lab_table_writes_no_none_or_nan(two_studies):
    """A run whose summary.json lacks a metric its study's other runs have: "–" in the lab's table."""
    study = two_studies / "study-all"
    s = next((study / "runs").glob("*/summary.json"))
    atomic_write_json(s, {k: v for k, v in read_json(s).items() if k != "task/correctness"})
    lab = ExploreLab(study, root=two_studies)
    assert "task correct</th>" in lab.table.value and "–" in lab.table.value
    assert "NaN" not in lab.table.value and "None" not in lab.table.value


def test_the_run_table_follows_a_launch(two_studies):
    """Issue 60: after a launch the explorer showed the launched run (7) and the table above it still
    the study's 6. The table shows the runs the explorer shows, the launched ones marked by source,
    refreshed as each launched run ends."""
    from tests.test_widgets import CopyExecutor

    study = two_studies / "study-all"
    lab = ExploreLab(study, steps=3, workers=1, root=two_studies)
    template = lab.explorer.results.runs["run_dir"].iloc[0]
    lab.panel.make_executor = lambda: CopyExecutor(template)
    assert "6 finished runs, 0 failed" in lab.table.value and "launched" not in lab.table.value
    lab.panel.n_beta.value, lab.panel.weightings.value = 1, ("token",)
    lab.panel.launch(wait=True)
    assert lab.panel.label.value == "done: 1/1 ok", lab.panel.label.value
    (launched,) = [p.parent.name for p in (study / "launched" / "runs").glob("*/summary.json")]
    assert len(lab.explorer.results.runs) == 7
    assert "7 finished runs (1 launched), 0 failed" in lab.table.value and launched in lab.table.value
    assert ">launched<" in lab.table.value and ">study<" in lab.table.value  # the source column
    lab.open(two_studies / "study-two")  # another study: its own runs only, no source column
    assert "2 finished runs, 0 failed" in lab.table.value and "source" not in lab.table.value


def test_a_curve_is_named_as_its_run_is_named_in_the_tables(tmp_path):
    """The explorer's training-curve legend (``SweepResults.label``) joins the facets by ", " as the
    report's ``run_label`` does ("distribution, hard_em_then_soft, β=0.3"); it read
    "distribution hard_em_then_soft β=0.3", one phrase."""
    runs = pd.DataFrame({"weighting": ["distribution", "distribution"], "aid": ["none", "hard_em_then_soft"],
                         "beta": [0.3, 0.3]})
    res = SweepResults(tmp_path, runs, [], None, None)
    assert res.label(runs.iloc[1]) == "distribution, hard_em_then_soft, β=0.3"
    assert res.label(runs.iloc[0], with_beta=False) == "distribution, none"
