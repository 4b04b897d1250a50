"""zfree_lab.experiment.study_notes: the visible notes of a study on own (partly labelled) data, the
summary.csv with its per-label columns and notes, and notes.json read back."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from zfree.data.pairs import Pair
from zfree_lab.experiment.study_notes import label_notes, study_notes
from zfree_lab.experiment.tables import write_summary_csv


def _pairs() -> list[Pair]:
    return [Pair("a", "1 2", "2 1", strategy="reverse", labels={"colour": "red", "size": 1}),
            Pair("b", "3 4", "3 4", strategy="copy", labels={"colour": "blue"}),
            Pair("c", "5", "5", labels={"colour": "red", "size": 2})]


def test_label_notes_on_a_partly_labelled_list(tmp_path):
    notes = label_notes(_pairs(), tmp_path)  # no metadata.json
    assert notes[0].startswith("label 'strategy': on 2 of 3 rows only; structure/alignment_nmi")
    assert notes[1] == "label 'size': on 2 of 3 val rows; its metrics use those rows only"  # colour is on every row
    assert notes[2].startswith("labels ['colour', 'size']: structure/<metric>/<label> computed")
    assert notes[3].startswith("task correctness: skipped (no metadata.json with strategies")
    assert len(notes) == 4


def test_label_notes_unlabelled_rows_and_a_benchmark_with_strategies(tmp_path):
    bare = [Pair("a", "1", "1"), Pair("b", "2", "2")]
    notes = label_notes(bare, tmp_path)
    assert notes[0].startswith("label 'strategy': absent (a row's optional top-level `strategy`: the generating "
                               "strategy, which the synthetic benchmark knows and own data rarely has); ")
    assert "labels: none in the val rows; structure/<metric>/<label> is skipped" in notes
    (tmp_path / "metadata.json").write_text(json.dumps({"parameters": {"strategies": ["copy", "reverse"]}}))
    full = [Pair("a", "1", "1", strategy="copy", labels={"k": 1}), Pair("b", "2", "2", strategy="reverse", labels={"k": 2})]
    notes = label_notes(full, tmp_path)  # every label on every row, strategies known: only the computed note
    assert len(notes) == 1 and notes[0].startswith("labels ['k']: structure/<metric>/<label> computed")
    (tmp_path / "metadata.json").write_text(json.dumps({"parameters": {"strategies": []}}))
    assert label_notes(full, tmp_path)[-1].startswith("task correctness: skipped")


def test_write_summary_csv_keeps_the_label_columns_and_joins_the_notes(tmp_path):
    for run_id, beta, nmi in (("r2", 1.0, 0.25), ("r1", 0.3, 0.75)):
        d = tmp_path / "runs" / run_id
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"weighting": "plain", "beta": beta,
                                                    "structure/alignment_nmi/colour": nmi,
                                                    "structure/alignment_nmi": 0.1}))
    (tmp_path / "notes.json").write_text(json.dumps({"notes": ["note one", "note two"]}))
    tab = write_summary_csv(tmp_path)  # the one writer of summary.csv: the notes from notes.json
    assert list(tab["run_id"]) == ["r1", "r2"]  # sorted by weighting, beta
    assert list(tab["structure/alignment_nmi/colour"]) == [0.75, 0.25]  # aligned with its run
    assert set(tab["notes"]) == {"note one | note two"}
    back = pd.read_csv(tmp_path / "summary.csv")
    assert list(back.columns) == list(tab.columns) and list(back["run_id"]) == ["r1", "r2"]


def test_write_summary_csv_of_no_runs_and_study_notes(tmp_path):
    (tmp_path / "runs").mkdir()
    assert study_notes(tmp_path) == {}
    (tmp_path / "notes.json").write_text(json.dumps({"notes": ["only"]}))
    tab = write_summary_csv(tmp_path)
    assert tab.empty and "notes" in tab.columns and (tmp_path / "summary.csv").exists()
    (tmp_path / "notes.json").write_text(json.dumps({"labels": ["x"]}))
    assert study_notes(str(tmp_path)) == {"labels": ["x"]}


def test_summary_csv_has_one_writer():
    """Only zfree_lab.experiment.tables writes summary.csv (a study once, after its grid; `zfree report`
    before rendering): no other module of src writes a file named summary.csv."""
    import re
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src"
    write = re.compile(r"atomic_write_text\([^)]*summary\.csv")
    writers = sorted(p.relative_to(src).as_posix() for p in src.rglob("*.py") if write.search(p.read_text()))
    assert writers == ["zfree_lab/experiment/tables.py"]


def test_a_label_some_training_row_lacks_is_noted_as_getting_no_oracle(tmp_path):
    """A key on every val row but one training row only: ``oracle_labels`` trains no oracle for it,
    and the study's notes say so (before, it was dropped without a word)."""
    from zfree_lab.experiment.controls import oracle_labels

    train = [{"id": f"t{i}", "x": str(i), "y": str(i), "labels": {"colour": "red" if i % 2 else "blue",
                                                                   **({"mood": "glad"} if i == 0 else {})}}
             for i in range(6)]
    val = [Pair(f"v{i}", str(i), str(i), labels={"colour": "red" if i % 2 else "blue", "mood": "glad" if i else "sad"})
           for i in range(4)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    (tmp_path / "val.jsonl").write_text("".join(json.dumps({"id": p.id, "x": p.x, "y": p.y, "labels": p.labels}) + "\n"
                                                for p in val))
    assert oracle_labels(tmp_path) == {"colour": 2}  # mood: no oracle
    notes = label_notes(val, tmp_path, oracles=True)
    assert ("label 'mood': on 1 of 6 train rows and 4 of 4 val rows; no label oracle for it (an oracle needs the "
            "label on every row)") in notes
    assert not any("'colour'" in n and "no label oracle" in n for n in notes)
    assert not any("no label oracle" in n for n in label_notes(val, tmp_path))  # a study without oracles


def test_a_label_capped_for_its_oracle_is_noted_when_only_train_holds_its_many_values(tmp_path):
    """5,000 distinct values over train + val, 4 on the few val rows: the oracle is capped
    (``capped_values`` counts train + val), so the note must count there too."""
    from zfree.data.labels import LABEL_VALUE_CAP

    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"id": f"t{i}", "x": "x", "y": "y",
                                                              "labels": {"many": f"u{i}"}}) + "\n" for i in range(4996)))
    val = [Pair(f"v{i}", "x", "y", labels={"many": f"w{i}"}) for i in range(4)]
    notes = label_notes(val, tmp_path)
    assert (f"label 'many': 5000 values on the train and val rows; its oracle distinguishes the {LABEL_VALUE_CAP - 1} "
            "most frequent over train + val and pools the rest as '<other>'") in notes


@pytest.mark.parametrize("damage", [b"", b'{"notes": ["cut', b"[1, 2]", b"\xff\xfe{}"])
def test_a_damaged_notes_json_is_one_line_naming_the_file(tmp_path, capsys, damage):
    """issue 61: ``zfree report`` on a study whose notes.json is torn, not an object or not UTF-8 said
    ``zfree: error: Expecting value: line 1 column 1 (char 0)`` (or a traceback), naming no file."""
    from zfree_lab.cli import main
    from zfree.core.errors import InputError

    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"weighting": "plain", "beta": 0.3}))
    notes = tmp_path / "notes.json"
    notes.write_bytes(damage)
    with pytest.raises(InputError, match=rf"^{re.escape(str(notes))}: not a study's notes \(.+\); rerun the "
                                         r"study's command to write it anew, or move it away$"):
        study_notes(tmp_path)
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"zfree: error: {notes}: not a study's notes ("), err
    assert notes.read_bytes() == damage
