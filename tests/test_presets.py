"""The presets are data (``analysis/studies/presets/*.yaml``, ``zfree_lab.experiment.spec_file``): every
shipped file loads through the one spec loader, its points expand (so validate), its catalog line
counts its runs; a few presets still give the run ids recorded when they moved out of Python
(``tests/golden/preset_run_ids.json``), so an edit that changes a run id (a field, a recipe, the
loader) fails here rather than in a study that then retrains everything; bad input is refused in one
line naming the file and the key."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from zfree.core.errors import ConfigError
from zfree.core.paths import SHIPPED_E2E
from zfree.objective.remedies import SWITCH_ON_E2E, SWITCH_ON_RECIPE, remedy_fields
from zfree.reference.reference import Reference
from zfree_lab.experiment import pipeline
from zfree_lab.experiment.catalog import preset_files, read_entry
from zfree_lab.experiment.own_study import OWN_PRESETS
from zfree_lab.experiment.sources import Prepared, split_data
from zfree_lab.experiment.spec_file import load_spec, shipped_presets, spec_from_dict
from zfree_lab.experiment.study import PRESETS

GOLDEN = json.loads((Path(__file__).parent / "golden" / "preset_run_ids.json").read_text())


@pytest.mark.parametrize("name", sorted(preset_files()))
def test_every_shipped_preset_loads_expands_and_counts_its_runs(name):
    path = preset_files()[name]
    spec = load_spec(path)  # every point expanded, so validated
    entry = read_entry(path)
    assert spec.name == name and spec == shipped_presets()[name] == {**PRESETS, **OWN_PRESETS}[name]
    assert spec_from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    b = spec.boundary
    runs = len(spec.points()) if b is None else len(b.weightings) * len(b.beta_factors) * len(b.aids) + len(b.extra)
    assert entry.runs == runs
    assert entry.own == (spec.base.kind == "pretrained") and (name in OWN_PRESETS) == entry.own
    assert all(f.is_file() for f in (entry.bound or ())[1:])


def test_smoke_default_and_e2e_keep_their_run_ids(tmp_path):
    assert [p.run_id for p in PRESETS["smoke"].points()] == GOLDEN["smoke"]
    for name in ("default", "e2e"):  # the study folder prepared as a study prepares it (shipped folders)
        spec = PRESETS[name]
        prep = pipeline.prepare(spec, tmp_path / name, progress=False)
        assert [p.run_id for p in pipeline._points(spec, prep)] == GOLDEN[name], name


def test_the_e2e_smollm2_preset_keeps_its_run_ids(tmp_path):
    """Its data split into a study folder as ``zfree study --preset e2e-smollm2`` splits it (the shipped
    train file, 300 validation rows spread over the MRs); its base stands for the fetched
    SmolLM2-135M-Instruct by the hashes a run id reads (``spec.portable``), its reference by c_base
    and the median |S| (32) that give that run's beta* = 0.010537, so beta*/3 = 0.003512."""
    spec = OWN_PRESETS["e2e-smollm2"]
    split_data(SHIPPED_E2E / "train.jsonl", tmp_path, val=SHIPPED_E2E / "val.jsonl", val_rows=spec.data.val_rows)
    ref_dir = tmp_path / "base" / "reference"
    ref_dir.mkdir(parents=True)
    (ref_dir / "reference.json").write_text(json.dumps({
        "model_sha256": "98eaeff6513ea20e8f9277fda02f6593e3c2678f5b7eb23eff72e4bc49b9ef09",
        "tokenizer_sha256": "9a0340e63c21fe4697a232d40167e54c3e0480c4cb6ba22f75fd81b1d2157a9e"}))
    ref = Reference(2.965618667408185, pd.DataFrame({"n_tokens": [32.0], "b": [3.0]}), {})
    prep = Prepared(tmp_path, tmp_path / "base", "pretrained_source", reference=ref)
    assert [p.run_id for p in pipeline._points(spec, prep)] == GOLDEN["e2e-smollm2"]


def test_recipes_expand_first_and_the_mappings_own_fields_win():
    spec = spec_from_dict({"name": "r", "train": {"steps": 90}, "grid": {"variant": [
        {"recipe": "SWITCH_ON_RECIPE", "steps": 600, "batch_size": "8"},
        {"recipe": ["SWITCH_ON_RECIPE", "SWITCH_ON_E2E"], "lr_new": "1e-3"},
        {"weighting": "plain", "remedy": "cyclical"}]}})
    aided, e2e, cyclical = spec.grid["variant"]
    assert aided == {**SWITCH_ON_RECIPE, "steps": 600, "batch_size": 8}
    assert e2e == {**SWITCH_ON_RECIPE, **SWITCH_ON_E2E, "lr_new": 0.001}
    assert cyclical == {"weighting": "plain", **remedy_fields("cyclical", steps=90)}  # at train's steps
    assert len(spec.points()) == 3


@pytest.mark.parametrize("edit, key", [
    ({"colour": 1}, "colour"),
    ({"train": {"stepz": 3}}, "stepz"),
    ({"train": {"steps": "many"}}, "steps"),
    ({"grid": {"variant": [{"recipe": "SWITCH_ON"}]}}, "grid.variant: recipe"),
    ({"grid": {"variant": [{"remedy": "free_bit"}]}}, "grid.variant: remedy"),
    ({"grid": {"variant": [{"beta": -1.0}]}}, "beta"),
    ({"data": {"kind": "zip"}}, "data.kind"),
    ({"data": {"kind": "synthetic", "config": {"n_trian": 5}}}, "data.config"),
    ({"base": {"kind": "folder", "path": 3}}, "base.path"),
    ({"boundary": {"weightings": ["tokens"], "aids": ["none"]}}, "weightings"),
    ({"boundary": {"weightings": ["plain"], "aids": ["hard_em"]}}, "boundary.aided"),
    ({"boundary": {"beta_factors": [0]}}, "boundary.beta_factors"),
    ({"seeds": [0, 0]}, "seeds"),
])
def test_a_bad_spec_file_is_refused_in_one_line_naming_the_file_and_the_key(tmp_path, edit, key):
    f = tmp_path / "mine.yaml"
    f.write_text(yaml.safe_dump({"grid": {"beta": [0.3]}, "catalog": {"runs": 1}, **edit}))
    with pytest.raises(ConfigError) as e:
        load_spec(f)
    msg = str(e.value)
    assert msg.startswith(f"{f}: ") and key in msg and "\n" not in msg, msg


def test_a_preset_file_without_its_catalog_line_is_named(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("grid: {beta: [0.3]}\ncatalog: {runs: 1, what: x}\n")
    with pytest.raises(ConfigError, match=rf"{f}: catalog must be a mapping with keys cost, runs and what"):
        read_entry(f)


def test_an_unknown_preset_on_the_command_line_lists_every_preset(tmp_path, capsys):
    """`zfree study --preset NAME` with a name no preset has: one line naming all of them, the own-data and
    the fetched-model presets too, and no study folder made."""
    from zfree_lab.cli import main

    assert main(["study", "--preset", "nope", "--out", str(tmp_path / "s")]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("zfree: error: --preset 'nope' is not one of")
    assert all(name in line for name in ("'default'", "'smoke'", "'own'", "'own_smoke'", "'e2e-smollm2'"))
    assert not (tmp_path / "s").exists()


def test_the_oracle_smollm2_preset_plans_its_arms_controls_and_nulls(tmp_path):
    """Issue 55's decisive experiment as the pipeline plans it (its data split as the study splits it, its
    base a stand-in reference): per seed, the ``complete`` oracle as shipped (router_clip global, K own
    vectors) and decoupled (the probe's own clip, K deltas on a shared vector), and decoupled the
    ``n_sentences`` and ``y_words`` oracles on the embedding, mid and memory routes; each oracle linked to
    the control of its own recipe (4 per seed) and to its null oracle (its point, the label permuted)."""
    spec = OWN_PRESETS["oracle-smollm2"]
    split_data(SHIPPED_E2E / "train.jsonl", tmp_path, val=SHIPPED_E2E / "val.jsonl", val_rows=spec.data.val_rows)
    (tmp_path / "base" / "reference").mkdir(parents=True)
    (tmp_path / "base" / "reference" / "reference.json").write_text(json.dumps({"model_sha256": "m",
                                                                                "tokenizer_sha256": "t"}))
    prep = Prepared(tmp_path, tmp_path / "base", "pretrained_source",
                    reference=Reference(2.97, pd.DataFrame({"n_tokens": [32.0], "b": [3.0]}), {}))
    points = pipeline._points(spec, prep, tmp_path)
    links = json.loads((tmp_path / "controls.json").read_text())
    by_id = {p.run_id: p.params for p in points}
    assert len(points) == 60 and [p.params["seed"] for p in points] == [0] * 20 + [1] * 20 + [2] * 20

    def arm(q):
        return (q["latent_source"], q["router_clip"], q["latent_capacity"], q["injection"])

    oracles = sorted(arm(by_id[o]) for o in links["oracles"] if by_id[o]["seed"] == 0)
    decoupled = [(f"label:{k}", "own", "shared_delta", r) for k in ("n_sentences", "y_words")
                 for r in ("embedding", "mid", "memory")]
    assert oracles == sorted([("label:complete", "global", "per_value", "embedding"),
                              ("label:complete", "own", "shared_delta", "embedding"), *decoupled])
    for o, link in links["oracles"].items():
        q, c, z = by_id[o], by_id[link["control"]], by_id[links["nulls"][o]]
        assert (q["steps"], q["batch_size"], q["eval_rows"], q["lora_rank"], q["n_latent"]) == \
            (100, 8, 300, 8, 2 if link["label"] == "complete" else 3) and link["n_values"] == q["n_latent"]
        assert c["latent_source"] == "control" and (c["seed"], c["latent_capacity"], c["injection"]) == \
            (q["seed"], q["latent_capacity"], q["injection"])
        assert z == {**q, "latent_source": f"null:{link['label']}"}
    assert sum(q["latent_source"] == "control" for q in by_id.values()) == 12
    from zfree_lab.experiment.controls import oracle_labels  # each arm's K is its label's number of values

    assert oracle_labels(tmp_path, ["complete", "n_sentences", "y_words"]) == {"complete": 2, "n_sentences": 3,
                                                                               "y_words": 3}
