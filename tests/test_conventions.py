"""The field's scoring conventions: bos as the tokenizer itself does it (the shipped word-level
tokenizer declares its <bos>, so the shipped base run scores as before), and the x/y seam under
byte-level BPE and SentencePiece."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from zfree.data.batching import encode_pair
from zfree.data.pairs import Pair, load_pairs
from zfree.data.tokenizer import build_digit_tokenizer
from zfree.reference.reference import resolve_reference
from zfree.reference.scoring import load_scoring_model, score_pairs

ROOT = Path(__file__).resolve().parents[1]
BASE, DATA = ROOT / "data" / "base" / "default", ROOT / "data" / "synth" / "default"
WORDS = "the cat sat on mat dog ran far away then there these thing quick brown fox".split()


def test_word_level_tokenizer_declares_its_bos():
    tok = build_digit_tokenizer(10)
    assert tok("1 2")["input_ids"] == [tok.bos_token_id, 6, 7]
    e = encode_pair(tok, Pair("a", "1 2", "3"))
    assert e.prefix_ids == (tok.bos_token_id, 6, 7, tok.sep_token_id)  # [bos] x [sep], bos exactly once


def test_shipped_base_run_scores_as_its_reference():
    """c_base of the shipped reference is reproduced with the shipped tokenizer under the default
    policy: the same token ids (one <bos>) and b within float32 rounding (the reference was computed
    on another machine: 4.8e-7 nats/token apart at most, measured)."""
    model, tok = load_scoring_model(BASE / "model", device="cpu", dtype="float32")
    pairs = load_pairs(DATA / "val.jsonl")
    res = score_pairs(model, tok, pairs, cache=False)
    ref_pe = pd.read_parquet(BASE / "reference" / "per_example.parquet")
    ref_pt = pd.read_parquet(BASE / "reference" / "per_token.parquet")
    assert res.settings["bos_id"] == tok.bos_token_id
    assert (res.per_token["token_id"].to_numpy() == ref_pt["token_id"].to_numpy()).all()
    np.testing.assert_allclose(res.per_example["b"].to_numpy(), ref_pe["b"].to_numpy(), atol=1e-5, rtol=0)
    ref = resolve_reference("entangled_run", BASE, DATA, model=model, tokenizer=tok)  # hashes check out
    assert res.c_base == pytest.approx(ref.c_base, abs=1e-6)


def _trained(pre, dec, special, norm=None):
    rng = random.Random(0)
    text = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 10))) + "." for _ in range(1500)]
    tk = Tokenizer(models.BPE(unk_token=None if "unk" not in special else "<unk>"))
    tk.pre_tokenizer, tk.decoder = pre, dec
    if norm is not None:
        tk.normalizer = norm
    alphabet = pre_tokenizers.ByteLevel.alphabet() if isinstance(pre, pre_tokenizers.ByteLevel) else []
    tk.train_from_iterator(text, trainers.BpeTrainer(vocab_size=300, special_tokens=list(special.values()),
                                                     initial_alphabet=alphabet, show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tk, **special)


def test_seam_under_byte_level_bpe_a_leading_space_in_y_matches_the_joint_encoding():
    tok = _trained(pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel(),
                   {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"})
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    x = "the cat sat on the"
    e = encode_pair(tok, Pair("s", x, " mat."), add_eos=False)
    assert list(e.prefix_ids) + list(e.target_ids) == enc(x + " mat.")  # the space belongs to y's first token
    assert enc("mat.") != enc(" mat.")  # without the space y is another token sequence


def test_seam_under_sentencepiece_a_separate_y_gets_its_word_start_marker():
    """Llama-2's fast tokenizer: normalizer Prepend("▁") + Replace(" ", "▁"), as SentencePiece does."""
    tok = _trained(pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never"),
                   decoders.Metaspace(replacement="▁", prepend_scheme="always"),
                   {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
                   norm=normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]))
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    x = "the cat sat on the"
    joint_y = enc(x + " mat.")[len(enc(x)):]
    assert enc("mat.") == joint_y  # y without a space: the tokens a joint encoding gives
    spaced = enc(" mat.")
    assert len(spaced) == len(joint_y) + 1 and tok.convert_ids_to_tokens(spaced[0]) == "▁"  # the extra "▁"
    e = encode_pair(tok, Pair("s", x, " mat."), add_eos=False)
    assert list(e.target_ids) == spaced  # zfree scores y as given: the caller chooses the spelling
