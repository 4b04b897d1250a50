"""zfree.reference.reference: artifacts round-trip, both c_base estimators agree, hash checks refuse a
reference computed from another model or other data."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from zfree_lab.run.tokenizer import build_digit_tokenizer
from zfree.core.io import atomic_write_json, read_json
from zfree.models.base import build_synthetic_gpt2
from zfree.reference.reference import build_reference, load_reference, resolve_reference
from zfree.reference.scoring import load_scoring_model, score_pairs
from zfree.data.pairs import load_pairs

os.environ["HF_HUB_OFFLINE"] = "1"


def write_rows(path, n: int, seed: int):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        x = rng.integers(0, 6, rng.integers(2, 7)).tolist()
        rows.append({"id": f"v{i}", "x": " ".join(map(str, x)), "y": " ".join(map(str, sorted(x))),
                     "strategy": "sort_asc", "bayes_nll": 0.5, "n_consistent": 1})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def run(tmp_path):
    """A base run folder (model/ with its tokenizer) and a data folder with val.jsonl."""
    data = tmp_path / "data"
    data.mkdir()
    write_rows(data / "val.jsonl", 20, seed=0)
    tok = build_digit_tokenizer(6)
    model = build_synthetic_gpt2(len(tok), n_layer=1, n_embd=32, n_head=2, seed=0)
    model.save_pretrained(tmp_path / "base" / "model")
    tok.save_pretrained(tmp_path / "base" / "model")
    return tmp_path / "base", data


def test_build_then_load_round_trips(run):
    base, data = run
    built = build_reference(base, data)
    loaded = load_reference(base)
    assert loaded.c_base == built.c_base == pytest.approx(built.per_example["b"].mean())
    assert loaded.per_example["id"].tolist() == [f"v{i}" for i in range(20)]
    np.testing.assert_array_equal(loaded.per_example["b"], built.per_example["b"])
    assert loaded.meta["c_base_analytic"] is not None and loaded.meta["model_sha256"] and loaded.meta["tokenizer_sha256"]
    model, tok = load_scoring_model(base / "model", device="cpu")
    direct = score_pairs(model, tok, load_pairs(data / "val.jsonl"), cache=False)
    np.testing.assert_allclose(loaded.b_of(["v3", "v0"]), direct.per_example.set_index("id").loc[["v3", "v0"], "b"])
    s = loaded.surprisal_of(["v5"])[0]
    assert len(s) == direct.per_example.set_index("id").loc["v5", "n_tokens"]
    assert (s / s.sum()).sum() == pytest.approx(1.0)


def test_both_estimators_agree_on_the_same_model_and_rows(run, tmp_path):
    base, data = run
    built = build_reference(base, data)
    ent = resolve_reference("entangled_run", base, data)
    pre = resolve_reference("pretrained_source", base, data, cache_dir=tmp_path / "cache")
    assert ent.meta["estimator"] == "entangled_run" and pre.meta["estimator"] == "pretrained_source"
    assert ent.c_base == built.c_base
    assert pre.c_base == pytest.approx(built.c_base, abs=1e-6)
    np.testing.assert_allclose(pre.b_of(pre.per_example["id"]), ent.b_of(pre.per_example["id"]), atol=1e-6)
    again = resolve_reference("pretrained_source", base / "model", data / "val.jsonl", cache_dir=tmp_path / "cache")
    assert again.meta["cache_hit"] and again.c_base == pre.c_base  # a model folder itself, a data file itself


def test_entangled_run_refuses_other_data(run):
    base, data = run
    build_reference(base, data)
    write_rows(data / "val.jsonl", 20, seed=1)
    with pytest.raises(ValueError, match=r"computed from data .*val\.jsonl.*pretrained_source"):
        resolve_reference("entangled_run", base, data)


def test_entangled_run_refuses_another_model(run):
    base, data = run
    build_reference(base, data)
    model, tok = load_scoring_model(base / "model", device="cpu")
    resolve_reference("entangled_run", base, data, model=model, tokenizer=tok)  # the same model passes
    with torch.no_grad():
        model.transformer.wte.weight[0, 0] += 1.0
    with pytest.raises(ValueError, match="computed from weights .*the model given"):
        resolve_reference("entangled_run", base, data, model=model)
    other = build_digit_tokenizer(7)
    with pytest.raises(ValueError, match="computed from tokenizer"):
        resolve_reference("entangled_run", base, data, tokenizer=other)


def test_reference_written_before_tokenizer_hashes_still_checks_model_and_data(run):
    base, data = run
    build_reference(base, data)
    path = base / "reference" / "reference.json"
    meta = read_json(path)
    meta.pop("tokenizer_sha256")
    atomic_write_json(path, meta)
    assert resolve_reference("entangled_run", base, data).c_base == meta["c_base"]


def test_clear_errors(run):
    base, data = run
    with pytest.raises(ValueError, match="'entangled_run', 'pretrained_source'"):
        resolve_reference("analytic", base, data)
    with pytest.raises(FileNotFoundError, match="has no reference"):
        resolve_reference("entangled_run", base, data)
    with pytest.raises(FileNotFoundError, match="test.jsonl"):
        resolve_reference("pretrained_source", base, data, split="test")
    ref = build_reference(base, data)
    with pytest.raises(KeyError, match="nope"):
        ref.b_of(["v0", "nope"])


def test_a_stored_reference_from_another_token_convention_is_refused(run):
    """Same weights, tokenizer and rows, other code: the hashes cannot see it, the recorded convention
    can (the stale E2E reference was scored with <bos>, the code had come to encode without)."""
    from zfree.core.errors import InputError

    base, data = run
    build_reference(base, data, device="cpu")
    path = base / "reference" / "reference.json"
    meta = read_json(path)
    assert meta["scoring"]["bos_id"] == 1 and meta["scoring"]["sep_id"] == 2
    resolve_reference("entangled_run", base, data)  # as written: accepted
    meta["scoring"]["bos_id"] = None
    atomic_write_json(path, meta)
    with pytest.raises(InputError, match=r"reference\.json: scored with bos_id=None, but the code now encodes with "
                                         r"bos_id=1"):
        resolve_reference("entangled_run", base, data)
    meta["scoring"]["bos_id"] = 1
    assert meta["scoring"]["empty_x_id"] is None  # recorded: bos and sep give an empty x its context here
    meta["scoring"]["empty_x_id"] = 3  # as if scored by code that put the eos before an empty x
    atomic_write_json(path, meta)
    with pytest.raises(InputError, match=r"scored with empty_x_id=3, but the code now encodes with empty_x_id=None"):
        resolve_reference("entangled_run", base, data)
    meta["scoring"].pop("empty_x_id")  # a reference written before it was recorded: not checked
    atomic_write_json(path, meta)
    resolve_reference("entangled_run", base, data)


def test_step0_rho_check_names_the_reference_and_the_difference():
    from pathlib import Path

    from zfree.core.errors import InputError
    from zfree.reference.reference import RHO0_TOL, check_step0_rho

    f = Path("/base/reference/reference.json")
    check_step0_rho(1.0, f)
    check_step0_rho(1.0 + 0.9 * RHO0_TOL, f)
    check_step0_rho(1.005, f, low_precision=True)
    for bad in (1.0196, 0.99, float("nan")):
        with pytest.raises(InputError, match=r"^/base/reference/reference\.json: step-0 rho_recon is "):
            check_step0_rho(bad, f)
    with pytest.raises(InputError, match=r"\+1\.960% off its stored b"):
        check_step0_rho(1.0196, f)
