"""The main job at smoke size: papermill runs, summary.csv, report.html; rerun skips; failures recorded."""

from __future__ import annotations

import pandas as pd
import pytest

from zfree.study import SUMMARY_COLUMNS, run_study


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("study")
    run_study("smoke", out, progress=False)
    return out


def test_smoke_study_writes_every_artifact(smoke):
    for f in ("summary.csv", "report.html", "report.ipynb", "base/reference/reference.json", "base/model"):
        assert (smoke / f).exists(), f
    table = pd.read_csv(smoke / "summary.csv")
    assert list(table.columns) == list(SUMMARY_COLUMNS)
    assert sorted(table["weighting"]) == ["distribution", "plain"]
    assert table["kl_prior_loss"].notna().all() and table["predicted_use_fraction"].between(0, 1).all()
    for rid in table["run_id"]:
        run = smoke / "runs" / rid
        for f in ("config.json", "metrics.jsonl", "summary.json", "per_example.parquet",
                  "checkpoint/model.safetensors", "train_cvae.ipynb"):
            assert (run / f).exists(), (rid, f)
    html = (smoke / "report.html").read_text()
    assert "predicted" in html.lower() and "<img" in html and "import pandas" not in html  # code hidden


def test_rerun_skips_finished_runs(smoke):
    stamps = {p: p.stat().st_mtime_ns for p in (smoke / "runs").glob("*/summary.json")}
    run_study("smoke", smoke, progress=False)
    assert {p: p.stat().st_mtime_ns for p in (smoke / "runs").glob("*/summary.json")} == stamps


def test_unknown_preset_lists_valid_ones(tmp_path):
    with pytest.raises(ValueError, match="default"):
        run_study("nope", tmp_path)
