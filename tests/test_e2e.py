"""zfree_lab.run.e2e: the converter's counts on the released CSVs, its label rules on hand-written
rows, the shipped JSONL equal to a fresh conversion, and the shipped E2E base model."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from zfree.core.io import read_json, sha256_file
from zfree_lab.run.e2e import (count_sentences, convert_e2e, first_slot, parse_mr, read_e2e_csv, row_labels,
                            sentence_bucket)
from zfree.data.pairs import Pair, load_pairs

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT.parent / "shared" / "data" / "e2e"
SHIPPED = ROOT / "data" / "e2e"
BASE = SHIPPED / "base"
needs_src = pytest.mark.skipif(not (SRC / "test-fixed.csv").exists(), reason=f"{SRC} not present")


# ---- label rules on hand-written rows ----------------------------------------------------------

def test_parse_mr_keeps_order_and_repeats():
    assert parse_mr("name[Blue Spice], eatType[coffee shop], customer rating[5 out of 5]") == [
        ("name", "Blue Spice"), ("eatType", "coffee shop"), ("customer rating", "5 out of 5")]
    assert parse_mr("area[city centre], area[riverside]") == [("area", "city centre"), ("area", "riverside")]
    for bad in ("", "name Blue Spice", "name[Blue Spice], oops"):
        with pytest.raises(ValueError, match="slot\\[value\\]"):
            parse_mr(bad)


@pytest.mark.parametrize("text,n,bucket", [
    ("Blue Spice is a pub.", 1, "1"),
    ("Blue Spice is a pub", 1, "1"),
    ("Blue Spice is a pub. It is cheap.", 2, "2"),
    ("A pub! Cheap? Yes. Near Avalon.", 4, "3+"),
    ("Rated 3.5 out of 5 at 5.30pm.", 1, "1"),  # a point inside a number ends nothing
    ("Blue Spice is a pub. ", 1, "1"),
    ("It costs £20-25 . Near Avalon.", 2, "2"),  # a lone point after a space still ends a sentence
])
def test_sentence_count_rule(text, n, bucket):
    assert count_sentences(text) == n
    assert sentence_bucket(n) == bucket


@pytest.mark.parametrize("ref,mr,expected", [
    ("Blue Spice is a coffee shop.", "name[Blue Spice], eatType[coffee shop]", "name"),
    ("A coffee shop called Blue Spice.", "name[Blue Spice], eatType[coffee shop]", "eatType"),
    ("Near Avalon is the pub Blue Spice.", "name[Blue Spice], eatType[pub], near[Avalon]", "near"),
    ("Highly rated and priced high, Zizzi.", "name[Zizzi], priceRange[high], customer rating[high]",
     "customer rating"),  # "high" is no cue for either slot; "rated" (7) comes before "priced" (17)
    ("Cheap Italian food at Zizzi.", "name[Zizzi], food[Italian], priceRange[cheap]", "priceRange"),
    ("Kid friendly Zizzi.", "name[Zizzi], familyFriendly[yes]", "familyFriendly"),
    ("In the city center, Zizzi.", "name[Zizzi], area[city centre]", "area"),
    ("An average place, Zizzi.", "name[Zizzi], customer rating[average]", "customer rating"),
    ("The Rice Boat is near The Sorrento.", "name[The Rice Boat], near[The Sorrento]", "name"),
    ("A lovely place.", "name[Zizzi]", "none"),
])
def test_first_slot_rule(ref, mr, expected):
    assert first_slot(ref, parse_mr(mr)) == expected


def test_first_slot_tie_prefers_the_longer_cue():
    # "fast food" (food) and "fast" would tie at 0; the longer cue wins
    assert first_slot("Fast food at Zizzi.", [("name", "Zizzi"), ("eatType", "fast"), ("food", "Fast food")]) == "food"


def test_first_slot_ignores_slots_the_reference_does_not_realise():
    # food[Italian] is in the shown MR, not in the re-annotated one: the word does not count
    assert row_labels("name[Zizzi]", "Italian Zizzi.", "name[Zizzi], food[Italian]")["first_slot"] == "name"


def test_complete_compares_mr_with_orig_mr():
    orig = "name[Zizzi], food[Italian], area[riverside]"
    assert row_labels(orig, "Zizzi serves Italian food by the river.", orig)["complete"] == "yes"
    assert row_labels("name[Zizzi], food[Italian]", "Zizzi serves Italian food.", orig)["complete"] == "no"
    assert row_labels("name[Zizzi], food[French], area[riverside]", "x", orig)["complete"] == "no"  # other value
    # an extra (added) slot in mr does not make a reference incomplete
    assert row_labels(orig + ", near[Avalon]", "...", orig)["complete"] == "yes"


def _write_csv(path, rows, header=("mr", "ref", "fixed", "orig_mr")):
    with path.open("w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def test_read_csv_errors_name_file_and_row(tmp_path):
    _write_csv(tmp_path / "a.csv", [("name[Zizzi]", "Zizzi.", 0, "name[Zizzi]"), ("name[Zizzi]", "", 0, "name[Zizzi]")])
    with pytest.raises(ValueError, match=r"a\.csv: row 3: empty ref"):
        read_e2e_csv(tmp_path / "a.csv", "train")
    _write_csv(tmp_path / "b.csv", [("name Zizzi", "Zizzi.", 0, "name[Zizzi]")])
    with pytest.raises(ValueError, match=r"b\.csv: row 2: MR 'name Zizzi'"):
        read_e2e_csv(tmp_path / "b.csv", "train")
    _write_csv(tmp_path / "c.csv", [("name[Zizzi]", "Zizzi.")], header=("mr", "ref"))
    with pytest.raises(ValueError, match=r"c\.csv: missing column\(s\) \['orig_mr'\]"):
        read_e2e_csv(tmp_path / "c.csv", "train")
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        read_e2e_csv(tmp_path / "nope.csv", "train")


def test_convert_refuses_shared_mrs_and_writes_nothing(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    row = ("name[Zizzi]", "Zizzi.", 0, "name[Zizzi]")
    _write_csv(src / "test-fixed.csv", [row])
    _write_csv(src / "devel-fixed.no-ol.csv", [row])
    with pytest.raises(ValueError, match="1 MRs are in both"):
        convert_e2e(src, out)
    assert not out.exists()


# ---- the released files and the shipped conversion ---------------------------------------------

@needs_src
def test_converter_counts_on_the_release(tmp_path):
    meta = convert_e2e(SRC, tmp_path)
    s = meta["splits"]
    assert (s["train"]["source"], s["train"]["n_rows"], s["train"]["n_x"]) == ("test-fixed.csv", 4693, 630)
    assert (s["val"]["source"], s["val"]["n_rows"], s["val"]["n_x"]) == ("devel-fixed.no-ol.csv", 4299, 543)
    train, val = load_pairs(tmp_path / "train.jsonl"), load_pairs(tmp_path / "val.jsonl")
    assert not {p.x for p in train} & {p.x for p in val}
    for split, pairs in (("train", train), ("val", val)):
        assert len(pairs) == s[split]["n_rows"]
        for key, dist in s[split]["labels"].items():  # the distributions in metadata are the rows' own
            counts: dict = {}
            for p in pairs:
                counts[p.labels[key]] = counts.get(p.labels[key], 0) + 1
            assert counts == dist
        assert sha256_file(tmp_path / f"{split}.jsonl") == s[split]["sha256"]
    # the `fixed` column of the release marks exactly the rows whose mr differs from orig_mr;
    # a reference whose mr equals orig_mr is complete
    with (SRC / "test-fixed.csv").open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    for r, p in zip(rows, train):
        assert (r["fixed"] == "1") == (r["mr"] != r["orig_mr"])
        if r["mr"] == r["orig_mr"]:
            assert p.labels["complete"] == "yes"


@needs_src
def test_shipped_jsonl_equals_a_fresh_conversion(tmp_path):
    meta = convert_e2e(SRC, tmp_path)
    shipped = read_json(SHIPPED / "metadata.json")
    assert shipped == meta
    for split in ("train", "val"):
        assert sha256_file(SHIPPED / f"{split}.jsonl") == meta["splits"][split]["sha256"]


def test_shipped_metadata_keeps_attribution():
    meta = read_json(SHIPPED / "metadata.json")
    assert "Dušek" in meta["attribution"] and meta["licence"] == "CC BY-SA 4.0"
    readme = (SHIPPED / "README.md").read_text(encoding="utf-8")
    assert "Dušek, David M. Howcroft and Verena Rieser" in readme and "CC BY-SA 4.0" in readme


def test_cli_data_e2e(tmp_path, capsys):
    from zfree_lab.cli import main

    if not (SRC / "test-fixed.csv").exists():
        assert main(["data", "e2e", "--src", str(tmp_path / "none"), "--out", str(tmp_path / "o")]) == 2
        return
    assert main(["data", "e2e", "--src", str(SRC), "--out", str(tmp_path / "o")]) == 0
    assert '"n_rows": 4693' in capsys.readouterr().out


# ---- the shipped base model --------------------------------------------------------------------

needs_base = pytest.mark.skipif(not (BASE / "reference" / "reference.json").exists(), reason="no shipped E2E base")


@needs_base
def test_shipped_base_loads_and_its_reference_matches_a_recomputation():
    """b of the first val rows recomputed with transformers' own forward pass and a plain
    cross-entropy (float64), independent of zfree's batching and scorer; c_base is the mean of b."""
    import pandas as pd
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(BASE / "model", local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(BASE / "model", local_files_only=True, dtype=torch.float32).eval()
    ref = read_json(BASE / "reference" / "reference.json")
    per = pd.read_parquet(BASE / "reference" / "per_example.parquet").set_index("id")
    assert ref["n_rows"] == 4299 and ref["data_sha256"] == sha256_file(SHIPPED / "val.jsonl")
    assert ref["c_base"] == pytest.approx(per.loc[per["valid"], "b"].mean(), rel=1e-12)
    assert 1 <= len(tok) <= 2100 and (BASE / "model" / "model.safetensors").stat().st_size < 10e6
    for p in load_pairs(SHIPPED / "val.jsonl", limit=8):
        x = tok(p.x, add_special_tokens=False)["input_ids"]
        y = tok(p.y, add_special_tokens=False)["input_ids"]
        assert tok.decode(y) == p.y  # byte-level BPE restores the text
        ids = [tok.bos_token_id] + x + [tok.sep_token_id] + y + [tok.eos_token_id]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].double()
        start = len(x) + 2  # first y position
        nll = torch.nn.functional.cross_entropy(logits[start - 1:-1], torch.tensor(ids[start:]))
        assert per.loc[p.id, "b"] == pytest.approx(nll.item(), rel=1e-4, abs=1e-5)


# ---- the text tokenizer and the text base path (tiny, fast) -----------------------------------

TEXTS = ["Blue Spice is a coffee shop in the city centre.", "name[Blue Spice], eatType[coffee shop]",
         "Near Café Rouge, Zizzi serves cheap Italian food.", "The Rice Boat is a family-friendly pub."] * 5


def test_bpe_tokenizer_specials_and_round_trip(tmp_path):
    from transformers import AutoTokenizer

    from zfree_lab.run.bpe import train_bpe_tokenizer

    tok = train_bpe_tokenizer(TEXTS, vocab_size=300)
    assert [tok.pad_token_id, tok.bos_token_id, tok.sep_token_id, tok.eos_token_id, tok.unk_token_id] == [0, 1, 2, 3, 4]
    assert 261 < len(tok) <= 300
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    for text in ("Zizzi near Café Sicilia: £20-25!", "Unseen Name Alimentum"):  # bytes never unknown
        ids = again(text, add_special_tokens=False)["input_ids"]
        assert again.decode(ids) == text and tok.unk_token_id not in ids
    with pytest.raises(ValueError, match="vocab_size=100"):
        train_bpe_tokenizer(TEXTS, vocab_size=100)


def test_text_base_training_path(tmp_path):
    """``zfree base train`` on a text data folder (metadata kind e2e): trains the BPE tokenizer and
    a GPT-2, keeps the best evaluation's weights (its c_base equals the reference's on the same
    rows) and saves a dropout-free config."""
    from transformers import AutoConfig

    from zfree_lab.run.base_training import train_base
    from zfree.config import BaseTrainConfig
    from zfree_lab.run.split import write_pairs

    data = tmp_path / "data"
    pairs = [Pair(f"r{i}", f"name[R{i % 6}]", TEXTS[i % 4])
             for i in range(12)]
    write_pairs(pairs[:8], data / "train.jsonl")
    write_pairs(pairs[8:], data / "val.jsonl")
    (data / "metadata.json").write_text(json.dumps({"kind": "e2e"}))
    cfg = BaseTrainConfig(n_layer=1, n_embd=32, n_head=2, batch_size=4, max_steps=6, eval_every=2, warmup_steps=2)
    log = train_base(data, tmp_path / "base", cfg, threads=1, progress=False)
    assert log["kind"] == "text" and len(log["history"]) == 3
    assert log["best_val_c_base_eval_rows"] == min(h["val_c_base"] for h in log["history"])
    assert log["c_base"] == pytest.approx(log["best_val_c_base_eval_rows"], rel=1e-6)
    assert read_json(tmp_path / "base" / "reference" / "reference.json")["c_base"] == log["c_base"]
    conf = AutoConfig.from_pretrained(tmp_path / "base" / "model", local_files_only=True)
    assert conf.resid_pdrop == conf.embd_pdrop == conf.attn_pdrop == 0.0
    with pytest.raises(FileExistsError):
        train_base(data, tmp_path / "base", cfg, threads=1, progress=False)
    # a second phase continues from the first model with its tokenizer
    two = train_base(data, tmp_path / "two", cfg, threads=1, progress=False, init_from=tmp_path / "base" / "model")
    assert two["init_from"] == str(tmp_path / "base" / "model") and two["vocab_size"] == log["vocab_size"]
    assert (tmp_path / "two" / "model" / "tokenizer.json").read_text() == (
        tmp_path / "base" / "model" / "tokenizer.json").read_text()


def test_swap_names_keeps_x_and_y_consistent():
    import numpy as np

    from zfree_lab.run.e2e import swap_names

    rng = np.random.default_rng(0)
    p = Pair("a", "name[Zizzi], food[Italian], near[Café Rouge]", "Zizzi, near Café Rouge, is Italian. Visit Zizzi.",
             labels={"first_slot": "name"})
    q = swap_names(p, rng)
    new_name, new_near = (v for s, v in parse_mr(q.x) if s in ("name", "near"))
    assert new_name not in ("Zizzi",) and new_near != "Café Rouge"
    assert q.y == p.y.replace("Zizzi", new_name).replace("Café Rouge", new_near) and q.labels == p.labels
    assert "food[Italian]" in q.x
    r = Pair("b", "name[Zizzi], near[Avalon]", "Zizzi is near the Avalon.")  # near as written in y
    assert swap_names(Pair("c", "name[Zizzi]", "A pub."), rng).x == "name[Zizzi]"  # name not in y: unchanged
    assert "Avalon" not in swap_names(r, rng).y
