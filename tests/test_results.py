"""The measured-against-predicted phase boundary (SweepResults.phase_boundary), on a closed form."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from zfree_lab.experiment.results import SweepResults, _half_crossing


def _sweep(runs: pd.DataFrame, n_tokens=10, bayes=math.log(4)) -> SweepResults:
    n = 40
    ex = pd.DataFrame({"id": [f"r{i}" for i in range(n)], "n_tokens": n_tokens, "b": bayes / n_tokens,
                       "bayes_nll": bayes})  # a Bayes-optimal base: no excess
    return SweepResults(Path("."), runs, [], {"c_base": bayes / n_tokens}, ex)


def test_half_crossing_is_geometric_in_beta_and_linear_in_rate():
    beta, h = _half_crossing(np.array([0.3, 0.1, 0.03, 0.15]), np.array([0.0, 0.9, 1.38, 0.1]))
    assert h == ""
    assert beta == pytest.approx(0.1 * 1.5 ** ((0.9 - 0.69) / 0.8), rel=1e-12)
    nan, why = _half_crossing(np.array([0.1, 0.2, 0.3]), np.array([1.0, 0.9, 0.8]))
    assert math.isnan(nan) and "does not fall" in why
    nan, why = _half_crossing(np.array([0.1, 0.2]), np.zeros(2))
    assert math.isnan(nan) and "zero" in why


def test_phase_boundary_against_the_closed_form():
    """plain weighting, |S| = 10 everywhere: beta* = 1/|S| = 0.1 (seed 000), the predicted rate is a
    step from log 4 to 0 there; the measured rates below cross half their plateau at 0.111."""
    betas = [0.03, 0.06, 0.1, 0.15, 0.3]
    rates = [1.38, 1.38, 0.9, 0.1, 0.0]
    runs = pd.DataFrame({"weighting": "plain", "beta": betas, "kl_prior_loss": rates, "aid": "hard_em_then_soft",
                         "latent_kind": "discrete", "run_id": [f"p{i}" for i in range(5)]})
    pb = _sweep(runs).phase_boundary()
    assert len(pb) == 1
    row = pb.iloc[0]
    assert row["beta_half_predicted"] == pytest.approx(0.1, rel=0.03)  # the theory grid's resolution
    assert row["predicted_plateau_rate"] == pytest.approx(math.log(4))
    assert row["beta_half_measured"] == pytest.approx(0.1 * 1.5 ** ((0.9 - 0.69) / 0.8), rel=1e-12)
    assert row["ratio"] == pytest.approx(row["beta_half_measured"] / row["beta_half_predicted"])
    assert bool(row["within"]) is True
    far = runs.assign(beta=[b * 3 for b in betas])  # the same curve at 3x the beta: outside ±25%
    assert bool(_sweep(far).phase_boundary().iloc[0]["within"]) is False


def test_phase_boundary_needs_enough_betas_and_says_why_when_it_cannot_cross():
    runs = pd.DataFrame({"weighting": "plain", "beta": [0.01, 0.02, 0.04], "kl_prior_loss": [1.0, 1.0, 0.9]})
    pb = _sweep(runs).phase_boundary()
    assert math.isnan(pb.iloc[0]["beta_half_measured"]) and "does not fall" in pb.iloc[0]["note"]
    assert _sweep(runs.iloc[:2]).phase_boundary().empty


def test_study_summary_keeps_label_columns_and_notes_of_a_labelled_study(tmp_path):
    """`zfree report` re-aggregates a study: on labelled data (a notes.json) its summary.csv keeps
    the per-label structure columns and the notes; on the synthetic benchmark it is SUMMARY_COLUMNS."""
    import json

    from zfree_lab.experiment.results import SUMMARY_COLUMNS, study_summary

    for rid, beta, nmi in (("b", 0.3, 0.25), ("a", 0.1, 0.5)):
        (tmp_path / "runs" / rid).mkdir(parents=True)
        (tmp_path / "runs" / rid / "summary.json").write_text(json.dumps(
            {"weighting": "plain", "beta": beta, "structure/alignment_nmi/style": nmi, "loss/val/kl_prior_loss": 0.0}))
    assert list(study_summary(tmp_path).columns) == list(SUMMARY_COLUMNS)
    (tmp_path / "notes.json").write_text(json.dumps({"notes": ["label 'strategy': absent", "x"]}))
    t = study_summary(tmp_path)
    assert list(t.columns) == [*SUMMARY_COLUMNS, "structure/alignment_nmi/style", "notes"]
    assert t.set_index("run_id")["structure/alignment_nmi/style"].to_dict() == {"a": 0.5, "b": 0.25}
    assert (t["notes"] == "label 'strategy': absent | x").all()


def test_the_references_data_file_is_found_from_any_working_directory(tmp_path, monkeypatch):
    """The shipped reference stores data_file relative to the repository root; a report runs with
    the study folder as its working directory, where that relative path does not exist (the
    theory curves and shading then vanished from the report). It must resolve against the root,
    and a moved file is found through the runs' own data_dir."""
    from zfree.core.paths import ROOT
    from zfree_lab.experiment.results import _bayes_nll, _reference_data_file

    monkeypatch.chdir(tmp_path)
    rel = "data/synth/default/val.jsonl"
    assert not Path(rel).exists()
    runs = pd.DataFrame({"data_dir": [str(tmp_path / "nowhere")]})
    assert _reference_data_file(rel, runs, tmp_path / "ref") == ROOT / rel
    bayes = _bayes_nll(rel, runs, tmp_path / "ref")
    assert len(bayes) == 1000 and all(np.isfinite(v) for v in bayes.values())
    moved = tmp_path / "copy"
    moved.mkdir()
    (moved / "val.jsonl").write_text((ROOT / rel).read_text())
    runs = pd.DataFrame({"data_dir": [str(moved)]})
    assert _reference_data_file("/gone/val.jsonl", runs, tmp_path / "ref") == moved / "val.jsonl"
    assert _reference_data_file(None, runs, tmp_path) is None


def test_a_dict_or_string_in_a_metric_field_of_a_summary_is_left_out_with_one_warning(tmp_path):
    """Issue 61: a dict or a string in a non-core field of a run's summary.json (a hand edit, a plug-in)
    flowed into summary.csv and the report. Metric fields keep numbers, bools and None; strings stay only
    in the known string fields (the config's, the gate record's), lists only in the aid's traces; the
    rest is left out, with one warning naming the run and the fields."""
    from zfree_lab.experiment.results import collect_runs, summary_with_labels

    run = tmp_path / "study" / "runs" / "plain_beta0.3_abcd1234"
    run.mkdir(parents=True)
    summary = {"weighting": "plain", "beta": 0.3, "steps": 4, "aid": "none", "remedy": "none",
               "aid/gate_split": "val", "aid/gate": [{"step": 2, "pass": True}], "latent_used": True,
               "latent/mutual_information": 0.25, "loss/val/kl_prior_loss": None,
               "latent/codes_used": {"a": 1}, "structure/probe_accuracy/style": "high", "my_plugin/note": "text",
               "latent/q_max_mean": [0.5]}
    (run / "summary.json").write_text(json.dumps(summary))
    with pytest.warns(UserWarning) as record:
        runs = collect_runs(tmp_path / "study" / "runs")
    lines = [str(w.message) for w in record if "left out" in str(w.message)]
    assert len(lines) == 1 and "\n" not in lines[0] and str(run) in lines[0], lines
    for field in ("latent/codes_used", "structure/probe_accuracy/style", "my_plugin/note", "latent/q_max_mean"):
        assert repr(field) in lines[0] and (field not in runs or runs[field].isna().all()), field
    kept = runs.iloc[0]
    assert (kept["weighting"], kept["aid/gate_split"], kept["latent_used"], kept["latent/mutual_information"]) == \
        ("plain", "val", True, 0.25)
    assert kept["aid/gate"] == [{"step": 2, "pass": True}]
    tab = summary_with_labels(runs, [])
    assert tab["codes_used"].isna().all() and "high" not in tab.to_csv() and "{" not in tab.to_csv()
