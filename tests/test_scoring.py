"""zfree.reference.scoring against a float64 oracle that scores one unpadded example at a time, with the y
positions picked by hand, on tiny random GPT-2s and a locally trained byte-level BPE tokenizer."""

from __future__ import annotations

import copy
import json
import os
import random

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

from zfree.core.io import sha256_file
from zfree.data.batching import EncodedPair, encode_pair, encode_pairs
from zfree.data.pairs import Pair, load_pairs
from zfree.reference.scoring import ScoreResult, ScoringPolicy, load_scoring_model, plan_batches, score_encoded, score_pairs
from zfree_lab.cli import main as cli_main

os.environ["HF_HUB_OFFLINE"] = "1"
ATOL = 1e-5
WORDS = ("the cat sat on mat dog ran far away then there these thing think quick brown fox jumps over lazy "
         "river stone water light night bright fight sight apple banana orange sort reverse copy").split()


def sentence(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def train_bpe(folder, variant: str):
    """Byte-level BPE trained here (so merges exist). gpt2: bos == eos == pad-less <|endoftext|>, added
    by nobody; llama: dedicated <s> that the tokenizer itself prepends (as Llama's do), </s>, pad = eos;
    smollm2: dedicated bos <|im_start|> != eos that the tokenizer does not add (as SmolLM2's)."""
    rng = random.Random(0)
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator([sentence(rng, 3, 12) for _ in range(2000)], trainer)
    sp = {"gpt2": {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"},
          "llama": {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "</s>"},
          "smollm2": {"bos_token": "<s>", "eos_token": "</s>"}}[variant]
    if variant == "llama":
        tk.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B",
                                                          special_tokens=[("<s>", tk.token_to_id("<s>"))])
    PreTrainedTokenizerFast(tokenizer_object=tk, model_max_length=64, **sp).save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


def tiny_gpt2(folder, tok, seed: int, n_positions: int = 64):
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=len(tok), n_positions=n_positions, n_layer=2, n_embd=32, n_head=2,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    GPT2LMHeadModel(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("scoring")
    tok = train_bpe(root / "tok_gpt2", "gpt2")
    tok_llama = train_bpe(root / "tok_llama", "llama")
    tok_smol = train_bpe(root / "tok_smol", "smollm2")
    m1 = tiny_gpt2(root / "m1", tok, seed=1)
    m2 = tiny_gpt2(root / "m2", tok, seed=2)
    m_llama = tiny_gpt2(root / "m_llama", tok_llama, seed=3)
    rng = random.Random(1)
    pairs = [Pair(f"r{i}", sentence(rng, 1, 6), sentence(rng, 1, 5)) for i in range(14)]
    return dict(root=root, tok=tok, tok_llama=tok_llama, tok_smol=tok_smol, m1=m1, m2=m2, m_llama=m_llama, pairs=pairs)


def oracle(model, seq: list[int], n_target: int) -> np.ndarray:
    """Surprisal of the last ``n_target`` tokens of ``seq``: one unpadded row, float64, full logits."""
    m64 = copy.deepcopy(model).double()
    with torch.no_grad():
        lp = torch.log_softmax(m64(torch.tensor([seq])).logits[0], -1)  # (seq, vocab)
    start = len(seq) - n_target
    return np.array([-lp[t - 1, seq[t]].item() for t in range(start, len(seq))])


def oracle_pair(model, tok, pair: Pair, bos: bool) -> tuple[np.ndarray, list[int]]:
    """The documented convention spelled out by hand: [bos] + x + y + [eos], x and y separately."""
    x = tok(pair.x, add_special_tokens=False)["input_ids"]
    y = tok(pair.y, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    return oracle(model, ([tok.bos_token_id] if bos else []) + x + y, len(y)), y


def assert_matches_oracle(res, model, tok, pairs, bos: bool):
    pt = res.per_token
    for p, row in zip(pairs, res.per_example.itertuples()):
        want, y = oracle_pair(model, tok, p, bos)
        got = pt[pt["id"] == p.id]
        assert row.id == p.id and row.n_tokens == len(y)
        assert got["position"].tolist() == list(range(len(y))) and got["token_id"].tolist() == y
        np.testing.assert_allclose(got["surprisal"].to_numpy(), want, atol=ATOL, rtol=0)
        np.testing.assert_allclose(row.b, want.mean(), atol=ATOL, rtol=0)


@pytest.mark.parametrize("batch_rows", [1, 3, 8])
def test_matches_float64_oracle_at_any_batch_size(world, batch_rows):
    res = score_pairs(world["m1"], world["tok"], world["pairs"], cache=False, max_batch_rows=batch_rows)
    assert_matches_oracle(res, world["m1"], world["tok"], world["pairs"], bos=False)
    assert res.c_base == pytest.approx(res.per_example["b"].mean())


def test_dedicated_bos_is_prepended_once_and_gives_empty_x_a_context(world):
    tok = world["tok_llama"]
    pairs = world["pairs"][:5] + [Pair("empty-x", "", "the cat")]
    res = score_pairs(world["m_llama"], tok, pairs, cache=False, max_batch_rows=3)
    assert_matches_oracle(res, world["m_llama"], tok, pairs, bos=True)
    e = encode_pair(tok, Pair("lit", "<s> the cat", "sat"))
    assert e.prefix_ids.count(tok.bos_token_id) == 1 and e.prefix_ids[0] == tok.bos_token_id


def test_bos_the_tokenizer_does_not_add_is_not_added_by_default(world):
    """bos="auto" is what add_special_tokens=True does: a dedicated bos != eos that the tokenizer
    does not add itself (SmolLM2's <|im_start|>) is not prepended; "always" prepends it once."""
    tok, p = world["tok_smol"], Pair("p", "the cat sat", "on the mat")
    assert tok.bos_token_id is not None and tok.bos_token_id != tok.eos_token_id
    assert tok(p.x)["input_ids"] == tok(p.x, add_special_tokens=False)["input_ids"]
    assert list(encode_pair(tok, p).prefix_ids) == tok(p.x, add_special_tokens=False)["input_ids"]
    assert_matches_oracle(score_pairs(world["m_llama"], tok, [p], cache=False), world["m_llama"], tok, [p], bos=False)
    always = encode_pair(tok, p, bos="always").prefix_ids
    assert always[0] == tok.bos_token_id and always.count(tok.bos_token_id) == 1
    llama = world["tok_llama"]
    assert list(encode_pair(llama, p).prefix_ids) == llama(p.x)["input_ids"]  # exactly what it does itself


def test_empty_x_gets_the_bos_else_the_eos_as_its_context_and_records_it(world):
    """Unconditional text (issue 35): an empty x on a tokenizer that adds no bos and has no sep is
    scored after the tokenizer's bos (GPT-2's <|endoftext|>, exactly what bos="always" scores),
    the id recorded in the settings; a conditional row beside it is unchanged; bos="never" keeps
    the error naming the row."""
    tok, p = world["tok"], Pair("ctx", "", "the cat")
    res = score_pairs(world["m1"], tok, [p, *world["pairs"][:3]], cache=False)
    assert res.settings["empty_x_id"] == tok.bos_token_id and res.settings["bos_id"] is None
    assert_matches_oracle(ScoreResult(res.per_example.iloc[:1], res.per_token[res.per_token["id"] == "ctx"]),
                          world["m1"], tok, [p], bos=True)
    assert_matches_oracle(ScoreResult(res.per_example.iloc[1:], res.per_token[res.per_token["id"] != "ctx"]),
                          world["m1"], tok, world["pairs"][:3], bos=False)
    always = score_pairs(world["m1"], tok, [p], cache=False, policy=ScoringPolicy(bos="always"))
    np.testing.assert_array_equal(always.per_example["b"].to_numpy(), res.per_example["b"].to_numpy()[:1])
    smol = world["tok_smol"]  # a dedicated bos that the tokenizer does not add: that one, not the eos
    assert encode_pair(smol, p).prefix_ids == (smol.bos_token_id,) != (smol.eos_token_id,)
    assert encode_pair(world["tok_llama"], p).prefix_ids == (world["tok_llama"].bos_token_id,)  # its own bos
    with pytest.raises(ValueError, match="'no-ctx'.*context"):
        score_pairs(world["m1"], tok, [Pair("no-ctx", "", "the cat")], cache=False, policy=ScoringPolicy(bos="never"))


def test_empty_x_on_a_tokenizer_with_an_eos_only_gets_the_eos():
    tk = Tokenizer(models.WordLevel({"<unk>": 0, "<eos>": 1, "a": 2, "b": 3}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>", unk_token="<unk>")
    e = encode_pair(tok, Pair("u", "", "a b"))
    assert (e.prefix_ids, e.target_ids) == ((1,), (2, 3, 1))
    assert encode_pair(tok, Pair("c", "b", "a")).prefix_ids == (3,)  # a non-empty x: as before, nothing added
    tok_none = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>")  # no bos, no eos, no sep
    with pytest.raises(ValueError, match="'u'.*context"):
        encode_pair(tok_none, Pair("u", "", "a b"))


def test_shuffled_input_order_permutes_the_output(world):
    pairs = world["pairs"]
    perm = np.random.default_rng(0).permutation(len(pairs))
    a = score_pairs(world["m1"], world["tok"], pairs, cache=False).per_example.set_index("id")
    b = score_pairs(world["m1"], world["tok"], [pairs[i] for i in perm], cache=False).per_example
    assert b["id"].tolist() == [pairs[i].id for i in perm]
    np.testing.assert_allclose(b["b"].to_numpy(), a.loc[b["id"], "b"].to_numpy(), atol=ATOL, rtol=0)


def test_padding_changes_nothing(world):
    short = Pair("short", "the", "cat")
    alone = score_pairs(world["m1"], world["tok"], [short], cache=False)
    long_rows = [Pair(f"long{i}", "the quick brown fox jumps over the lazy dog " * 2, "then there") for i in range(3)]
    padded = score_pairs(world["m1"], world["tok"], long_rows + [short], cache=False, max_batch_tokens=10**6)
    np.testing.assert_allclose(padded.per_token.query("id == 'short'")["surprisal"].to_numpy(),
                               alone.per_token["surprisal"].to_numpy(), atol=ATOL, rtol=0)


@pytest.mark.parametrize("n_y", [1, 2, 7])
def test_y_of_length(world, n_y):
    tok, rng = world["tok"], random.Random(n_y)
    ys = [s for s in (sentence(rng, 1, 8) for _ in range(2000)) if len(tok(s, add_special_tokens=False)["input_ids"]) == n_y]
    assert ys, f"no y of {n_y} tokens in the sample"
    pairs = [Pair(f"y{i}", sentence(rng, 1, 4), y) for i, y in enumerate(ys[:4])]
    res = score_pairs(world["m1"], tok, pairs, cache=False)
    assert (res.per_example["n_tokens"] == n_y + 1).all()
    assert_matches_oracle(res, world["m1"], tok, pairs, bos=False)


def test_x_that_a_joint_encoding_would_merge_with_y(world):
    tok = world["tok"]
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    word = next(w for w in WORDS if len(w) >= 4 and len(enc(w)) == 1)
    p = Pair("merge", "the " + word[:2], word[2:] + " sat")
    assert enc(p.x + p.y) != enc(p.x) + enc(p.y)  # the joint encoding straddles the boundary
    e = encode_pair(tok, p)
    assert list(e.prefix_ids) == enc(p.x) and list(e.target_ids) == enc(p.y) + [tok.eos_token_id]
    assert_matches_oracle(score_pairs(world["m1"], tok, [p], cache=False), world["m1"], tok, [p], bos=False)


def test_pad_id_equal_to_end_id_does_not_unscore_the_end_token(world):
    tok = world["tok_llama"]
    assert tok.pad_token_id == tok.eos_token_id
    pairs = [Pair("a", "the", "cat"), Pair("b", "the quick brown fox jumps over", "the lazy dog")]
    res = score_pairs(world["m_llama"], tok, pairs, cache=False, max_batch_tokens=10**6)
    last = res.per_token.groupby("id").tail(1)
    assert (last["token_id"] == tok.eos_token_id).all() and np.isfinite(last["surprisal"]).all()
    assert_matches_oracle(res, world["m_llama"], tok, pairs, bos=True)


def test_b_equals_transformers_loss_for_one_unpadded_example(world):
    model, tok, p = world["m1"], world["tok"], world["pairs"][0]
    e = encode_pair(tok, p)
    ids = torch.tensor([e.prefix_ids + e.target_ids])
    labels = ids.clone()
    labels[0, : len(e.prefix_ids)] = -100
    with torch.no_grad():
        loss = model(input_ids=ids, labels=labels).loss.item()
    b = score_pairs(model, tok, [p], cache=False).per_example["b"].item()
    assert b == pytest.approx(loss, abs=ATOL)


@settings(max_examples=12, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 12), st.integers(1, 9)), min_size=1, max_size=6), st.integers(1, 4),
       st.integers(0, 2**31 - 1))
def test_property_random_lengths_match_oracle(world, lengths, batch_rows, seed):
    model, rng = world["m1"], np.random.default_rng(seed)
    encoded = [EncodedPair(f"p{i}", tuple(rng.integers(3, 300, P).tolist()), tuple(rng.integers(3, 300, L).tolist()))
               for i, (P, L) in enumerate(lengths)]
    res = score_encoded(model, encoded, pad_id=0, max_batch_rows=batch_rows)
    for e, b in zip(encoded, res.per_example["b"]):
        want = oracle(model, list(e.prefix_ids + e.target_ids), len(e.target_ids))
        np.testing.assert_allclose(res.per_token.query("id == @e.id")["surprisal"].to_numpy(), want, atol=ATOL, rtol=0)
        assert b == pytest.approx(want.mean(), abs=ATOL)


def test_plan_batches_respects_budget_and_covers_rows():
    lengths = np.sort(np.random.default_rng(0).integers(8, 40, 500))
    batches = plan_batches(lengths, 256, max_batch_rows=20)
    assert sum(s.stop - s.start for s in batches) == 500 and batches[0].start == 0
    for s in batches:
        rows = s.stop - s.start
        assert rows <= 20 and (rows == 1 or rows * lengths[s.stop - 1] <= 256)


def test_long_pair_cuts_x_from_the_left_and_never_y(world):
    model, tok = world["m1"], world["tok"]
    p = Pair("long", "the quick brown fox jumps over the lazy dog", "then there")
    x = tok(p.x, add_special_tokens=False)["input_ids"]
    y = tok(p.y, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    res = score_pairs(model, tok, [p], cache=False, policy=ScoringPolicy(max_length=len(y) + 3))
    assert res.per_example["x_tokens_cut"].item() == len(x) - 3
    np.testing.assert_allclose(res.per_token["surprisal"].to_numpy(), oracle(model, x[-3:] + y, len(y)), atol=ATOL)
    with pytest.raises(ValueError, match="'long'.*never cut"):
        score_pairs(model, tok, [p], cache=False, policy=ScoringPolicy(max_length=len(y)))


def test_model_that_post_processes_logits_is_scored_through_its_own_head_path(world, tmp_path):
    class ScaledGPT2(GPT2LMHeadModel):  # stands in for soft-capped or scaled logits
        def forward(self, *a, **k):
            out = super().forward(*a, **k)
            out.logits = 3.0 * out.logits
            return out

    torch.manual_seed(0)
    model = ScaledGPT2(world["m1"].config).eval()
    res = score_pairs(model, world["tok"], world["pairs"][:4], cache=False)
    assert res.settings["head_path"] == "hidden_states"  # the forward's own post-processing, by construction
    assert_matches_oracle(res, model, world["tok"], world["pairs"][:4], bos=False)


def test_model_whose_head_cannot_be_reproduced_is_scored_from_its_own_logits(world, tmp_path):
    class TokenBiasGPT2(GPT2LMHeadModel):  # logits depend on the input ids, not only on hidden states
        def forward(self, input_ids=None, **k):
            out = super().forward(input_ids=input_ids, **k)
            out.logits = out.logits + 0.5 * (input_ids % 7).float()[..., None]
            return out

    torch.manual_seed(0)
    model = TokenBiasGPT2(world["m1"].config).eval()
    res = score_pairs(model, world["tok"], world["pairs"][:4], cache=False)
    assert res.settings["head_path"] == "model_logits"
    assert_matches_oracle(res, model, world["tok"], world["pairs"][:4], bos=False)


# ---------------------------------------------------------------- cache

def test_cache_never_crosses_models_and_a_repeat_is_an_identical_hit(world, tmp_path):
    pairs, tok = world["pairs"], world["tok"]
    r1 = score_pairs(world["m1"], tok, pairs, cache_dir=tmp_path)
    r2 = score_pairs(world["m2"], tok, pairs, cache_dir=tmp_path)
    assert not r1.cache_hit and not r2.cache_hit
    assert not np.allclose(r1.per_example["b"], r2.per_example["b"])
    assert_matches_oracle(r2, world["m2"], tok, pairs, bos=False)
    again = score_pairs(world["m1"], tok, pairs, cache_dir=tmp_path)
    assert again.cache_hit
    pd.testing.assert_frame_equal(again.per_example, r1.per_example, check_exact=True)
    pd.testing.assert_frame_equal(again.per_token, r1.per_token, check_exact=True)
    no_eos = score_pairs(world["m1"], tok, pairs, cache_dir=tmp_path, policy=ScoringPolicy(add_eos=False))
    assert not no_eos.cache_hit and (no_eos.per_example["n_tokens"] == r1.per_example["n_tokens"] - 1).all()
    fewer = score_pairs(world["m1"], tok, pairs[:-1], cache_dir=tmp_path)
    assert not fewer.cache_hit


def test_cache_off_switches_write_nothing(world, tmp_path, monkeypatch):
    score_pairs(world["m1"], world["tok"], world["pairs"][:2], cache=False, cache_dir=tmp_path)
    monkeypatch.setenv("ZFREE_NO_CACHE", "1")
    score_pairs(world["m1"], world["tok"], world["pairs"][:2], cache_dir=tmp_path)
    assert not any(tmp_path.iterdir())


# ---------------------------------------------------------------- CLI and bad input

def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_cli_score_writes_the_three_artifacts(world, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"id": p.id, "x": p.x, "y": p.y} for p in world["pairs"]])
    out = tmp_path / "out"
    assert cli_main(["score", "--model", str(world["root"] / "m1"), "--data", str(data), "--out", str(out),
                     "--cache-dir", str(tmp_path / "cache")]) == 0
    pe, pt = pd.read_parquet(out / "per_example.parquet"), pd.read_parquet(out / "per_token.parquet")
    summary = json.loads((out / "summary.json").read_text())
    assert {"id", "b", "n_tokens", "x_tokens_cut"} <= set(pe.columns)
    assert {"id", "position", "token_id", "surprisal"} <= set(pt.columns)
    assert summary["n_rows"] == summary["n_valid"] == len(world["pairs"])
    assert summary["c_base"] == pytest.approx(pe["b"].mean())
    assert {"policy", "weights_sha256", "tokenizer_sha256", "dtype", "scorer_version", "max_length"} <= set(summary)
    assert_matches_oracle(score_pairs(world["m1"], world["tok"], world["pairs"], cache=False), world["m1"],
                          world["tok"], world["pairs"], bos=False)
    np.testing.assert_allclose(pe["b"], score_pairs(world["m1"], world["tok"], world["pairs"], cache=False)
                               .per_example["b"], atol=ATOL)


def test_cli_score_limit_scores_the_files_first_rows_as_the_whole_file_scores_them(world, tmp_path, capsys):
    """`zfree score --limit N`: a quick look at a large file, the first N rows scored exactly as in the
    whole file's scoring (per row: b, to float32 noise of another batch size), N recorded in summary.json; 0 is refused."""
    data = write_jsonl(tmp_path / "d.jsonl", [{"id": p.id, "x": p.x, "y": p.y} for p in world["pairs"]])
    m1 = str(world["root"] / "m1")
    assert cli_main(["score", "--model", m1, "--data", str(data), "--out", str(tmp_path / "all"), "--no-cache"]) == 0
    assert cli_main(["score", "--model", m1, "--data", str(data), "--out", str(tmp_path / "few"), "--no-cache",
                     "--limit", "3"]) == 0
    whole, few = (pd.read_parquet(tmp_path / d / "per_example.parquet") for d in ("all", "few"))
    assert few["id"].tolist() == [p.id for p in world["pairs"][:3]]
    np.testing.assert_allclose(few["b"].to_numpy(), whole["b"].to_numpy()[:3], rtol=0, atol=1e-6)  # batch-size noise
    summary = json.loads((tmp_path / "few" / "summary.json").read_text())
    assert summary["limit"] == 3 and summary["n_rows"] == 3 and "limit" not in json.loads(
        (tmp_path / "all" / "summary.json").read_text())
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli_main(["score", "--model", m1, "--data", str(data), "--out", str(tmp_path / "none"), "--limit", "0"])
    assert "--limit" in capsys.readouterr().err and not (tmp_path / "none").exists()


@pytest.mark.parametrize("content, match", [
    ('{"id": "a", "x": "the", "y": ""}\n', r"d\.jsonl:1: field 'y' is empty"),
    ('{"id": "a", "x": "the", "y": "cat"}\n{"id": "b", "y": "cat"}\n', r"d\.jsonl:2: missing field 'x'"),
    ('{"id": "a", "x": 3, "y": "cat"}\n', r"d\.jsonl:1: field 'x' must be a string"),
    ("id,x,y\na,the,cat\n", r"d\.jsonl:1: not valid JSON"),
    (b"PAR1\x00\xff\xfe", r"d\.jsonl:1: not UTF-8 text at byte 5 of the file \(column 6 of the line\)"),
    (b'{"x": "a", "y": "b"}\n{"x": "\xe9", "y": "b"}\n', r"d\.jsonl:2: not UTF-8 text at byte 28 of the file \(column 8 "),
    ('{"input": "the", "output": "cat"}\n', r"d\.jsonl:1: missing field 'y' \(the row's fields: 'input', 'output'\); "
                                           r"zfree reads the target as 'y' and the condition as 'x'"),
])
def test_bad_data_file_names_file_and_line_and_writes_nothing(world, tmp_path, content, match, capsys):
    path = tmp_path / "d.jsonl"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ValueError, match=match):
        load_pairs(path)
    out = tmp_path / "out"
    assert cli_main(["score", "--model", str(world["root"] / "m1"), "--data", str(path), "--out", str(out),
                     "--no-cache"]) == 2
    assert not out.exists() and "d.jsonl" in capsys.readouterr().err


def test_y_that_tokenizes_to_nothing_names_the_row(tmp_path):
    tk = Tokenizer(models.WordLevel({"<unk>": 0, "<eos>": 1, "a": 2}, unk_token="<unk>"))
    tk.normalizer = normalizers.Replace("z", "")  # "z" normalizes away
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>", unk_token="<unk>")
    with pytest.raises(ValueError, match="'row-7'.*tokenizes to nothing"):
        encode_pairs(tok, [Pair("row-6", "a", "a"), Pair("row-7", "a", "zz")])


def test_model_folder_without_tokenizer_is_a_clear_error(world, tmp_path):
    world["m1"].save_pretrained(tmp_path / "bare")
    with pytest.raises(ValueError, match="has no tokenizer"):
        load_scoring_model(tmp_path / "bare")
    data = write_jsonl(tmp_path / "d.jsonl", [{"id": "a", "x": "the", "y": "cat"}])
    assert cli_main(["score", "--model", str(tmp_path / "bare"), "--data", str(data), "--out",
                     str(tmp_path / "out"), "--no-cache"]) == 2
    assert not (tmp_path / "out").exists()


def test_damaged_cache_entry_is_dropped_and_rescored_with_a_warning(world, tmp_path):
    pairs, tok = world["pairs"], world["tok"]
    first = score_pairs(world["m1"], tok, pairs, cache_dir=tmp_path)
    entry = next(tmp_path.glob("*/*/per_token.parquet")).parent
    raw = bytearray((entry / "per_token.parquet").read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte inside the data
    (entry / "per_token.parquet").write_bytes(bytes(raw))
    with pytest.warns(UserWarning, match="damaged.*checksum mismatch in per_token.parquet"):
        again = score_pairs(world["m1"], tok, pairs, cache_dir=tmp_path)
    assert not again.cache_hit
    pd.testing.assert_frame_equal(again.per_token, first.per_token, check_exact=True)
    assert score_pairs(world["m1"], tok, pairs, cache_dir=tmp_path).cache_hit  # stored again, intact
    (entry / "per_example.parquet").write_bytes(b"PAR1 truncated")
    with pytest.warns(UserWarning, match="damaged"):
        assert not score_pairs(world["m1"], tok, pairs, cache_dir=tmp_path).cache_hit


def test_a_cache_entry_cut_short_with_its_checksums_rewritten_is_rescored(world, tmp_path):
    """A hand-edited entry (the last rows dropped, checksums.json rewritten to match) is not used as
    is: the rows it lacks are not silently missing from c_base."""
    pairs, tok = world["pairs"], world["tok"]
    first = score_pairs(world["m1"], tok, pairs, cache_dir=tmp_path)
    entry = next(tmp_path.glob("*/*/per_token.parquet")).parent
    kept = first.per_example.iloc[:-1]
    kept.to_parquet(entry / "per_example.parquet", index=False)
    first.per_token[first.per_token["id"].isin(kept["id"])].to_parquet(entry / "per_token.parquet", index=False)
    (entry / "checksums.json").write_text(json.dumps({f: sha256_file(entry / f)
                                                      for f in ("per_example.parquet", "per_token.parquet")}))
    with pytest.warns(UserWarning, match=f"damaged.*holds {len(pairs) - 1} rows, not the {len(pairs)} rows"):
        again = score_pairs(world["m1"], tok, pairs, cache_dir=tmp_path)
    assert not again.cache_hit and len(again.per_example) == len(pairs)
    pd.testing.assert_frame_equal(again.per_example, first.per_example, check_exact=True)
