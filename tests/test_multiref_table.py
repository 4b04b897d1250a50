"""zfree_lab.experiment.multiref_table on a hand-built study folder: a CVAE run (K = 2 greedy outputs),
its z-free control (3 samples, of which the first K are scored on the same MRs), a label oracle
sharing the control, and runs without multiref.parquet left out; the values are
``multiref_metrics`` of the same outputs."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from zfree.evaluate.multiref import multiref_metrics
from zfree_lab.experiment.multiref_table import MULTIREF_CSV_COLUMNS, multiref_table, write_multiref_csv

REFS = {"m1": ["the pub is by the river", "by the river is a pub"], "m2": ["a cheap cafe", "the cafe is cheap"],
        "m3": ["x y"]}


def _run(root, run_id, outputs: dict[str, list[str]], kind: str, **summary):
    d = root / "runs" / run_id
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"weighting": "plain", "beta": 0.1, **summary}))
    if outputs:
        rows = [{"id": i, "x": i, "kind": kind, "index": j, "output": o, "references": REFS[i]}
                for i, outs in outputs.items() for j, o in enumerate(outs)]
        pd.DataFrame(rows).to_parquet(d / "multiref.parquet", index=False)


def test_runs_with_their_control_beside_them(tmp_path):
    cvae = {"m1": ["the pub is by the river", "by the river is a pub"], "m2": ["a cheap cafe", "a cheap cafe"]}
    ctrl = {"m1": ["the pub is near", "a pub", "the river"], "m2": ["cafe", "the cafe is cheap", "cheap"],
            "m3": ["x", "y", "z"]}  # an MR the run did not decode: left out of the control's scores
    oracle = {"m1": ["the pub", "by the river"], "m2": ["the cafe", "a cafe"]}
    _run(tmp_path, "run_a", cvae, "greedy", latent_source="posterior", aid="none")
    _run(tmp_path, "control_a", ctrl, "sampled", latent_source="control")
    _run(tmp_path, "oracle-x_a", oracle, "greedy", latent_source="label:x")
    _run(tmp_path, "old_run", {}, "greedy", latent_source="posterior")  # finished before multiref existed
    (tmp_path / "controls.json").write_text(json.dumps({"controls": {"run_a": "control_a", "old_run": "control_a"},
                                                        "oracles": {"oracle-x_a": {"control": "control_a"}}}))
    tab = multiref_table(tmp_path)
    assert list(tab.columns) == MULTIREF_CSV_COLUMNS and list(tab["run_id"]) == ["oracle-x_a", "run_a"]
    row = tab.set_index("run_id").loc["run_a"]
    own = multiref_metrics(list(cvae.values()), [REFS["m1"], REFS["m2"]])
    want_ctrl = multiref_metrics([ctrl["m1"][:2], ctrl["m2"][:2]], [REFS["m1"], REFS["m2"]])
    assert row["k"] == 2 and row["n_mrs"] == 2 and row["control_id"] == "control_a"
    assert row["pairwise_bleu"] == pytest.approx(own["multiref/pairwise_bleu"])
    assert row["refs_covered"] == pytest.approx(1.5)  # m1: both references, m2: one
    assert row["control_pairwise_bleu"] == pytest.approx(want_ctrl["multiref/pairwise_bleu"])
    assert row["control_refs_covered"] == pytest.approx(want_ctrl["multiref/refs_covered"])
    assert row["control_n_mrs"] == 2
    assert tab.set_index("run_id").loc["oracle-x_a", "latent_source"] == "label:x"
    written = write_multiref_csv(tmp_path)
    assert written is not None and pd.read_csv(tmp_path / "multiref.csv")["run_id"].tolist() == ["oracle-x_a", "run_a"]


def test_no_outputs_no_file_and_a_missing_control_is_nan(tmp_path):
    _run(tmp_path, "old_run", {}, "greedy", latent_source="posterior")
    assert write_multiref_csv(tmp_path) is None and not (tmp_path / "multiref.csv").exists()
    _run(tmp_path, "run_b", {"m1": ["a", "b", "c"]}, "greedy", latent_source="posterior")
    row = multiref_table(tmp_path).iloc[0]  # no controls.json: the control's columns are NaN
    assert row["k"] == 3 and math.isnan(row["control_pairwise_bleu"]) and row["control_id"] is None
