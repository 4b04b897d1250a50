"""Issue 14 phase 2: your own model and data in one command (``zfree study --model --data``).

A tiny GPT-2 with a byte-level BPE tokenizer is built from a config and saved with save_pretrained
(the real loading path); the JSONL rows carry ``labels.style`` only (no ``strategy``), so both the
per-label metrics and the note of an absent label are exercised.
"""

from __future__ import annotations

import json
from pathlib import Path
import re
import shutil

import pandas as pd
import pytest
from safetensors.torch import load_file
from transformers import GPT2Config, GPT2LMHeadModel

from zfree_lab.run.bpe import train_bpe_tokenizer
from zfree.data.pairs import load_pairs
from zfree_lab.cli import main

STYLES = {"short": "{a} then {b}.", "long": "First comes {a}, and after it we have {b}."}


def _rows(n_x: int = 24, per_x: int = 4):
    words = ["red", "blue", "green", "cat", "dog", "sun", "moon", "tree"]
    rows = []
    for i in range(n_x):
        a, b = words[i % 8], words[(i * 3 + 1) % 8]
        x = f"item[{i}] a[{a}] b[{b}]"
        for j in range(per_x):
            style = "short" if j % 2 == 0 else "long"
            rows.append({"id": f"r{i}-{j}", "x": x, "y": STYLES[style].format(a=a, b=b) + " " * (j // 2),
                         "labels": {"style": style}})
    return rows


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    root = tmp_path_factory.mktemp("own")
    rows = _rows()
    tok = train_bpe_tokenizer([r["x"] for r in rows] + [r["y"] for r in rows], vocab_size=300)
    cfg = GPT2Config(vocab_size=len(tok), n_positions=96, n_layer=1, n_embd=32, n_head=2, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1, eos_token_id=3, pad_token_id=0)
    model = GPT2LMHeadModel(cfg)
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    return root / "model", _write(root / "pairs.jsonl", rows)


@pytest.mark.e2e  # a whole study, a few minutes: CI's test-e2e tier after the default one
def test_one_command_from_model_and_jsonl_to_report(tiny_model, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ZFREE_CACHE_DIR", str(tmp_path / "cache"))
    model, data = tiny_model
    out = tmp_path / "study"
    assert main(["study", "--model", str(model), "--data", str(data), "--out", str(out),
                 "--preset", "own_smoke"]) == 0
    printed = capsys.readouterr().out
    # the split: written, every row kept, no x on both sides
    train, val = load_pairs(out / "train.jsonl"), load_pairs(out / "val.jsonl")
    assert len(train) + len(val) == len(load_pairs(data))
    assert not {p.x for p in train} & {p.x for p in val}
    # the base folder links the model (not a copy) and holds the pretrained-source reference
    assert (out / "base" / "model").is_symlink() and (out / "base" / "model").resolve() == model.resolve()
    ref = json.loads((out / "base" / "reference" / "reference.json").read_text())
    assert ref["estimator"] == "pretrained_source" and ref["n_rows"] == len(val)
    every = sorted(p for p in (out / "runs").iterdir() if p.is_dir())
    given = [r for r in every if r.name.startswith(("control_", "oracle-", "null-"))]
    runs = [r for r in every if r not in given]
    assert len(runs) == 2 and all((r / "summary.json").exists() for r in every)
    # the z-free control of the recipe, the oracle of the rows' one label and its null oracle (issue 55)
    assert sorted(r.name.split("_")[0] for r in given) == ["control", "control", "null-style", "oracle-style"]
    # issue 59 item 5: the finished runs keep their own tensors and, where it was trained, the body (its only
    # copy), never the optimizer's moments; the study says its disk use
    from zfree_lab.run.checkpoint_io import load_plain_state

    for r in every:
        state = load_plain_state(r / "checkpoint")
        assert "finished" in state and "optimizer" not in state, r.name
        body = [k for k in load_file(str(r / "checkpoint" / "model.safetensors")) if k.startswith("backbone.")]
        assert bool(body) == (state["finished"]["body"] != "the base's"), r.name
    assert re.search(r"^disk: [0-9.]+ MiB in .* \([0-9.]+ MiB of it in checkpoints", printed, re.M)
    # the estimate says the runs' time and the whole command's: the report after the runs, the preparation and
    # probes before them
    est = re.search(r"^estimate: \d+ runs on \d+ worker\(s\): about ([0-9.]+) min, peak memory .*; with the report "
                    r"\(about 1 min\) the study ends in about ([0-9.]+) min, ([0-9.]+) min in all with the ([0-9.]+) min "
                    r"of preparation and probes so far\. ", printed, re.M)
    assert est, printed
    runs_min, ends, in_all, so_far = map(float, est.groups())
    assert abs(ends - runs_min - 1.0) <= 0.11 and abs(in_all - ends - so_far) <= 0.11 and so_far > 0
    gains = pd.read_csv(out / "available_gain.csv")
    assert list(gains["label"]) == ["style"] and gains["H"].gt(0).all()
    html = (out / "report.html").read_text()
    assert "<img" in html or "image/png" in html  # its figures
    summary = pd.read_csv(out / "summary.csv")
    assert len(summary) == 2
    for r in runs:
        s = json.loads((r / "summary.json").read_text())
        # the label present: its metrics; the absent strategy: NaN, never faked
        for metric in ("alignment_nmi", "hungarian_accuracy", "probe_accuracy"):
            assert f"structure/{metric}/style" in s
        assert 0.0 <= s["structure/hungarian_accuracy/style"] <= 1.0
        v = s["structure/alignment_nmi"]
        assert v is None or v != v  # NaN (written as null), never faked
        pe = pd.read_parquet(r / "per_example.parquet")
        assert set(pe["label/style"]) == {"short", "long"}
        samples = pd.read_parquet(r / "samples.parquet")
        cfg = json.loads((r / "config.json").read_text())
        assert set(samples["latent"]) == set(range(cfg["n_latent"]))
        assert {"x", "greedy", "sampled", "reference"} <= set(samples.columns)
    notes = json.loads((out / "notes.json").read_text())["notes"]
    assert any("label 'strategy': absent" in n for n in notes)
    assert any("task correctness: skipped" in n for n in notes)
    assert "label 'strategy': absent" in printed
    assert "label &#39;strategy&#39;: absent" in html or "label 'strategy': absent" in html
    assert "greedy" in html  # the per-value samples table

    # issue 35: the folder holds its plan; the same command reuses it (no probe, the same runs), an
    # interrupted run (its summary gone) is the only one trained again, another request is refused
    from zfree_lab.experiment.own_study import run_own_study

    plan = json.loads((out / "plan.json").read_text())
    assert sorted(plan["run_ids"]) == sorted(p.name for p in every) and plan["estimate"]["runs"] == len(every)
    probes = sorted((p, p.stat().st_mtime_ns) for p in (out / "estimate").rglob("*") if p.is_file())
    controls = (out / "controls.json").read_bytes()
    stamps = {r.name: (r / "summary.json").stat().st_mtime_ns for r in every}
    (runs[0] / "summary.json").unlink()  # as if that run had been interrupted
    run_own_study(str(model), data, out, preset="own_smoke", render=False, progress=True, estimate=True)
    again = capsys.readouterr().out
    assert "plan.json" in again and "reused" in again and "estimate:" not in again
    assert sorted((p, p.stat().st_mtime_ns) for p in (out / "estimate").rglob("*") if p.is_file()) == probes
    assert (out / "controls.json").read_bytes() == controls
    now = {r.name: (r / "summary.json").stat().st_mtime_ns for r in every}
    assert [k for k in now if now[k] != stamps[k]] == [runs[0].name]  # only the interrupted run trained again
    assert main(["study", "--model", str(model), "--data", str(data), "--out", str(out), "--preset", "own_smoke",
                 "--budget", "30m"]) == 2
    line = _err(capsys)
    assert "plan.json: this study was planned for another request: budget_s: null in plan.json, 1800.0 now" in line
    assert {r.name: (r / "summary.json").stat().st_mtime_ns for r in every} == now  # nothing touched


def _err(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("zfree: error: "), err
    return err[-1]


def test_bad_inputs_one_line_errors(tiny_model, tmp_path, capsys):
    model, data = tiny_model
    rows = _rows()
    small = _write(tmp_path / "small.jsonl", rows[:1])  # one row: no split (4 rows of one x are unconditional text)
    assert main(["study", "--model", str(model), "--data", str(small), "--out", str(tmp_path / "a")]) == 2
    assert "small.jsonl" in _err(capsys)
    nested = _write(tmp_path / "nested.jsonl", [rows[0], {**rows[1], "labels": {"style": {"a": 1}}}])
    assert main(["study", "--model", str(model), "--data", str(nested), "--out", str(tmp_path / "b")]) == 2
    e = _err(capsys)
    assert "nested.jsonl:2" in e and "labels.style" in e
    mixed = _write(tmp_path / "mixed.jsonl", [rows[0], {**rows[1], "labels": {"style": 3}}])
    assert main(["study", "--model", str(model), "--data", str(mixed), "--out", str(tmp_path / "c")]) == 2
    e = _err(capsys)
    assert "mixed.jsonl:2" in e and "labels.style" in e and "one type" in e
    notok = tmp_path / "notok"
    shutil.copytree(model, notok)
    for f in notok.iterdir():
        if "token" in f.name or f.name in ("vocab.json", "merges.txt"):
            f.unlink()
    assert main(["study", "--model", str(notok), "--data", str(data), "--out", str(tmp_path / "d")]) == 2
    assert "no tokenizer" in _err(capsys)
    missing = tmp_path / "nope.gguf"
    assert main(["study", "--model", str(missing), "--data", str(data), "--out", str(tmp_path / "e")]) == 2
    assert "nope.gguf" in _err(capsys)
    notjson = tmp_path / "notjson.jsonl"
    notjson.write_text(json.dumps(rows[0]) + '\n{"x": "a\tb", "y": "c"}\n')
    assert main(["study", "--model", str(model), "--data", str(notjson), "--out", str(tmp_path / "f")]) == 2
    assert "notjson.jsonl:2: not valid JSON" in _err(capsys)
    # a refused study leaves no folder behind (its lock file, timings.json and split went with it)
    assert not [p.name for p in tmp_path.iterdir() if p.name in "abcdef"]
    kept = tmp_path / "kept"  # a folder that was there before is the user's: the refusal leaves it
    kept.mkdir()
    assert main(["study", "--model", str(model), "--data", str(notjson), "--out", str(kept)]) == 2
    assert kept.is_dir()


def test_val_sharing_x_is_warned_with_count_and_nothing_lost(tiny_model, tmp_path, capsys):
    from zfree_lab.experiment.sources import prepare_split

    _, data = tiny_model
    rows = _rows()
    val = _write(tmp_path / "val.jsonl", [{**r, "id": "v" + r["id"]} for r in rows[:8]])  # 2 x shared
    with pytest.warns(UserWarning, match=r"val.jsonl: 2 distinct x \(8 val rows\)"):
        _, _, shared = prepare_split(data, tmp_path / "s", val=val)
    assert shared == 2
    before = (tmp_path / "s" / "train.jsonl").read_bytes()
    # another split into the same folder is refused; the split already there is kept
    other = _write(tmp_path / "other.jsonl", rows[:40])
    with pytest.raises(ValueError, match="holds another split"):
        prepare_split(other, tmp_path / "s")
    assert (tmp_path / "s" / "train.jsonl").read_bytes() == before


@pytest.mark.slow  # moved to the slow tier (issue 23's tests kept the default tier under 10 min)
def test_finetune_base_makes_the_entangled_run_setting(tiny_model, tmp_path, monkeypatch):
    import dataclasses

    from zfree_lab.experiment.own_study import OWN_PRESETS, run_own_study

    monkeypatch.setenv("ZFREE_CACHE_DIR", str(tmp_path / "cache"))
    model, data = tiny_model
    smoke = OWN_PRESETS["own_smoke"]
    one = dataclasses.replace(smoke, boundary=dataclasses.replace(smoke.boundary, aids=("none",)))
    out = run_own_study(model, data, tmp_path / "ft", preset=one, render=False, progress=False, finetune=True,
                        finetune_steps=3)
    ft = out / "base_ft"
    log = json.loads((ft / "train_log.json").read_text())
    assert log["init_from"] == str(model.resolve()) and log["steps"] <= 3
    ref = json.loads((ft / "reference" / "reference.json").read_text())
    assert ref["estimator"] == "entangled_run"
    # the one CVAE run (not a z-free control, a label oracle or its null oracle, which a study trains too)
    (run,) = [p for p in (out / "runs").iterdir()
              if p.is_dir() and not p.name.startswith(("control_", "oracle-", "null-"))]
    from zfree_lab.run.run_folder import read_run_config

    cfg = read_run_config(run / "config.json")  # paths stored relative to the run folder, resolved here
    assert cfg["c_base_source"] == "entangled_run" and Path(cfg["base_dir"]).resolve() == ft.resolve()
    assert json.loads((run / "summary.json").read_text())["reference/c_base"] == pytest.approx(ref["c_base"])


def test_e2e_preset_brackets_each_predicted_boundary_with_and_without_the_aid():
    from zfree.core.paths import SHIPPED_E2E
    from zfree_lab.experiment.spec import predicted_boundary
    from zfree_lab.experiment.study import PRESETS
    from zfree.reference.reference import load_reference

    p = PRESETS["e2e"]
    assert p.data.path == SHIPPED_E2E and p.base.path == SHIPPED_E2E / "base"
    ref = load_reference(p.base.path)
    variants = p.grid["variant"]
    assert len(variants) == 6 and p.controls and "first_slot" in p.oracles
    for w in ("plain", "distribution", "example", "token"):
        mine = [v for v in variants if v["weighting"] == w]
        aided = ["hard_em_then_soft", "none"] if w in ("distribution", "example") else ["none"]
        assert sorted(v.get("aid", "none") for v in mine) == aided
        for v in mine:  # a third of the predicted boundary, as written in the preset (2-3 significant digits)
            assert v["beta"] == pytest.approx(predicted_boundary(w, ref) / 3, rel=1e-2)


def test_zfree_train_runs_one_cvae_from_model_and_jsonl(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("ZFREE_CACHE_DIR", str(tmp_path / "cache"))
    model, data = tiny_model
    run = tmp_path / "run"
    sets = ["steps=2", "eval_every=2", "eval_rows=0", "decode_rows=2", "batch_size=4", "weighting=token",
            "token_outer=distribution", "token_alpha=0.5", "beta=0.01", "warmup_backbone=1"]  # typed by field
    assert main(["train", "--model", str(model), "--data", str(data), "--out", str(run),
                 *[a for s in sets for a in ("--set", s)]]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # all val rows evaluated: z = 0 at step 0 leaves the model unchanged, R = c_base
    assert rows[0]["loss/val/baseline_normalized_reconstruction_loss"] == pytest.approx(1.0, abs=1e-5)
    assert (run / "samples.parquet").exists() and (run / "base" / "model").is_symlink()
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["c_base_source"] == "pretrained_source"
    assert cfg["_reference"]["source_dir"] == "base"  # the reference's folder, portable as data_dir and base_dir are


def test_the_tutorials_example_weighting_command_runs_with_the_studies_epsilon(tiny_model, tmp_path, monkeypatch):
    """Issue 60: docs/tutorials/own-model.md's ``zfree train --model MODEL --data pairs.jsonl --out RUN --set
    beta=0.01 --set weighting=example`` stopped at ``epsilon=0.0 must be > 0``; a weighting chosen with --set
    now runs as every study grid runs it (epsilon 0.05, WEIGHTINGS["example"].grid), recorded in config.json."""
    monkeypatch.setenv("ZFREE_CACHE_DIR", str(tmp_path / "cache"))
    model, data = tiny_model
    run = tmp_path / "one-run"
    short = ["steps=1", "eval_every=1", "eval_rows=0", "decode_rows=1", "batch_size=4", "warmup_backbone=1"]
    assert main(["train", "--model", str(model), "--data", str(data), "--out", str(run),
                 *[a for s in short for a in ("--set", s)], "--set", "beta=0.01", "--set", "weighting=example"]) == 0
    cfg = json.loads((run / "config.json").read_text())
    assert (cfg["weighting"], cfg["epsilon"], cfg["beta"]) == ("example", 0.05, 0.01)


@pytest.mark.slow
def test_own_model_notebook_runs_under_papermill(tiny_model, tmp_path, monkeypatch):
    import papermill as pm

    from zfree.core.paths import NOTEBOOKS

    monkeypatch.setenv("ZFREE_CACHE_DIR", str(tmp_path / "cache"))
    model, data = tiny_model
    out = tmp_path / "nb"
    pm.execute_notebook(str(NOTEBOOKS / "own_model.ipynb"), str(tmp_path / "own_model.out.ipynb"), kernel_name="python3",
                        parameters={"model": str(model), "data": str(data), "out": str(out), "preset": "own_smoke"},
                        cwd=str(NOTEBOOKS), progress_bar=False)
    done = sorted(r.parent.name for r in (out / "runs").glob("*/summary.json"))
    # the preset's 2 runs, their z-free controls, the oracle of the rows' one label and its null (as the CLI's study)
    given = [n for n in done if n.startswith(("control_", "oracle-", "null-"))]
    assert len(done) - len(given) == 2 and sorted(n.split("_")[0] for n in given) == ["control", "control", "null-style",
                                                                                     "oracle-style"]
    assert (out / "notes.json").exists()


def test_the_preparations_reference_fills_the_cache_the_runs_read(tmp_path, monkeypatch):
    """write_reference scores the val rows once and caches them, so a run's pretrained-source
    reference (the model loaded as training loads it) is a cache hit with the same c_base — a
    SmolLM2-135M probe had spent 3.5 min re-scoring the 502 rows the preparation had just scored —
    and the preparation's scoring seconds are recorded for the estimate."""
    from tests.tiny import tiny_gpt2
    from zfree_lab.experiment.sources import write_reference
    from zfree.models.base import load_base
    from zfree.reference.reference import resolve_reference

    monkeypatch.setenv("ZFREE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ZFREE_NO_CACHE", raising=False)
    base = tmp_path / "base"
    tiny_gpt2(folder=base / "model")
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"id": f"r{i}", "x": " ".join(str((i + j) % 10) for j in range(3)), "y": str(i % 10)} for i in range(12)]
    _write(data / "val.jsonl", rows)
    ref = write_reference(base, data)
    assert ref.meta["scoring_s"] > 0 and ref.meta["estimator"] == "pretrained_source"
    model, tok = load_base(base / "model")
    run_ref = resolve_reference("pretrained_source", base, data, "val", model=model, tokenizer=tok)
    assert run_ref.meta["cache_hit"] is True
    assert run_ref.c_base == pytest.approx(ref.c_base, rel=1e-12)


# --- unconditional text (issue 35, item 8): x constant or absent -> p(y | z) against the LM's p(y) -----------------

def _gpt2_style_model(root: Path, texts: list[str]) -> Path:
    """A tiny GPT-2 whose byte-level BPE declares only an end token (<|endoftext|>): it adds no bos and
    has no sep, so an empty x is given y's context by the eos standing as the beginning token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                      show_progress=False))
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>", model_max_length=96)
    cfg = GPT2Config(vocab_size=len(tok), n_positions=96, n_layer=1, n_embd=32, n_head=2, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    GPT2LMHeadModel(cfg).save_pretrained(root / "gpt2style")
    tok.save_pretrained(root / "gpt2style")
    return root / "gpt2style"


def _unconditional_rows(kind: str) -> list[dict]:
    """``_rows()`` with one constant prompt as x, or no x field at all (y repeats: 8 distinct (a, b))."""
    if kind == "constant":
        return [{**r, "x": "Write one sentence:"} for r in _rows()]
    return [{k: v for k, v in r.items() if k != "x"} for r in _rows()]


def _check_unconditional_split(out: Path, data: Path, context: dict) -> dict:
    """The split of an unconditional study in ``out``: every row kept, x dropped, no y on both sides;
    its reference scored y after the ``context`` ids; notes.json says unconditional. Returns notes.json."""
    train, val = load_pairs(out / "train.jsonl"), load_pairs(out / "val.jsonl")
    assert len(train) + len(val) == len(load_pairs(data)) and {p.x for p in train + val} == {""}
    assert not {p.y for p in train} & {p.y for p in val}
    ref = json.loads((out / "base" / "reference" / "reference.json").read_text())
    assert {k: ref["scoring"].get(k) for k in context} == context
    rec = json.loads((out / "notes.json").read_text())
    assert rec["conditioning"] == "unconditional"
    assert rec["notes"][0].startswith("unconditional: x is ") and "split by row" in rec["notes"][0]
    # then the note a model at chance gets (this tiny untrained model: c_base near ln V)
    assert ("base_near_uniform" in rec) == rec["notes"][1].startswith("the z-free model scores c_base")
    return rec


@pytest.mark.slow  # two own_smoke grids (6 tiny runs each), no report
def test_more_seeds_into_a_finished_study_train_only_the_new_seeds_runs(tiny_model, tmp_path, monkeypatch, capsys):
    """``--seeds 0-1`` into a study made with the preset's own seed grows its plan (not another study): the
    planned runs are kept as they are, the new seed's runs have the plan's cuts (the same steps and rows), so
    the seeds are paired; the same longer command again then reuses the grown plan."""
    from zfree_lab.experiment.own_study import run_own_study

    monkeypatch.setenv("ZFREE_CACHE_DIR", str(tmp_path / "cache"))
    model, data = tiny_model
    out = tmp_path / "study"
    run_own_study(str(model), data, out, preset="own_smoke", render=False, progress=False)
    plan = json.loads((out / "plan.json").read_text())
    stamps = {i: (out / "runs" / i / "summary.json").stat().st_mtime_ns for i in plan["run_ids"]}
    capsys.readouterr()
    run_own_study(str(model), data, out, preset="own_smoke", render=False, progress=True, seeds=(0, 1))
    grown = capsys.readouterr().out
    assert "extended from the spec's own seed to seeds [0, 1] with its cuts, no probe: 6 new runs, 12 in all" in grown
    assert "reused" not in grown
    plan2 = json.loads((out / "plan.json").read_text())
    assert set(plan["run_ids"]) < set(plan2["run_ids"]) and len(plan2["run_ids"]) == 2 * len(plan["run_ids"])
    assert plan2["fitted"] == plan["fitted"] and plan2["grown_from"][0]["run_ids"] == plan["run_ids"]
    assert {i: (out / "runs" / i / "summary.json").stat().st_mtime_ns for i in plan["run_ids"]} == stamps
    configs = {i: json.loads((out / "runs" / i / "config.json").read_text()) for i in plan2["run_ids"]}
    assert all((out / "runs" / i / "summary.json").exists() for i in configs)
    assert {c["seed"] for i, c in configs.items() if i not in plan["run_ids"]} == {1}
    assert len({(c["steps"], c["eval_rows"], c["batch_size"]) for c in configs.values()}) == 1
    from zfree_lab.report.plan_report import plan_section

    assert "**Grown with more seeds**: 6 runs (its own seed) → 12 runs (seeds 0, 1)" in plan_section(out, pd.DataFrame())[0]
    run_own_study(str(model), data, out, preset="own_smoke", render=False, progress=True, seeds=(0, 1))
    assert "reused: no probe, the same 12 runs" in capsys.readouterr().out


@pytest.mark.slow  # two own_smoke studies to their reports, ~100 s each on one thread
@pytest.mark.parametrize("kind", ["constant", "absent"])
def test_unconditional_text_runs_a_study_to_its_report(kind, tiny_model, tmp_path, monkeypatch, capsys):
    """Done-criterion 8 of issue 35: a constant-x labelled set (the bos/sep tokenizer) and one without
    an x field (a GPT-2-style tokenizer: the eos before y) through ``zfree study --preset own_smoke``
    to report.html: the runs, their z-free controls and the label's oracle, "unconditional" in
    notes.json and the report, and every run's step 0 reading rho_recon = 1 against the reference
    (the runs encode y after the same context token the reference scored it after)."""
    monkeypatch.setenv("ZFREE_CACHE_DIR", str(tmp_path / "cache"))
    model, _ = tiny_model
    rows = _unconditional_rows(kind)
    if kind == "absent":
        model = _gpt2_style_model(tmp_path, [r["y"] for r in rows])
        context = {"bos_id": None, "sep_id": None, "empty_x_id": 0}
    else:
        context = {"bos_id": 1, "sep_id": 2, "empty_x_id": None}
    data = _write(tmp_path / f"{kind}.jsonl", rows)
    out = tmp_path / "study"
    assert main(["study", "--model", str(model), "--data", str(data), "--out", str(out), "--preset", "own_smoke"]) == 0
    assert "note: unconditional: x is " in capsys.readouterr().out
    _check_unconditional_split(out, data, context)
    every = sorted(p for p in (out / "runs").iterdir() if p.is_dir())
    assert all((r / "summary.json").exists() for r in every)
    given = sorted(r.name.split("_")[0] for r in every if r.name.startswith(("control_", "oracle-", "null-")))
    assert given == ["control", "control", "null-style", "oracle-style"] and len(every) == 6  # the null oracle: issue 55
    for r in every:
        first = json.loads((r / "metrics.jsonl").read_text().splitlines()[0])
        assert first["loss/val/baseline_normalized_reconstruction_loss"] == pytest.approx(1.0, abs=1e-5)
    gains = pd.read_csv(out / "available_gain.csv")
    assert list(gains["label"]) == ["style"]
    html = (out / "report.html").read_text()
    assert "unconditional: x is " in html


def test_unconditional_pieces_split_reference_notes_and_one_run(tiny_model, tmp_path, monkeypatch, capsys):
    """The default tier's share of the slow study above: (1) the study's preparation and notes on a
    constant-x set (x dropped, split by row, notes.json "unconditional"); (2) ``zfree train`` on a set
    without x and a GPT-2-style tokenizer: the note printed, the reference scoring y after the eos
    standing as the beginning token, and the run's step 0 reading rho_recon = 1 against it."""
    import dataclasses

    from zfree_lab.experiment.own_study import OWN_PRESETS
    from zfree_lab.experiment.pipeline import _notes, prepare
    from zfree_lab.report.labels_report import notes_markdown

    monkeypatch.setenv("ZFREE_CACHE_DIR", str(tmp_path / "cache"))
    model, _ = tiny_model
    data = _write(tmp_path / "constant.jsonl", _unconditional_rows("constant"))
    smoke = OWN_PRESETS["own_smoke"]
    spec = dataclasses.replace(smoke, data=dataclasses.replace(smoke.data, kind="jsonl", path=data),
                               base=dataclasses.replace(smoke.base, kind="pretrained", path=str(model)))
    out = tmp_path / "study"
    out.mkdir()
    prep = prepare(spec, out, progress=False)
    notes = _notes(spec, out, prep, None)
    rec = _check_unconditional_split(out, data, {"bos_id": 1, "sep_id": 2, "empty_x_id": None})
    assert rec["notes"] == notes and "'Write one sentence:' in all 96 rows (dropped)" in notes[0]
    assert notes_markdown(notes).startswith("**Notes**\n\n- unconditional")  # what the report shows first

    rows = _unconditional_rows("absent")
    gpt2 = _gpt2_style_model(tmp_path, [r["y"] for r in rows])
    run = tmp_path / "run"
    sets = ["steps=2", "eval_every=2", "eval_rows=0", "decode_rows=1", "batch_size=4", "beta=0.01",
            "warmup_backbone=1"]
    assert main(["train", "--model", str(gpt2), "--data", str(_write(tmp_path / "absent.jsonl", rows)),
                 "--out", str(run), *[a for s in sets for a in ("--set", s)]]) == 0
    assert "note: unconditional: x is empty or absent in all 96 rows" in capsys.readouterr().out
    ref = json.loads((run / "base" / "reference" / "reference.json").read_text())
    assert (ref["scoring"]["bos_id"], ref["scoring"]["sep_id"], ref["scoring"]["empty_x_id"]) == (None, None, 0)
    first = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert first["loss/val/baseline_normalized_reconstruction_loss"] == pytest.approx(1.0, abs=1e-5)


@pytest.mark.slow  # an own_smoke study to its report, ~2-3 min on one thread
def test_a_label_of_hundreds_of_values_is_capped_for_its_oracle_and_noted(tiny_model, tmp_path, monkeypatch, capsys):
    """Issue 34 case 8: a label with a distinct value on every row (384 values here; 5,000 in the
    issue) gets an oracle of ``LABEL_VALUE_CAP`` values, its per-value samples are bounded by that K,
    and the study says so; before the cap its oracle decoded samples under every value."""
    from zfree.data.labels import LABEL_VALUE_CAP

    monkeypatch.setenv("ZFREE_CACHE_DIR", str(tmp_path / "cache"))
    model, _ = tiny_model
    rows = [{**r, "labels": {**r["labels"], "row": f"u{i}"}} for i, r in enumerate(_rows(n_x=96))]
    data = _write(tmp_path / "many.jsonl", rows)
    out = tmp_path / "study"
    assert main(["study", "--model", str(model), "--data", str(data), "--out", str(out), "--preset", "own_smoke"]) == 0
    oracle = [r for r in (out / "runs").iterdir() if r.name.startswith("oracle-row_")]
    assert len(oracle) == 1
    assert json.loads((oracle[0] / "config.json").read_text())["n_latent"] == LABEL_VALUE_CAP
    assert pd.read_parquet(oracle[0] / "samples.parquet")["latent"].nunique() <= LABEL_VALUE_CAP
    notes = json.loads((out / "notes.json").read_text())["notes"]
    assert any(n.startswith(f"label 'row': {len(rows)} values on the train and val rows; its oracle distinguishes "
                            f"the {LABEL_VALUE_CAP - 1} most frequent") for n in notes)
    assert f"label 'row': {len(rows)} values" in capsys.readouterr().out


@pytest.mark.slow
def test_a_study_refused_by_its_budget_reprobes_nothing_when_run_with_a_larger_one(tiny_model, tmp_path, monkeypatch,
                                                                                  capsys):
    """--budget too small: the probes run, then a one-line refusal (exit 2). The same study with a
    larger budget reuses every probe measurement (``probe-mb<m>.measured.json``): no probe child is
    started again, and the estimate line says its probes were kept."""
    import zfree_lab.experiment.estimate as estimate
    import zfree_lab.experiment.pipeline as pipeline

    monkeypatch.setenv("ZFREE_CACHE_DIR", str(tmp_path / "cache"))
    model, data = tiny_model
    out = tmp_path / "study"
    cmd = ["study", "--model", str(model), "--data", str(data), "--out", str(out), "--preset", "own_smoke"]
    # The probes' deadline is PROBE_SHARE of the budget (1.5 s of these 6 s): on a loaded machine they were
    # stopped there, unmeasured, and nothing was kept. Here they get all the time they need, deterministically;
    # the refusal under test is the grid's (6 s less REPORT_S leaves nothing for the runs), not the probes'.
    with monkeypatch.context() as m:
        m.setattr(estimate, "PROBE_SHARE", 1e6)
        assert main([*cmd, "--budget", "0.1"]) == 2  # 6 s: nothing is left for the runs after the probes
    assert "give a budget of at least" in _err(capsys)
    kept = sorted(out.glob("estimate/**/*.measured.json"))
    assert len(kept) == 2 and not (out / "plan.json").exists()  # the CVAE point's probe and its control's
    stamps = {p: p.stat().st_mtime_ns for p in kept}

    class Planned(Exception):
        pass

    def stop(*a, **k):
        raise Planned
    monkeypatch.setattr(pipeline, "run_points", stop)  # the second study stops once it has planned
    with pytest.raises(Planned):
        main([*cmd, "--budget", "30m"])
    printed = capsys.readouterr().out
    assert "probes none ran now; kept from an earlier probe of the same config on this machine" in printed, printed
    assert {p: p.stat().st_mtime_ns for p in kept} == stamps


def test_a_model_replaced_in_its_folder_is_refused_naming_both_hashes(tiny_model, tmp_path, monkeypatch, capsys):
    """Issue 61: a study rerun on a model whose weights were replaced in the same folder skipped every
    run and reported the old weights' c_base (the study matched its model by path only). Now the
    preparation compares the model's weights (and tokenizer) with the hashes reference.json stored and
    refuses, in one line naming the model folder and both hashes; the unchanged model still passes and
    reuses its reference."""
    from zfree_lab.experiment.sources import Prepared, prepare_base, split_data
    from zfree_lab.experiment.spec import BaseSource

    monkeypatch.setenv("ZFREE_CACHE_DIR", str(tmp_path / "cache"))
    src_model, data = tiny_model
    model = tmp_path / "model"
    shutil.copytree(src_model, model)
    out = tmp_path / "study"
    split_data(data, out, val_size=12)
    source = BaseSource("pretrained", path=str(model))
    first = prepare_base(source, out, Prepared(out)).reference
    stored = json.loads((out / "base" / "reference" / "reference.json").read_text())["model_sha256"]
    again = prepare_base(source, out, Prepared(out)).reference  # the same model: its reference reused
    assert again.c_base == first.c_base and again.meta["model_sha256"] == stored

    import torch

    torch.manual_seed(7)  # other weights of the same shape, saved over the old ones in the same folder
    GPT2LMHeadModel(GPT2LMHeadModel.config_class.from_pretrained(model)).save_pretrained(model)
    from zfree.core.io import sha256_state_dict

    now = sha256_state_dict(GPT2LMHeadModel.from_pretrained(model).float().state_dict())
    assert now != stored
    with pytest.raises(ValueError) as e:
        prepare_base(source, out, Prepared(out))
    msg = str(e.value)
    assert "\n" not in msg and str(model.resolve()) in msg and stored in msg and now in msg, msg
    assert json.loads((out / "base" / "reference" / "reference.json").read_text())["model_sha256"] == stored


def test_the_base_fine_tune_runs_its_steps_however_slow_the_machine(tiny_model, tmp_path, monkeypatch):
    """The entangled regime's base is fine-tuned for its steps (``finetune_base``), not for as long as a wall
    clock allows: with every step taking an hour of (fake) wall time, the fine-tune still runs its 4 steps. Under
    a 30-minute cap it stopped after the first step, so a loaded machine got a weaker base."""
    import types

    from zfree_lab.experiment.sources import finetune_base, link_model, split_data
    from zfree_lab.run import base_training

    clock = iter(range(0, 10**9, 3600))  # one hour per reading of the clock
    monkeypatch.setattr(base_training, "time", types.SimpleNamespace(time=lambda: float(next(clock))))
    monkeypatch.setenv("ZFREE_CACHE_DIR", str(tmp_path / "cache"))
    model, data = tiny_model
    out = tmp_path / "study"
    out.mkdir()
    split_data(data, out)
    ft = finetune_base(link_model(str(model), out), out, steps=4)
    log = json.loads((ft / "train_log.json").read_text())
    assert log["steps"] == 4 and log["wall_s"] >= 4 * 3600


def test_zfree_status_names_the_study_process_while_it_probes(tiny_model, tmp_path, monkeypatch):
    """`zfree status` said "study process: none running" while a study ran its estimate's probes (the
    study folder's lock was held for the preparation only), inviting a second copy: the lock is held
    from the preparation to the plan, so status names this process then, and it is released after."""
    import os

    from zfree.core.errors import ConfigError
    from zfree_lab.experiment import pipeline
    from zfree_lab.experiment.own_study import run_own_study
    from zfree_lab.experiment.study_status import format_status, study_status
    from zfree_lab.run.locks import lock_owner

    model, data = tiny_model
    seen = {}

    def probes(spec, prep, out, *args, **kwargs):  # where the probes run: read the status, then stop
        seen["status"] = study_status(out)
        raise ConfigError("stopped by the test at its probes")

    monkeypatch.setattr(pipeline, "_fit", probes)
    with pytest.raises(ConfigError, match="stopped by the test"):
        run_own_study(str(model), data, tmp_path / "s", preset="own_smoke", render=False, progress=False,
                      estimate=True)
    st = seen["status"]
    assert st["preparing"] and st["process"]["pid"] == os.getpid() and st["process"]["alive"] is True
    assert f"study process: pid {os.getpid()}," in format_status(st)
    assert lock_owner(tmp_path / "s") is None and (tmp_path / "s" / "base").is_dir()  # released; the folder kept


def test_bad_data_is_refused_before_the_studys_imports(tmp_path):
    """A newcomer waited minutes (a loaded machine) for a one-line data error: `zfree study` reads the rows
    before importing torch and the training stack, so the error comes at once and nothing is written."""
    import subprocess
    import sys

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"x": "a", "y": "b"}\n{"x": "a", "y": }\n')
    (tmp_path / "m").mkdir()  # a model folder (a missing or empty one is refused first) and never loaded
    (tmp_path / "m" / "config.json").write_text("{}")
    code = ("import sys\nfrom zfree_lab.cli import main\n"
            f"rc = main(['study', '--model', {str(tmp_path / 'm')!r}, '--data', {str(bad)!r}, '--out', {str(tmp_path / 'o')!r}])\n"
            "print(rc, 'torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.stdout.split() == ["2", "False"], r.stderr
    assert "bad.jsonl:2: not valid JSON" in r.stderr and not (tmp_path / "o").exists()


@pytest.mark.parametrize("n_rows, val_rows", [(6, None), (40, 3)])
def test_a_split_of_too_few_validation_rows_is_refused_before_anything_runs(tiny_model, tmp_path, capsys, n_rows,
                                                                            val_rows):
    """A new user's 6-row file was split 5 + 1 and ran a whole study on one validation row (a note said so); a
    --val file of 3 rows did the same. Now one line naming the file, exit 2, no run, no reference."""
    model, _ = tiny_model
    rows = _rows()
    data = _write(tmp_path / "small.jsonl", rows[:n_rows])
    argv = ["study", "--model", str(model), "--data", str(data), "--out", str(tmp_path / "s"), "--preset", "own_smoke"]
    if val_rows:
        argv += ["--val", str(_write(tmp_path / "v.jsonl", [{**r, "id": "v" + r["id"]} for r in rows[-val_rows:]]))]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    named = f"--val {tmp_path / 'v.jsonl'}: 3 rows" if val_rows else f"--data {data}: 6 rows leave 1 for validation"
    assert err.count("\n") == 0 and err.startswith(f"zfree: error: {named}") and "at least 5" in err, err
    assert not (tmp_path / "s" / "runs").exists() and not (tmp_path / "s" / "base").exists()
