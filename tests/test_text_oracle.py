"""The text oracle (issue 55, item 3): ``latent_source = "text:<key>"`` parses and is validated in one
line (zfree.config), its x holds the label (zfree_lab.run.text_oracle), and a run reads that x for its
rows, its b and its c_base (zfree_lab.run.run_setup); a study trains it as an option beside the label
oracle and its null (zfree_lab.experiment.controls) and the oracle table reads its value (zfree_lab.experiment.gains)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from tests.tiny import tiny_flat
from zfree.config import LatentSource, TrainConfig
from zfree.core.errors import ConfigError
from zfree.data.labels import label_values
from zfree.data.pairs import Pair, load_pairs
from zfree_lab.run.text_oracle import TEXT_TEMPLATE, text_template, write_text_data
from zfree_lab.run.tokenizer import build_digit_tokenizer

STRATEGIES = ["copy", "reverse", "sort_asc", "sort_desc"]


def test_text_source_parses_round_trips_and_is_a_z_free_given_arm():
    s = LatentSource.parse("text:strategy")
    assert (s.kind, s.label, str(s), s.given, s.z_free) == ("text", "strategy", "text:strategy", True, True)
    assert LatentSource.text_oracle("n_sentences*first_slot") == LatentSource("text", "n_sentences*first_slot")
    assert not LatentSource.parse("label:strategy").z_free and LatentSource.parse("control").z_free


@pytest.mark.parametrize("fields, names", [({"latent_source": "text:"}, "latent_source"),
                                          ({"latent_source": "text:  "}, "latent_source"),
                                          ({"latent_source": "text:strategy", "n_latent": 4}, "n_latent"),
                                          ({"latent_source": "text:strategy", "n_latent": 1,
                                            "latent_kind": "continuous"}, "latent_kind")])
def test_a_bad_text_source_is_refused_in_one_line_naming_the_field(fields, names):
    with pytest.raises(ValueError) as e:
        TrainConfig.from_flat({**TrainConfig().to_flat(), "beta": 0.0, **fields})
    assert names in str(e.value) and "\n" not in str(e.value)
    ok = TrainConfig.from_flat({**TrainConfig().to_flat(), "beta": 0.0, "latent_source": "text:strategy",
                                "n_latent": 1})
    assert ok.model.latent_source == "text:strategy"


def test_a_tokenizer_that_writes_the_label_gets_it_as_a_line_of_text():
    from zfree_lab.run.bpe import train_bpe_tokenizer

    tok = train_bpe_tokenizer(["the cat sat on the mat. strategy copy reverse"] * 20, vocab_size=300)
    name, write = text_template(tok, "strategy", STRATEGIES)
    assert name == "text" and write("the cat", "reverse") == TEXT_TEMPLATE.format(x="the cat", key="strategy",
                                                                                 value="reverse")
    assert write("the cat", "reverse").endswith("\nstrategy: reverse")


def test_the_digit_vocabulary_writes_the_labels_index_and_a_smaller_one_is_refused_in_one_line():
    name, write = text_template(build_digit_tokenizer(10), "strategy", STRATEGIES)
    assert name == "index" and [write("6 5 2", v) for v in STRATEGIES] == [f"6 5 2 {i}" for i in range(4)]
    twelve = [f"v{i:02d}" for i in range(12)]  # two digits each, one width for all
    assert text_template(build_digit_tokenizer(10), "k", twelve)[1]("1", "v03") == "1 0 3"
    with pytest.raises(ConfigError) as e:  # digits 0 and 1 only: the index 2 is not writable
        text_template(build_digit_tokenizer(2), "strategy", STRATEGIES)
    assert "latent_source='text:strategy'" in str(e.value) and "\n" not in str(e.value)


def test_the_text_oracles_rows_keep_everything_but_x_and_x_holds_the_label(tiny_run, tmp_path):
    data, _ = tiny_run
    out, name = write_text_data(data, tmp_path / "text", "strategy", build_digit_tokenizer(10))
    values = label_values(load_pairs(data / "train.jsonl") + load_pairs(data / "val.jsonl"), "strategy")
    for split in ("train", "val"):
        before, after = load_pairs(data / f"{split}.jsonl"), load_pairs(out / f"{split}.jsonl")
        assert [p.id for p in after] == [p.id for p in before] and name == "index"
        for a, b in zip(before, after):
            assert (b.y, b.strategy, b.bayes_nll, b.labels) == (a.y, a.strategy, a.bayes_nll, a.labels)
            assert b.x == f"{a.x} {values.index(a.strategy)}"  # the label written after x
    with pytest.raises(ValueError, match="no label 'missing'"):
        write_text_data(data, tmp_path / "bad", "missing", build_digit_tokenizer(10))


def test_a_text_oracle_run_scores_its_reference_and_its_rows_on_the_x_with_the_label(tiny_run, tmp_path):
    """On a tiny model: the run's c_base (config.json) and each evaluated row's b are the base's on the
    augmented x (scored here independently), not the stored reference's of the plain x; step 0 reads
    rho_recon 1 against that reference."""
    import torch

    from zfree.models.base import load_base
    from zfree.reference.reference import load_reference
    from zfree.reference.scoring import score_pairs
    from zfree_lab.run.run_setup import TEXT_DATA_DIR
    from zfree_lab.run.training import train_cvae

    data, base = tiny_run
    flat = tiny_flat(data, base, latent_source="text:strategy", n_latent=1, beta=0.0, steps=2, eval_every=2,
                     device="cpu", seed=0)
    train_cvae(TrainConfig.from_flat(flat), tmp_path / "text", progress=False)
    run = tmp_path / "text"
    val = load_pairs(run / TEXT_DATA_DIR / "val.jsonl")
    assert all(p.x.split()[-1] == str(STRATEGIES.index(p.strategy)) for p in val)
    model, tok = load_base(base / "model")
    with torch.no_grad():
        scored = score_pairs(model, tok, val, cache=False).per_example.set_index("id")
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["_c_base"] == pytest.approx(float(scored["b"].mean()), rel=1e-6)
    assert cfg["_c_base"] != pytest.approx(load_reference(base).c_base, rel=1e-3)  # not the plain x's
    pe = pd.read_parquet(run / "per_example.parquet").set_index("id")
    np.testing.assert_allclose(pe["b"].to_numpy(), scored.loc[pe.index, "b"].to_numpy(), rtol=1e-5)
    first = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert first["step"] == 0 and first["loss/val/baseline_normalized_reconstruction_loss"] == pytest.approx(1, abs=1e-5)


def test_a_pair_without_x_gets_the_label_as_its_only_context():
    """Unconditional text: x = "" becomes the label's line (the template's x is empty)."""
    from zfree_lab.run.text_oracle import text_pair

    p = text_pair(Pair("1", "", "y", strategy="copy"), "strategy", lambda x, v: f"{x}\nstrategy: {v}")
    assert p.x == "\nstrategy: copy" and p.y == "y"


# ---------------------------------------------------------------------------- in a study


def test_a_study_trains_the_text_oracle_beside_the_oracle_and_its_null_only_when_asked():
    from zfree_lab.experiment.controls import text_params, with_controls
    from zfree_lab.experiment.spec import expand_grid

    pts = expand_grid({**TrainConfig().to_flat(), "steps": 50}, {"beta": [0.1, 0.3]})
    plain, links = with_controls(pts, {"strategy": 4})
    assert links["texts"] == {} and not any(p.run_id.startswith("text-") for p in plain)
    out, links = with_controls(pts, {"strategy": 4}, text=True)
    given = out[len(pts):]
    assert [p.run_id.split("_")[0] for p in given] == ["control", "oracle-strategy", "null-strategy", "text-strategy"]
    assert links["texts"] == {given[1].run_id: given[3].run_id}
    t, c = given[3].params, given[0].params
    assert (t["latent_source"], t["n_latent"]) == ("text:strategy", 1)
    assert {k: v for k, v in t.items() if k != "latent_source"} == {k: v for k, v in c.items() if k != "latent_source"}
    assert text_params(pts[0].params, "strategy") == t
    arm = expand_grid({**TrainConfig().to_flat(), "steps": 50, "beta": 0.0},  # an oracle arm written in the grid
                      {"variant": [{"latent_source": "label:strategy", "n_latent": 4}]})
    out, links = with_controls(arm, None, text=True)
    assert links["texts"] == {arm[0].run_id: next(p.run_id for p in out if p.run_id.startswith("text-strategy"))}


def test_the_spec_field_is_read_validated_in_one_line_and_left_out_of_a_plan_at_its_default():
    from zfree_lab.experiment.spec_file import spec_from_dict
    from zfree_lab.experiment.study_plan import request_of

    assert spec_from_dict({"name": "s", "text_oracles": True}).text_oracles is True
    assert spec_from_dict({"name": "s"}).text_oracles is False
    with pytest.raises(ConfigError) as e:
        spec_from_dict({"name": "s", "text_oracles": "yes"})
    assert "text_oracles" in str(e.value) and "\n" not in str(e.value)
    assert "text_oracles" not in request_of(spec_from_dict({"name": "s"}), None)["spec"]  # older plans still match
    assert request_of(spec_from_dict({"name": "s", "text_oracles": True}), None)["spec"]["text_oracles"] is True


def test_the_oracle_table_reads_the_text_oracles_gain_over_the_control(tmp_path):
    from zfree_lab.experiment.controls import LINKS_FILE
    from zfree_lab.experiment.gains import oracle_table
    from zfree_lab.report.gains_report import available_gain_table

    n, runs = 40, tmp_path / "runs"
    for rid, lbar, src in (("control_plain_1", 0.9, "control"), ("oracle-a_plain_2", 0.7, "label:a"),
                           ("null-a_plain_3", 0.9, "null:a"), ("text-a_plain_4", 0.6, "text:a")):
        (runs / rid).mkdir(parents=True)
        pd.DataFrame({"id": [f"r{i}" for i in range(n)], "n_tokens": np.full(n, 10),
                      "lbar": lbar + np.linspace(-0.01, 0.01, n), "kl": np.zeros(n), "b": np.ones(n),
                      "beta_eff": np.full(n, 0.2)}).to_parquet(runs / rid / "per_example.parquet")
        (runs / rid / "summary.json").write_text(json.dumps({"latent_source": src}))
    (tmp_path / LINKS_FILE).write_text(json.dumps({
        "controls": {}, "oracles": {"oracle-a_plain_2": {"label": "a", "n_values": 3, "control": "control_plain_1"}},
        "nulls": {"oracle-a_plain_2": "null-a_plain_3"}, "texts": {"oracle-a_plain_2": "text-a_plain_4"}}))
    o = oracle_table(tmp_path).iloc[0]
    assert o["delta_R_text"] == pytest.approx(3.0) and o["delta_R_text_lo"] <= 3.0 <= o["delta_R_text_hi"]
    assert o["text_run_id"] == "text-a_plain_4" and o["delta_R"] == pytest.approx(2.0)
    table = available_gain_table(oracle_table(tmp_path))
    assert "text oracle ΔR (label written into x) [nats/ex]" in table and "null oracle ΔR (permuted label) [nats/ex]" in table
