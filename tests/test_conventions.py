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
from zfree_lab.run.tokenizer import build_digit_tokenizer
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


# ---------------------------------------------------------------------------- issue 61: special-token text in data


def test_special_token_text_in_data_is_encoded_as_text(tmp_path):
    """A literal "<eos>" (GPT-2's "<|endoftext|>") inside y was parsed into the end token mid-sequence,
    so S ended early in the model's eyes and the rest of y read as a new document; x's "<bos>" likewise.
    Data text is now encoded as the characters it is (``special_text="text"``, the default of
    ``encode_pairs`` and ``ScoringPolicy``): the end token only closes S, the text decodes back, and
    ``special_text="tokens"`` (documented opt-in) keeps the parse. The score cache keeps the two apart."""
    from zfree.data.batching import encode_pairs
    from zfree_lab.run.bpe import train_bpe_tokenizer
    from zfree.reference.scoring import ScoringPolicy

    tok = train_bpe_tokenizer(["the cat sat on the mat", "a dog ran far away"] * 10, vocab_size=300)
    specials = set(tok.all_special_ids)
    pair = Pair("r", "say <bos> it", "the cat <eos> sat")
    (e,) = encode_pairs(tok, [pair])
    assert e.target_ids[-1] == tok.eos_token_id and not specials & set(e.target_ids[:-1]), e.target_ids
    assert not specials & set(e.prefix_ids[1:-1]), e.prefix_ids  # only the convention's bos first and sep last
    assert tok.decode(e.target_ids[:-1]) == "the cat <eos> sat" and tok.decode(e.prefix_ids[1:-1]) == "say <bos> it"
    (parsed,) = encode_pairs(tok, [pair], special_text="tokens")
    assert parsed.target_ids.count(tok.eos_token_id) == 2  # the opt-in: the text's "<eos>" is the token
    plain = Pair("p", "say it", "the cat sat")  # no special-token text: both choices agree
    assert encode_pairs(tok, [plain]) == encode_pairs(tok, [plain], special_text="tokens")
    assert ScoringPolicy().special_text == "text"
    with pytest.raises(ValueError, match="special_text='parse'"):
        ScoringPolicy(special_text="parse")

    from zfree.models.base import build_synthetic_gpt2

    model = build_synthetic_gpt2(len(tok), n_layer=1, n_embd=16, n_head=2, seed=0).eval()
    cache = tmp_path / "cache"
    as_text = score_pairs(model, tok, [pair], cache=True, cache_dir=cache)
    as_tokens = score_pairs(model, tok, [pair], policy=ScoringPolicy(special_text="tokens"), cache=True, cache_dir=cache)
    assert not as_tokens.cache_hit and as_text.per_example["n_tokens"].item() == len(e.target_ids)
    assert as_tokens.per_example["n_tokens"].item() == len(parsed.target_ids)
    score_pairs(model, tok, [plain], cache=True, cache_dir=cache)  # no special text: one entry serves both
    assert score_pairs(model, tok, [plain], policy=ScoringPolicy(special_text="tokens"), cache=True,
                       cache_dir=cache).cache_hit
