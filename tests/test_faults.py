"""Fault injection for issue 13, one test (or more) per row of its table; each checks the
outcome (the right value, or a one-line error naming the field, row or file) and that finished
runs stay byte-identical (``finished``, a finished run folder, is snapshotted before and after
each fault that touches a run folder).

| row                                             | test                                                      |
|-------------------------------------------------|-----------------------------------------------------------|
| crafted checkpoint/state.pt + --resume           | test_crafted_state_pt_runs_nothing_on_resume,            |
|                                                 | test_old_layout_state_pt_is_read_as_plain_tensors_only;   |
|                                                 | tests/test_io.py::test_crafted_pickle_is_refused_...      |
| finished run + --set beta=0.9, same --out        | test_finished_run_of_another_config_is_refused            |
| two sweeps on one folder                         | test_second_sweep_on_a_folder_is_refused_naming_the_pid;  |
|                                                 | test_a_locked_run_folder_is_refused_naming_the_pid        |
| SIGKILL of zfree sweep                           | test_sigkill_of_a_sweep_leaves_no_process_behind          |
| a sweep with one failing point                   | test_failing_point_exits_1_with_full_message_and_path     |
| truncated/empty model.safetensors / state.pt     | test_damaged_checkpoint_falls_back ; test_io.py          |
| lr_new=1e30 (NaN evaluation)                     | test_nonfinite_evaluation_stops_before_checkpoint         |
| --set steps=true                                 | test_typed_set_values_are_refused_naming_the_field        |
| warmup_backbone/decode_rows=abc, device=cuda     | test_typed_set_values_..., test_unavailable_device_...    |
| YAML tab, workers: two, geomspace from 0         | test_bad_yaml_is_one_error_naming_file_and_field          |
| YAML lr_new: 1e-3                                | test_yaml_1e_minus_3_is_a_float                           |
| reference.json c_base x10                        | test_edited_c_base_is_refused_naming_the_file             |
| corrupted parquet in the score cache             | not here: zfree.reference.scoring's cache (another issue's owner)   |
| JSONL with a UTF-8 BOM                           | test_jsonl_with_a_bom_is_read                             |
| non-finite loss                                  | test_nonfinite_loss_is_one_line_exit_2                    |

Issue 22, item 3 (refusals with one line naming the field):

| case                                             | test                                                      |
|--------------------------------------------------|-----------------------------------------------------------|
| own spec aids: [hard_em_then_soft] / a typo      | test_unknown_grid_aid_is_refused_listing_the_valid_ones   |
| --out "" (an unset $OUT), any empty path option  | test_empty_out_or_path_is_refused_naming_the_option,      |
|                                                  | test_empty_out_dir_is_refused_by_the_python_api_too       |
| --out / --resume / a study folder that is a file | test_an_output_folder_that_is_a_file_is_refused_naming... |
| --preset with --spec                             | test_preset_with_spec_is_refused                          |
| !!python/object/apply in an own / sweep spec     | test_yaml_tags_in_an_own_spec_are_refused_naming_file_..., |
|                                                  | test_yaml_tags_in_a_sweep_spec_are_refused_the_same_way   |
| a 300-character --out / sweep / own-spec name    | test_too_long_names_are_refused_naming_the_limit          |
| a lone surrogate in x or y                       | test_lone_surrogate_is_refused_naming_file_row_and_field  |
| eval_rows/decode_rows: 1e9 on a few rows         | test_eval_and_decode_rows_beyond_the_data_are_recorded_...  |
| a 45-token tokenizer on a 1000-row embedding     | test_a_tokenizer_far_smaller_than_the_embedding_is_refused |
| GPT2TokenizerFast(vocab_file=, merges_file=)     | test_a_gpt2_tokenizer_built_from_vocab_files_is_refused   |

Issue 61 (bad inputs nobody tried; the other cases' tests are named beside them):

| case                                             | test                                                      |
|--------------------------------------------------|-----------------------------------------------------------|
| --data / --val a folder (train, study, score)    | test_data_given_as_a_folder_is_one_line_naming_it         |
| --data / --val / --model path missing (a typo)  | test_a_missing_data_file_or_model_path_is_one_line_...   |
| a tokenizer without an eos token                 | test_a_tokenizer_without_eos_is_refused_in_one_line_...   |
| --budget 0                                       | tests/test_estimate.py::test_a_zero_budget_is_refused_... |
| a damaged notes.json                             | tests/test_study_notes.py::test_a_damaged_notes_json_...  |
| a 300-character or non-ASCII label key           | tests/test_controls.py::test_an_oracles_folder_name_...   |
| --out someone else's (non-empty) folder          | tests/test_folder_safety.py::test_zfree_train_refuses_... |
| W&B offline file read while still being written  | tests/test_live_curves.py::test_wandb_file_is_complete_...|
| zfree study --out someone else's (non-empty) folder | tests/test_folder_safety.py::test_zfree_study_refuses_... |
| --out inside the installed package (train, study) | tests/test_folder_safety.py::test_out_inside_the_installed_...|
| a model replaced in the same folder (study rerun) | tests/test_own_study.py::test_a_model_replaced_in_its_...    |
| --data /dev/zero (train, study, score)           | tests/test_pairs_labels.py::test_dev_zero_as_data_is_...  |
| a data file over the stated byte / row limit     | tests/test_pairs_labels.py::test_a_data_file_over_the_... |
| a literal <|endoftext|> / <eos> in y (or x)      | tests/test_conventions.py::test_special_token_text_in_... |
| SIGTERM (or a failed cell) during zfree report   | tests/test_notebook_exec.py::test_an_interrupted_report...|
| kill -9 of zfree report: its .partial.ipynb      | tests/test_notebook_exec.py::test_the_partial_file_of_... |
| kill -9 between a run's summary.json and notebook | tests/test_notebook_exec.py::test_a_run_killed_between_...|
| a dict or string in a summary.json metric field  | tests/test_results.py::test_a_dict_or_string_in_a_metric...|
| GGUF bytes saved as pytorch_model.bin            | tests/test_fetch.py::test_gguf_bytes_saved_as_pytorch_... |
| disk full at a checkpoint (safetensors 0.8 text) | tests/test_interrupts.py::test_disk_full_checkpoint_is_...|
| disk full during zfree report (no file named)    | tests/test_folder_safety.py::test_a_full_disk_during_...  |
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
import yaml

from tests.test_io import _Evil
from tests.test_locks import hold_lock
from tests.tiny_sweep import tiny_base_flat
from zfree.config import TrainConfig
from zfree.core.errors import ConfigError
from zfree_lab.run.locks import run_folder_lock
from zfree_lab.cli import main

SPEC_KEYS = ("data_dir", "base_dir", "steps", "batch_size", "eval_every", "eval_rows", "decode_rows", "warmup_backbone")


@pytest.fixture(scope="module")
def tiny(tiny_run):
    return tiny_run


@pytest.fixture(scope="module")
def finished(tiny, tmp_path_factory):
    """A finished tiny run folder (never to be changed by any fault below)."""
    from zfree_lab.run.training import train_cvae

    data, base = tiny
    run = tmp_path_factory.mktemp("faults") / "run"
    train_cvae(TrainConfig.from_flat(tiny_base_flat(data, base, beta=0.3)), run, progress=False)
    return run


def snapshot(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` (lock files aside): "byte-identical" made checkable."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".zfree.lock"}


def one_error_line(capsys) -> str:
    """The one ``zfree: error:`` line on stderr (progress bars aside), with no traceback."""
    err = capsys.readouterr().err
    lines = [line for line in re.split(r"[\r\n]", err) if line.startswith("zfree: error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    return lines[0]


def write_spec(folder: Path, spec: dict) -> Path:
    f = folder / "spec.yaml"
    f.write_text(yaml.safe_dump(spec))
    return f


# --- values typed where they enter -----------------------------------------------------------

@pytest.mark.parametrize("kv, field", [("steps=true", "steps"), ("warmup_backbone=abc", "warmup_backbone"),
                                       ("decode_rows=abc", "decode_rows"), ("lr_new=fast", "lr_new"),
                                       ("weighting=tokens", "weighting"), ("betta=1", "betta")])
def test_typed_set_values_are_refused_naming_the_field(tmp_path, finished, capsys, kv, field):
    before = snapshot(finished)
    out = tmp_path / "new"
    assert main(["train", "--config", str(finished / "config.json"), "--set", kv, "--out", str(out)]) == 2
    assert field in one_error_line(capsys)
    assert not out.exists() and snapshot(finished) == before


def test_set_values_are_typed_by_the_declaration():
    from zfree.config import parse_assignment

    assert parse_assignment("weighting=token") == ("weighting", "token")  # not json.loads("token")
    assert parse_assignment("lr_new=1e-3") == ("lr_new", 0.001)
    assert parse_assignment("steps=12") == ("steps", 12)
    assert parse_assignment("device=cuda:1") == ("device", "cuda:1")


def test_notebook_parameters_are_checked_as_python_values():
    # papermill passes Python values into the parameters cell, then from_flat
    with pytest.raises(ValueError, match="steps=True must be an integer"):
        TrainConfig.from_flat({**TrainConfig().to_flat(), "steps": True})
    with pytest.raises(ValueError, match="weighting=1"):
        TrainConfig.from_flat({**TrainConfig().to_flat(), "weighting": 1})
    assert TrainConfig.from_flat({**TrainConfig().to_flat(), "lr_new": 1}).optim.lr_new == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_unavailable_device_is_refused_naming_it(tmp_path, finished, capsys):
    out = tmp_path / "new"
    assert main(["train", "--config", str(finished / "config.json"), "--set", "device=cuda", "--out", str(out)]) == 2
    assert "device='cuda' is not available" in one_error_line(capsys)
    assert not out.exists()


@pytest.mark.parametrize("text, match", [
    ("grid:\n\tbeta: [0.1]\n", r"spec.yaml:2:1: not valid YAML: .*tab"),
    ("grid: {beta: [0.1]}\nworkers: two\n", r"spec.yaml: workers='two' must be an integer"),
    ("grid: {beta: {geomspace: [0, 1, 3]}}\n", r"spec.yaml: grid.beta: geomspace needs lo > 0"),
    ("grid: {beta: {geomspace: [a, 1, 3]}}\n", r"spec.yaml: grid.beta.geomspace\[0\] \(lo\)='a' must be a number"),
    ("grid: {beta: [0.1]}\nbase: {steps: true}\n", r"spec.yaml: steps=True must be an integer"),
    ("grid: {beta: [0.1]}\nbase: {warmup_backbone: abc}\n", r"spec.yaml: warmup_backbone='abc' must be an integer"),
    ("grid: {beta: [0.1]}\nbase: [1]\n", r"spec.yaml: base must be a mapping"),
])
def test_bad_yaml_is_one_error_naming_file_and_field(tmp_path, capsys, text, match):
    f = tmp_path / "spec.yaml"
    f.write_text(text)
    assert main(["sweep", str(f), "--out", str(tmp_path / "sw"), "--no-report"]) == 2
    assert re.search(match, one_error_line(capsys))
    assert not (tmp_path / "sw").exists()


def test_yaml_1e_minus_3_is_a_float(tmp_path):
    from zfree_lab.experiment.sweeps import load_spec

    f = tmp_path / "spec.yaml"
    f.write_text("base: {lr_new: 1e-3}\ngrid: {lr_backbone: [1e-5, 3.0e-5]}\n")  # YAML 1.1: '1e-3' is a string
    points = load_spec(f, check_paths=False).points()
    assert {p.params["lr_new"] for p in points} == {0.001}
    assert sorted(p.params["lr_backbone"] for p in points) == [1e-5, 3e-5]


# --- issue 22: refusals with one line naming the field -------------------------------------------
# each fails on 34a54c8 (an unaided run, a file written into the cwd, a traceback, a value recorded
# as given); the table of the closing note is in the commit message

def _own_spec(tmp_path: Path, text: str) -> Path:
    f = tmp_path / "grid.yaml"
    f.write_text(text)
    return f


def _placeholders(folder: Path) -> tuple[str, str]:
    """An existing ``--model`` folder (a config.json alone: never loaded, the refusal under test comes first) and
    ``--data`` file (one valid row) in ``folder``: a missing path, or a folder that holds no model, is refused
    before anything else (``zfree_lab.cli.path_args.check_path_args``), so a test of a later refusal gives
    paths that are what they should be."""
    (folder / "m").mkdir(exist_ok=True)
    (folder / "m" / "config.json").write_text("{}")
    (folder / "d.jsonl").write_text('{"x": "a", "y": "b"}\n')
    return str(folder / "m"), str(folder / "d.jsonl")


def _no_study(monkeypatch) -> list:
    """Stub what the studies run (a refusal must come before it: the own study's spec is read
    before its pipeline runs); the calls made."""
    from types import SimpleNamespace

    import zfree_lab.experiment.own_study as own_study
    import zfree_lab.experiment.study as study

    calls: list = []
    monkeypatch.setattr(own_study, "run_experiment", lambda *a, **kw: calls.append(("own", a, kw))
                        or SimpleNamespace(html=Path(a[1]) / "report.html", out=Path(a[1])))
    monkeypatch.setattr(study, "run_study", lambda *a, **kw: calls.append(("study", a, kw)) or Path(a[1]))
    return calls


def test_no_report_reaches_both_kinds_of_study(tmp_path, monkeypatch):
    """``zfree study --no-report``: the shipped-base study and the own-data study are run without rendering."""
    from zfree_lab.cli import main

    calls = _no_study(monkeypatch)
    model, data = _placeholders(tmp_path)
    for extra in ([], ["--no-report"]):
        assert main(["study", "--preset", "smoke", "--out", str(tmp_path / "a"), "--no-estimate", *extra]) == 0
        assert main(["study", "--model", model, "--data", data, "--out", str(tmp_path / "b"), "--no-estimate",
                     *extra]) == 0
    assert [(kind, kw["render"]) for kind, _, kw in calls] == [("study", True), ("own", True), ("study", False),
                                                              ("own", False)]


@pytest.mark.parametrize("aids", ["[hard_em_then_soft]", "[none, hard_emm]", "[none, 3]"])
def test_unknown_grid_aid_is_refused_listing_the_valid_ones(tmp_path, capsys, monkeypatch, aids):
    from zfree_lab.experiment.own_study import load_own_spec
    from zfree_lab.experiment.spec import BoundaryGrid
    from zfree_lab.experiment.spec_file import spec_from_dict

    spec = _own_spec(tmp_path, f"weightings: [distribution]\naids: {aids}\n")
    out, (model, data) = tmp_path / "study", _placeholders(tmp_path)
    assert main(["study", "--model", model, "--data", data, "--spec", str(spec), "--out", str(out)]) == 2
    line = one_error_line(capsys)
    assert f"{spec}: aids" in line and "'none', 'hard_em'" in line
    assert not out.exists()
    good = load_own_spec(_own_spec(tmp_path, "aids: [hard_em]\n"))  # one name as given
    bad = {**good.to_dict(), "boundary": {**good.to_dict()["boundary"], "aids": ["hard_em_then_soft"]}}
    with pytest.raises(ConfigError, match="aids"):  # the JSON round trip and the Python API too
        spec_from_dict(bad)
    with pytest.raises(ConfigError, match="weightings"):
        BoundaryGrid(weightings=("tokens",))


@pytest.mark.parametrize("argv", [
    ["study", "--preset", "smoke", "--out", ""],
    ["study", "--preset", "smoke", "--out", "  "],
    ["study", "--model", "m", "--data", "d.jsonl", "--out", ""],
    ["score", "--model", "m", "--data", "d.jsonl", "--out", ""],
    ["train", "--config", "c.json", "--out", ""],
    ["sweep", "s.yaml", "--out", ""],
    ["data", "synth", "--out", ""],
    ["study", "--model", "", "--data", "d.jsonl", "--out", "o"],
])
def test_empty_out_or_path_is_refused_naming_the_option(tmp_path, capsys, monkeypatch, argv):
    calls = _no_study(monkeypatch)
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    flag = argv[argv.index("") - 1] if "" in argv else "--out"
    assert f"zfree: error: {flag} is empty" in one_error_line(capsys)
    assert not calls and not list(tmp_path.iterdir())  # nothing written into the current folder


@pytest.mark.parametrize("argv", [
    ["score", "--model", "m", "--data", "d.jsonl", "--out", "afile"],
    ["study", "--preset", "smoke", "--out", "afile"],
    ["train", "--config", "c.json", "--out", "afile"],
    ["train", "--resume", "afile"],
    ["report", "afile"],
])
def test_an_output_folder_that_is_a_file_is_refused_naming_the_option(tmp_path, capsys, monkeypatch, argv):
    """`zfree score --out FILE` said "[Errno 17] File exists: 'FILE'" after loading the model and scoring."""
    calls = _no_study(monkeypatch)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("mine\n")
    assert main(argv) == 2
    flag = argv[argv.index("afile") - 1] if argv[0] != "report" else "study_dir"
    assert f"zfree: error: {flag} afile: a file, not a folder" in one_error_line(capsys)
    assert not calls and (tmp_path / "afile").read_text() == "mine\n"


def test_a_report_of_a_folder_that_does_not_exist_says_so(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert f"zfree: error: {tmp_path / 'nope'}: no such folder: give a study or sweep folder" in one_error_line(capsys)
    assert not (tmp_path / "nope").exists()


def test_a_report_of_one_runs_folder_points_to_zfree_status(tmp_path, capsys):
    run = tmp_path / "one-run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    assert main(["report", str(run)]) == 2
    line = one_error_line(capsys)
    assert f"{run} is one run's folder (config.json, no runs/): `zfree status {run}` prints its numbers" in line
    assert sorted(p.name for p in run.iterdir()) == ["config.json"]


def test_empty_out_dir_is_refused_by_the_python_api_too(tiny, tmp_path, monkeypatch):
    from zfree_lab.experiment.pipeline import run_experiment
    from zfree_lab.experiment.study import PRESETS
    from zfree_lab.run.training import train_cvae

    data, base = tiny
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="out_dir is empty"):
        train_cvae(TrainConfig.from_flat(tiny_base_flat(data, base)), "", progress=False)
    with pytest.raises(ConfigError, match="out_dir is empty"):
        run_experiment(PRESETS["smoke"], " ", progress=False, render=False)
    assert not list(tmp_path.iterdir())


def test_preset_with_spec_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths below: nothing may land in the clone
    calls = _no_study(monkeypatch)
    spec = _own_spec(tmp_path, "weightings: [distribution]\n")
    _placeholders(tmp_path)
    assert main(["study", "--model", "m", "--data", "d.jsonl", "--preset", "own_smoke", "--spec", str(spec),
                 "--out", str(tmp_path / "o")]) == 2
    line = one_error_line(capsys)
    assert "--preset 'own_smoke' and --spec" in line and "give one" in line
    assert not calls


def _tagged(tmp_path: Path) -> tuple[str, Path]:
    marker = tmp_path / "executed"
    return f"aids: !!python/object/apply:os.mkdir [{json.dumps(str(marker))}]\n", marker


def test_yaml_tags_in_an_own_spec_are_refused_naming_file_and_line(tmp_path, capsys, monkeypatch):
    calls = _no_study(monkeypatch)
    text, marker = _tagged(tmp_path)
    spec = _own_spec(tmp_path, "weightings: [distribution]\n" + text)
    model, data = _placeholders(tmp_path)
    assert main(["study", "--model", model, "--data", data, "--spec", str(spec), "--out", str(tmp_path / "o")]) == 2
    line = one_error_line(capsys)
    assert f"{spec}:2:" in line and "python/object/apply" in line and "no tags" in line
    assert not marker.exists() and not calls


def test_yaml_tags_in_a_sweep_spec_are_refused_the_same_way(tmp_path, capsys):
    text, marker = _tagged(tmp_path)
    f = tmp_path / "spec.yaml"
    f.write_text("grid: {beta: [0.1]}\n" + text.replace("aids", "name"))
    assert main(["sweep", str(f), "--out", str(tmp_path / "sw"), "--no-report"]) == 2
    assert f"{f}:2:" in one_error_line(capsys) and not marker.exists()


def test_too_long_names_are_refused_naming_the_limit(tiny, tmp_path, capsys, monkeypatch):
    data, base = tiny
    calls = _no_study(monkeypatch)
    monkeypatch.chdir(tmp_path)
    long = "n" * 300
    assert main(["study", "--preset", "smoke", "--out", str(tmp_path / long)]) == 2  # a study folder
    line = one_error_line(capsys)
    assert "--out" in line and "300 bytes" in line and "at most 255 bytes" in line
    spec = write_spec(tmp_path, {"name": long, "base": _spec_base(data, base), "grid": {"beta": [0.3]}})
    assert main(["sweep", str(spec), "--no-report"]) == 2  # default folder runs/sweep-<name>
    line = one_error_line(capsys)
    assert f"{spec}: name" in line and "at most 255 bytes" in line
    own = _own_spec(tmp_path, f"name: {long}\n")
    _placeholders(tmp_path)
    assert main(["study", "--model", "m", "--data", "d.jsonl", "--spec", str(own), "--out", "o"]) == 2
    assert f"{own}: name" in one_error_line(capsys)
    assert not calls and not (tmp_path / "runs").exists() and not (tmp_path / "o").exists()


def test_lone_surrogate_is_refused_naming_file_row_and_field(tiny, tmp_path, capsys):
    from zfree.core.errors import InputError
    from zfree.data.pairs import load_pairs

    data, base = tiny
    f = tmp_path / "d.jsonl"
    f.write_text('{"id": "a", "x": "1 2", "y": "2 1"}\n{"id": "b", "x": "3 \\ud800", "y": "3"}\n')
    with pytest.raises(InputError, match=r"d.jsonl:2: field 'x' holds a lone surrogate U\+D800"):
        load_pairs(f)
    f.write_text('{"id": "a", "x": "1 2", "y": "2 \\udfff"}\n')
    out = tmp_path / "scores"
    assert main(["score", "--model", str(base / "model"), "--data", str(f), "--out", str(out), "--no-cache"]) == 2
    assert "d.jsonl:1: field 'y' holds a lone surrogate U+DFFF" in one_error_line(capsys)
    assert not out.exists()


def test_eval_and_decode_rows_beyond_the_data_are_recorded_as_used(tiny, tmp_path, capsys):
    from zfree.data.pairs import load_pairs
    from zfree_lab.run.training import train_cvae

    data, base = tiny
    n_val = len(load_pairs(Path(data) / "val.jsonl"))
    run = tmp_path / "run"
    train_cvae(TrainConfig.from_flat(tiny_base_flat(data, base, eval_rows=10**9, decode_rows=10**9)), run,
               progress=False)
    rec = json.loads((run / "config.json").read_text())
    assert rec["eval_rows"] == 10**9 and rec["decode_rows"] == 10**9  # the config as given (resume compares it)
    assert rec["_rows_used"] == {"eval_rows": n_val, "decode_rows": n_val}
    assert f"eval_rows=1000000000 but {Path(data) / 'val.jsonl'} has {n_val} rows" in capsys.readouterr().out


@pytest.mark.parametrize("rows, refused", [(1000, True), (64, False), (45, False)])
def test_a_tokenizer_far_smaller_than_the_embedding_is_refused(tmp_path, rows, refused):
    from zfree.core.errors import ModelLoadError
    from zfree_lab.run.tokenizer import build_digit_tokenizer
    from zfree.models.base import build_synthetic_gpt2
    from zfree.models.loading import load_causal_lm

    tok = build_digit_tokenizer(40)  # 45 tokens
    model = build_synthetic_gpt2(rows, n_layer=1, n_embd=16, n_head=2)  # 64: padded to a multiple of 64
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    if not refused:
        load_causal_lm(tmp_path / "m", device="cpu")
        return
    with pytest.raises(ModelLoadError, match=r"m: its tokenizer has 45 tokens but the embedding table 1000 rows"):
        load_causal_lm(tmp_path / "m", device="cpu")


# --- references and data ----------------------------------------------------------------------

def test_edited_c_base_is_refused_naming_the_file(tiny, tmp_path):
    from zfree.reference.reference import load_reference, resolve_reference

    data, base = tiny
    copy = tmp_path / "base"
    shutil.copytree(base, copy)
    ref_json = copy / "reference" / "reference.json"
    meta = json.loads(ref_json.read_text())
    load_reference(copy)  # intact: accepted
    meta["c_base"] *= 10  # hashes intact
    ref_json.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=f"{re.escape(str(ref_json))}: c_base=.* is not the mean of b"):
        load_reference(copy)
    with pytest.raises(ValueError, match="reference.json"):
        resolve_reference("entangled_run", copy, data)


def test_jsonl_with_a_bom_is_read(tmp_path):
    from zfree.data.pairs import load_pairs

    f = tmp_path / "d.jsonl"
    f.write_bytes(b"\xef\xbb\xbf" + b'{"id": "a", "x": "1 2", "y": "2 1"}\n{"id": "b", "x": "3", "y": "3"}\n')
    assert [(p.id, p.x, p.y) for p in load_pairs(f)] == [("a", "1 2", "2 1"), ("b", "3", "3")]


def test_nonfinite_loss_is_one_line_exit_2(tmp_path, finished, capsys, monkeypatch):
    import zfree_lab.run.training as training
    from zfree_lab.run.run_folder import NonFiniteLossError

    def nan_run(cfg, out, **kw):
        raise NonFiniteLossError(f"non-finite loss at step 3: terms ['recon'] (see {out}/error.json)")

    monkeypatch.setattr(training, "train_cvae", nan_run)
    assert main(["train", "--config", str(finished / "config.json"), "--out", str(tmp_path / "r")]) == 2
    assert "non-finite loss at step 3" in one_error_line(capsys)


def test_unexpected_errors_keep_their_traceback(tmp_path, finished, monkeypatch):
    import zfree_lab.run.training as training

    def bug(cfg, out, **kw):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(training, "train_cvae", bug)
    with pytest.raises(ZeroDivisionError):
        main(["train", "--config", str(finished / "config.json"), "--out", str(tmp_path / "r")])


# --- sweeps: exit codes, one owner, no process left behind -------------------------------------

def _spec_base(data, base, **kw) -> dict:
    return {k: v for k, v in tiny_base_flat(data, base, **kw).items() if k in SPEC_KEYS}


def test_failing_point_exits_1_with_full_message_and_path(tiny, tmp_path, capsys):
    data, base = tiny
    bad = tmp_path / "bad_base"
    (bad / "model").mkdir(parents=True)  # exists (the spec validates), but holds no model
    spec = write_spec(tmp_path, {"name": "one_fails", "base": _spec_base(data, base),
                                 "grid": {"base_dir": [str(base), str(bad)]}, "workers": 2, "controls": False})
    out = tmp_path / "sweep"
    assert main(["sweep", str(spec), "--out", str(out), "--no-report"]) == 1
    captured = capsys.readouterr()
    assert "; 1 of 2 failed (above); report: not rendered" in captured.out and "runs ok" not in captured.out
    (err_file,) = out.glob("runs/*/error.json")
    assert (err_file.parent / "train_cvae.ipynb").exists()  # failed inside its kernel: the executed notebook kept
    msg = json.loads(err_file.read_text())["error"]
    assert f"FAILED {err_file.parent.name}: {msg}" in captured.err and str(err_file) in captured.err
    (good,) = [p.parent for p in out.glob("runs/*/summary.json")]
    before = snapshot(good)

    holder = hold_lock(out)  # a second sweep while one owns the folder
    try:
        assert main(["sweep", str(spec), "--out", str(out), "--no-report"]) == 2
        line = one_error_line(capsys)
        assert f"sweep folder {out.resolve()} is in use by pid {holder.pid}" in line
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    assert snapshot(good) == before
    with run_folder_lock(out, "sweep folder"):  # the killed holder's lock is taken over at once
        pass


def test_a_sweep_whose_every_point_fails_exits_1_with_or_without_its_report(tiny, tmp_path, capsys):
    """Every point failed: no report to render (it said "no finished run to report" and exited 2, bad input, unless
    --no-report, which exited 1); it now exits 1 naming the failures, and the closing line says why no report."""
    data, base = tiny
    bad = tmp_path / "bad_base"
    (bad / "model").mkdir(parents=True)  # exists (the spec validates), but holds no model
    spec = write_spec(tmp_path, {"name": "all_fail", "base": _spec_base(data, bad), "grid": {"beta": [0.3]},
                                 "workers": 1, "controls": False})
    out = tmp_path / "sweep"
    assert main(["sweep", str(spec), "--out", str(out)]) == 1
    captured = capsys.readouterr()
    assert "sweep 'all_fail': 0 runs" in captured.out and "report: not rendered: no run finished" in captured.out
    assert "; 1 of 1 failed (above); report: not rendered" in captured.out and "FAILED " in captured.err and "no finished run" not in captured.err
    assert not (out / "report.html").exists()  # with --no-report it was 1 already (the test above, one point of two)


def test_a_sweep_with_a_failed_point_renders_its_report_under_its_own_lock_and_exits_1(tiny, tmp_path, capsys,
                                                                                          monkeypatch):
    """One point fails, one finishes, no --no-report: the sweep renders its report while it holds its folder's lock
    (the report's own lock on the folder refused the sweep itself: "sweep folder ... is in use by pid <its own>",
    exit 2, on CI's SLURM tier), then exits 1 for the failure. The notebooks' execution is replaced by an empty
    executed notebook: what is tested is the lock, not the report's content (the report tests render it)."""
    import nbformat

    from zfree_lab.experiment import render

    def executed(nb, out_path, **_):
        nbformat.write(nbformat.v4.new_notebook(), str(out_path))
        return out_path

    monkeypatch.setattr(render, "execute", executed)
    data, base = tiny
    bad = tmp_path / "bad_base"
    (bad / "model").mkdir(parents=True)  # exists (the spec validates), but holds no model: that point fails
    spec = write_spec(tmp_path, {"name": "one_fails", "base": _spec_base(data, base),
                                 "grid": {"base_dir": [str(base), str(bad)]}, "workers": 1, "controls": False})
    out = tmp_path / "sweep"
    assert main(["sweep", str(spec), "--out", str(out)]) == 1
    captured = capsys.readouterr()
    assert "in use by" not in captured.err and "; 1 of 2 failed (above); report: " in captured.out, captured.err[-2000:]
    assert f"sweep 'one_fails': 1 runs" in captured.out and f"report: {out / 'report.html'}" in captured.out
    assert (out / "report.html").is_file()


def test_second_sweep_on_a_folder_is_refused_naming_the_pid(tiny, tmp_path):
    from zfree.core.errors import LockHeldError
    from zfree_lab.experiment.executor import run_points
    from zfree_lab.experiment.sweeps import load_spec, run_sweep

    data, base = tiny
    spec = load_spec(write_spec(tmp_path, {"base": _spec_base(data, base), "grid": {"beta": [0.3]}}))
    out = tmp_path / "sweep"
    with run_folder_lock(out, "sweep folder"):
        with pytest.raises(LockHeldError, match=f"in use by pid {os.getpid()}"):
            run_sweep(spec, out, progress=False)
    with run_folder_lock(out / "runs", "runs folder"):  # a study or sweep writing the same runs/
        with pytest.raises(LockHeldError, match="runs folder"):
            run_points(spec.points(), out / "runs", progress=False)
    assert not list(out.glob("runs/*/"))


def _marked(mark: str) -> list[int]:
    """Live (non-zombie) processes whose environment carries ``ZFREE_FAULT_MARK=mark``."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if f"ZFREE_FAULT_MARK={mark}".encode() not in (d / "environ").read_bytes():
                continue
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            pids.append(int(d.name))
    return pids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; PR_SET_PDEATHSIG is Linux")
@pytest.mark.timeout(400)
def test_sigkill_of_a_sweep_leaves_no_process_behind(tiny, tmp_path):
    data, base = tiny
    spec = write_spec(tmp_path, {"name": "killed", "base": _spec_base(data, base, steps=5000, eval_every=2500),
                                 "grid": {"beta": [0.3]}, "workers": 1})  # one worker, one kernel: enough
    out, mark = tmp_path / "sweep", uuid.uuid4().hex
    env = {**os.environ, "ZFREE_FAULT_MARK": mark, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    sweep = subprocess.Popen([sys.executable, "-m", "zfree_lab.cli", "sweep", str(spec), "--out", str(out), "--no-report"],
                             env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        while not list(out.glob("runs/*/config.json")):  # a kernel is training
            assert sweep.poll() is None and time.time() < deadline, "the sweep never started training"
            time.sleep(0.5)
        assert len(_marked(mark)) >= 3  # the sweep, its workers, their kernels
        sweep.send_signal(signal.SIGKILL)
        sweep.wait(timeout=30)
        deadline = time.time() + 30  # kernels poll their parent once a second
        while _marked(mark) and time.time() < deadline:
            time.sleep(0.5)
        assert _marked(mark) == []
        with run_folder_lock(out, "sweep folder"), run_folder_lock(out / "runs", "runs folder"):
            pass  # nothing holds the folders: a rerun can start at once
        assert not list(out.glob("runs/*/summary.json"))
    finally:
        for pid in _marked(mark):  # only processes this test started (they carry its mark)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


# --- checkpoints and reuse (training, run_folder) ---------------------------------------------

def _interrupted(tiny, run: Path, **kw) -> TrainConfig:
    """A run stopped after 2 of 4 steps with a checkpoint at every step (so a previous one exists)."""
    from zfree_lab.run.training import train_cvae

    data, base = tiny
    cfg = TrainConfig.from_flat(tiny_base_flat(data, base, checkpoint_every=1, **kw))
    train_cvae(cfg, run, progress=False, stop_after=2)
    assert (run / "checkpoint").is_dir()
    return cfg


def test_crafted_state_pt_runs_nothing_on_resume(tiny, finished, tmp_path, capsys):
    before = snapshot(finished)
    run = tmp_path / "run"
    _interrupted(tiny, run)
    marker = tmp_path / "pwned"
    for d in run.glob("checkpoint*"):  # every checkpoint slot, whatever the layout names its state
        torch.save({"optimizer": _Evil(marker), "state": _Evil(marker)}, d / "state.pt")
    code = main(["train", "--resume", str(run)])
    assert not marker.exists()  # nothing from the run folder was executed
    if code == 2:  # refused: the message names the file
        assert "state.pt" in one_error_line(capsys)
    else:  # the plain-state layout never reads state.pt
        assert code == 0 and (run / "summary.json").exists()
    assert snapshot(finished) == before


def test_old_layout_state_pt_is_read_as_plain_tensors_only(tiny, tmp_path, capsys):
    """A run folder of an older version (checkpoint/state.pt + COMPLETE "ok") still resumes, through
    torch.load(weights_only=True), to the uninterrupted summary; a crafted one there is refused
    naming the file, with nothing executed."""
    from zfree_lab.run.checkpoint_io import load_plain_state
    from zfree_lab.run.run_folder import TIMING_KEYS
    from zfree_lab.run.training import train_cvae

    run, ref_run = tmp_path / "run", tmp_path / "ref"
    cfg = _interrupted(tiny, run)
    for d in run.glob("checkpoint*"):  # rewrite every slot in the old layout
        ck = load_plain_state(d)
        for f in ("state.json", "state.safetensors"):
            (d / f).unlink()
        torch.save(ck, d / "state.pt")
        (d / "COMPLETE").write_text("ok\n")
    old = tmp_path / "old"
    shutil.copytree(run, old)
    got = train_cvae(cfg, run, progress=False)
    want = train_cvae(cfg, ref_run, progress=False)
    assert {k: v for k, v in got.items() if k not in TIMING_KEYS} == {k: v for k, v in want.items() if k not in TIMING_KEYS}
    marker = tmp_path / "pwned"
    for d in old.glob("checkpoint*"):
        torch.save({"optimizer": _Evil(marker), "state": _Evil(marker)}, d / "state.pt")
    assert main(["train", "--resume", str(old)]) == 2
    line = one_error_line(capsys)
    assert not marker.exists() and "no usable checkpoint" in line and "state.pt" in line
    assert not (old / "summary.json").exists()


def test_a_locked_run_folder_is_refused_naming_the_pid(finished, tmp_path, capsys):
    before = snapshot(finished)
    holder = hold_lock(finished)  # another process owns the run folder
    try:
        assert main(["train", "--resume", str(finished)]) == 2
        assert f"run folder {finished} is in use by pid {holder.pid}" in one_error_line(capsys)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    assert main(["train", "--resume", str(finished)]) == 0  # the killed holder's lock is taken over
    assert snapshot(finished) == before


def test_finished_run_of_another_config_is_refused(finished, capsys):
    before = snapshot(finished)
    args = ["train", "--config", str(finished / "config.json"), "--out", str(finished)]
    assert main([*args, "--set", "beta=0.9"]) == 2
    assert "beta" in one_error_line(capsys)
    assert snapshot(finished) == before
    assert main(args) == 0  # the same config: reused
    assert snapshot(finished) == before


@pytest.mark.parametrize("damage", ["empty", "truncated"])
@pytest.mark.parametrize("name", ["model.safetensors", "state"])
def test_damaged_checkpoint_falls_back_to_the_previous_one(tiny, finished, tmp_path, damage, name):
    from zfree_lab.run.run_folder import TIMING_KEYS
    from zfree_lab.run.training import train_cvae

    before = snapshot(finished)
    ref_run, run = tmp_path / "ref", tmp_path / "run"
    cfg = _interrupted(tiny, run)
    train_cvae(cfg, ref_run, progress=False)  # uninterrupted
    (f,) = [p for p in (run / "checkpoint").iterdir() if p.name.startswith(name)][:1]
    f.write_bytes(b"" if damage == "empty" else f.read_bytes()[: f.stat().st_size // 2])
    with pytest.warns(UserWarning, match=f.name):
        got = train_cvae(cfg, run, progress=False)
    want = json.loads((ref_run / "summary.json").read_text())
    assert {k: v for k, v in got.items() if k not in TIMING_KEYS} == {k: v for k, v in want.items() if k not in TIMING_KEYS}
    assert snapshot(finished) == before


def test_nonfinite_evaluation_stops_before_replacing_the_checkpoint(tiny, finished, tmp_path, capsys):
    from safetensors.torch import load_file

    before = snapshot(finished)
    data, base = tiny
    run = tmp_path / "run"
    flat = tiny_base_flat(data, base, lr_new=1e30, eval_every=1, checkpoint_every=1)
    (tmp_path / "c.json").write_text(json.dumps(flat))
    assert main(["train", "--config", str(tmp_path / "c.json"), "--out", str(run)]) == 2
    assert "non-finite" in one_error_line(capsys)
    assert (run / "error.json").exists() and not (run / "summary.json").exists()
    for d in run.glob("checkpoint*"):  # whatever checkpoint is kept holds only finite weights
        assert all(torch.isfinite(t).all() for t in load_file(str(d / "model.safetensors")).values())
    def null_keys(folder):
        f = folder / "metrics.jsonl"
        rows = [json.loads(line) for line in f.read_text().splitlines()] if f.exists() else []
        return {k for r in rows for k, v in r.items() if v is None}

    assert null_keys(run) <= null_keys(finished)  # no NaN evaluation was stored (as null)
    assert snapshot(finished) == before


def test_study_with_a_failed_point_exits_1_naming_it(tmp_path, capsys, monkeypatch):
    import zfree_lab.experiment.study as study

    stale = tmp_path / "runs" / "old_point" / "error.json"  # from an earlier invocation: not reported
    stale.parent.mkdir(parents=True)
    stale.write_text(json.dumps({"error": "old"}))
    before = time.time() - 3600  # before this (in-process) invocation started
    os.utime(stale, (before, before))

    def one_fails(preset, out, **kw):
        err = Path(out) / "runs" / "plain_beta1_abcd" / "error.json"
        err.parent.mkdir(parents=True)
        err.write_text(json.dumps({"error": "FileNotFoundError: base_dir/model does not exist\nsecond line"}))
        # a run whose training finished (summary.json) but whose notebook failed at a later cell
        late = Path(out) / "runs" / "plain_beta3_ef01"
        late.mkdir(parents=True)
        (late / "summary.json").write_text("{}")
        (late / "error.json").write_text(json.dumps({"error": "ImportError: a figure cell"}))
        return Path(out) / "report.html"

    monkeypatch.setattr(study, "run_study", one_fails)
    assert main(["study", "--preset", "smoke", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "FAILED plain_beta1_abcd: FileNotFoundError: base_dir/model does not exist\nsecond line" in err
    assert str(tmp_path.resolve() / "runs" / "plain_beta1_abcd" / "error.json") in err and "old_point" not in err
    assert "FAILED plain_beta3_ef01: ImportError: a figure cell" in err and "2 run(s) failed" in err


def test_study_reports_the_runs_failed_since_its_process_started_not_one_failed_just_before(tmp_path, capsys,
                                                                                            monkeypatch):
    """`zfree study` found this invocation's failed runs by a second clock beside its process's start (the
    ``started`` its budget counts from): the time after its imports less 1 s. An error.json left just before
    the process started (the previous invocation's, the command rerun at once) was reported as failed now.
    The scan reads the process's start alone; a run that fails after it is reported. Run as the `zfree`
    script runs it (``main()`` reading ``sys.argv``)."""
    import psutil

    import zfree_lab.experiment.study as study

    now = time.time()
    monkeypatch.setattr(psutil.Process, "create_time", lambda self, *a, **kw: now)  # this process starts now
    earlier = tmp_path / "runs" / "plain_beta1_0001" / "error.json"  # failed 0.1 s before it started
    earlier.parent.mkdir(parents=True)
    earlier.write_text(json.dumps({"error": "RuntimeError: the previous invocation's"}))
    os.utime(earlier, (now - 0.1, now - 0.1))
    seen = {}

    def one_fails(preset, out, **kw):
        seen["started"] = kw["started"]
        err = Path(out) / "runs" / "plain_beta3_0002" / "error.json"
        err.parent.mkdir(parents=True)
        err.write_text(json.dumps({"error": "RuntimeError: this invocation's"}))
        os.utime(err, (now + 1, now + 1))  # written during the invocation (explicit: no coarse file clock)
        return Path(out) / "report.html"

    monkeypatch.setattr(study, "run_study", one_fails)
    monkeypatch.setattr(sys, "argv", ["zfree", "study", "--preset", "smoke", "--out", str(tmp_path)])
    assert main() == 1
    err = capsys.readouterr().err
    assert seen["started"] == now  # the pipeline's budget and the scan read one clock: the process's start
    assert "FAILED plain_beta3_0002: RuntimeError: this invocation's" in err and "1 run(s) failed" in err
    assert "plain_beta1_0001" not in err and "previous invocation" not in err


def test_a_study_called_inside_a_long_lived_process_counts_from_the_call_not_the_process(tmp_path, capsys,
                                                                                        monkeypatch):
    """``main([...])`` inside a kernel or a test worker that started an hour ago: its budget and its scan
    for failed runs start at the call (``invocation_start``), so an hour-old error.json of an earlier call
    is not reported again and the budget is not spent before the study begins."""
    import psutil

    import zfree_lab.experiment.study as study

    monkeypatch.setattr(psutil.Process, "create_time", lambda self, *a, **kw: time.time() - 3600)
    old = tmp_path / "runs" / "plain_beta1_0001" / "error.json"  # an earlier call's, 30 min ago
    old.parent.mkdir(parents=True)
    old.write_text(json.dumps({"error": "RuntimeError: an earlier call's"}))
    os.utime(old, (time.time() - 1800, time.time() - 1800))
    seen = {}
    before = time.time()
    monkeypatch.setattr(study, "run_study", lambda preset, out, **kw: seen.update(kw) or Path(out) / "report.html")
    assert main(["study", "--preset", "smoke", "--out", str(tmp_path)]) == 0
    assert before <= seen["started"] <= time.time()
    assert "earlier call" not in capsys.readouterr().err

def test_a_gpt2_tokenizer_built_from_vocab_files_is_refused(tmp_path):
    # transformers 5's GPT2TokenizerFast(vocab_file=..., merges_file=...) builds a tokenizer of 1 token
    from transformers import GPT2TokenizerFast

    from zfree.core.errors import ModelLoadError
    from zfree.models.base import build_synthetic_gpt2
    from zfree.models.loading import load_causal_lm

    vocab = {"<|endoftext|>": 0, **{c: i + 1 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz ")}}
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b\n")
    tok = GPT2TokenizerFast(vocab_file=str(tmp_path / "vocab.json"), merges_file=str(tmp_path / "merges.txt"))
    build_synthetic_gpt2(len(vocab) + 1, n_layer=1, n_embd=16, n_head=2).save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    n_tok = len(tok)
    if n_tok >= len(vocab):  # another transformers version builds it whole: nothing to refuse
        pytest.skip(f"GPT2TokenizerFast built {n_tok} tokens here")
    with pytest.raises(ModelLoadError, match=f"tokenizer has {n_tok} tokens but the embedding table {len(vocab) + 1} rows"):
        load_causal_lm(tmp_path / "m", device="cpu")


# --- issue 61: bad inputs nobody tried ---------------------------------------------------------

@pytest.mark.parametrize("argv", [["train", "--data", "{dir}"], ["train", "--data", "{file}", "--val", "{dir}"],
                                  ["study", "--data", "{dir}"], ["study", "--data", "{file}", "--val", "{dir}"],
                                  ["score", "--data", "{dir}"]])
def test_data_given_as_a_folder_is_one_line_naming_it(tiny, tmp_path, capsys, argv):
    """``--data``/``--val`` a folder: an IsADirectoryError traceback in train, study and score before;
    now one line naming the option and the folder, exit 2, before any output folder is made."""
    from zfree.core.errors import InputError
    from zfree.data.pairs import load_pairs

    data, base = tiny
    folder = tmp_path / "pairs"
    folder.mkdir()
    out = tmp_path / "out"
    argv = [a.format(dir=folder, file=data / "train.jsonl") for a in argv]
    assert main([*argv, "--model", str(base / "model"), "--out", str(out)]) == 2
    flag = argv[argv.index(str(folder)) - 1]
    assert one_error_line(capsys) == f"zfree: error: {flag} {folder}: a folder, not a file: give one JSONL file of pairs"
    assert not out.exists()
    with pytest.raises(InputError, match=rf"^{re.escape(str(folder))}: a folder, not a JSONL file of pairs$"):
        load_pairs(folder)  # the reader every command uses, for the Python API


@pytest.mark.parametrize("argv, flag", [(["score", "--data", "{gone}", "--model", "{model}"], "--data"),
                                        (["study", "--data", "{gone}", "--model", "{model}"], "--data"),
                                        (["study", "--data", "{file}", "--val", "{gone}", "--model", "{model}"], "--val"),
                                        (["train", "--data", "{gone}", "--model", "{model}"], "--data"),
                                        (["study", "--data", "{file}", "--model", "{model}ll"], "--model"),
                                        (["score", "--data", "{file}", "--model", "./owner/name"], "--model"),
                                        (["study", "--data", "{file}", "--model", "smollm2-135m-instruct"], "--model")])
def test_a_missing_data_file_or_model_path_is_one_line_before_torch(tiny, tmp_path, argv, flag):
    """A typo in ``--data``, ``--val`` or a ``--model`` path: one line naming the option and the path, exit 2,
    no output folder, in an interpreter that never imported torch (it was refused after torch and
    transformers were loaded: 1-2 minutes on a busy machine). An ``owner/name`` hub id is not refused here."""
    data, base = tiny
    gone, out = tmp_path / "nope.jsonl", tmp_path / "out"
    argv = [a.format(gone=gone, file=data / "train.jsonl", model=base / "model") for a in argv] + ["--out", str(out)]
    code = ("import sys; from zfree_lab.cli import main; rc = main(sys.argv[1:]); "
            "print('TORCH', 'torch' in sys.modules); sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    err = r.stderr.strip().splitlines()
    value = argv[argv.index(flag) + 1]
    assert r.returncode == 2 and len(err) == 1 and err[0].startswith(f"zfree: error: {flag} {value}: no such file"), r.stderr
    assert "TORCH False" in r.stdout and not out.exists()
    if value == "smollm2-135m-instruct":  # a name zfree fetches, given as a path: the line says how to get it
        assert "`zfree model fetch smollm2-135m-instruct` puts it in" in err[0], err


@pytest.mark.parametrize("make, expected", [
    (lambda d: d.mkdir(), "has neither config.json nor a .gguf file (a model is a transformers folder"),
    (lambda d: (d.mkdir(), (d / "a.gguf").touch(), (d / "b.gguf").touch()), "holds several .gguf files (a.gguf, b.gguf)"),
    (lambda d: d.write_text("{}"), "a file must be a .gguf file")])
def test_a_model_path_that_holds_no_model_is_one_line_before_torch(tiny, tmp_path, make, expected):
    """A ``--model`` that exists but is no model (the folder above the model's, its tokenizer folder, a folder
    of several GGUF files, a config file): one line naming the option, the path and why, exit 2, no output
    folder, before torch (it was refused by the model's loading, after the imports)."""
    data, _ = tiny
    model, out = tmp_path / "not a model", tmp_path / "out"
    make(model)
    code = ("import sys; from zfree_lab.cli import main; rc = main(sys.argv[1:]); "
            "print('TORCH', 'torch' in sys.modules); sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code, "study", "--model", str(model), "--data", str(data / "train.jsonl"),
                        "--out", str(out)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1 and err[0].startswith(f"zfree: error: --model {model}: {expected}"), r.stderr
    assert "TORCH False" in r.stdout and not out.exists()


def test_an_owner_name_model_is_a_hub_id_not_a_missing_path():
    from zfree.core.paths import looks_like_hub_id

    assert looks_like_hub_id("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert not any(looks_like_hub_id(s) for s in ("./a/b", "/a/b", "~/a", "a/b/c", "a/", "/a", "model"))


def _no_eos_model(folder: Path) -> Path:
    """A tiny GPT-2 (``tests.tiny.tiny_gpt2``'s) saved with the digit tokenizer less its eos token."""
    from transformers import PreTrainedTokenizerFast

    from tests.tiny import tiny_gpt2

    model, tok = tiny_gpt2()
    kept = {k: v for k, v in tok.special_tokens_map.items() if k != "eos_token"}
    no_eos = PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer, model_max_length=1024, **kept)
    assert no_eos.eos_token_id is None and no_eos.pad_token_id == tok.pad_token_id
    model.save_pretrained(folder)
    no_eos.save_pretrained(folder)
    return folder


def test_a_tokenizer_without_eos_is_refused_in_one_line_before_training(tiny, tmp_path, capsys):
    """issue 61: ``zfree train`` on a model whose tokenizer has no eos token died with a TypeError
    traceback (``full_like(): ... fill_value NoneType``) at the step-0 sample decoding, every study run the
    same way; now one line naming the model, exit 2, before the reference is scored or a step is trained."""
    data, base = tiny
    model = _no_eos_model(tmp_path / "model")
    out = tmp_path / "run"
    assert main(["train", "--model", str(model), "--data", str(data / "train.jsonl"), "--out", str(out),
                 "--set", "steps=2", "--set", "eval_every=2", "--set", "device=cpu"]) == 2
    line = one_error_line(capsys)
    assert line == (f"zfree: error: {model}: its tokenizer has no eos token; zfree ends every y with it (where "
                    "the CVAE learns y stops, and decoding stops): set eos_token in its tokenizer_config.json "
                    "to a token of its vocabulary"), line
    assert not (out / "base").exists() and not (out / "config.json").exists()
    from zfree_lab.run.training import train_cvae  # the Python API on a base folder holding that model

    (tmp_path / "b").mkdir()
    shutil.copytree(base, tmp_path / "b" / "base")
    shutil.rmtree(tmp_path / "b" / "base" / "model")
    shutil.copytree(model, tmp_path / "b" / "base" / "model")
    with pytest.raises(Exception, match="its tokenizer has no eos token") as e:
        train_cvae(TrainConfig.from_flat(tiny_base_flat(data, tmp_path / "b" / "base")), tmp_path / "run2",
                   progress=False)
    assert type(e.value).__name__ == "ModelLoadError"
    assert [f.name for f in (tmp_path / "run2").iterdir()] == [".zfree.lock"]  # no config.json, checkpoint, metrics
