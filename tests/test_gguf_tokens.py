"""A GGUF source's special tokens come from the file's metadata (``zfree.models.loading.align_gguf_special_tokens``):
transformers 5.17's GGUF conversion gave SmolLM2-135M-Instruct eos ``<|im_start|>`` (id 1) where the file says
``<|im_end|>`` (id 2), which moved c_base from 2.966 to 3.191 nats/token on the same rows (issue 37, the GPU run)."""

from __future__ import annotations

import gguf
import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

from zfree.models.loading import align_gguf_special_tokens, gguf_special_token_ids

VOCAB = {"<unk>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "a": 3, "b": 4}


def _gguf(path, **ids):
    w = gguf.GGUFWriter(str(path), "llama")
    for attr, v in ids.items():
        w.add_uint32(f"tokenizer.ggml.{attr}", v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _tok(eos):
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(VOCAB, unk_token="<unk>")), eos_token=eos,
                                   unk_token="<unk>")


def test_the_files_eos_replaces_a_wrongly_converted_one(tmp_path):
    f = _gguf(tmp_path / "m.gguf", bos_token_id=1, eos_token_id=2, padding_token_id=2)
    assert gguf_special_token_ids(f) == {"bos_token": 1, "eos_token": 2, "pad_token": 2}
    tok = _tok("<|im_start|>")  # what transformers 5.17 made of SmolLM2's file
    assert tok.eos_token_id == 1 and tok.pad_token_id is None
    lines = []
    changes = align_gguf_special_tokens(tok, f, log=lines.append)
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token_id, tok.bos_token_id) == ("<|im_end|>", 2, 2, 1)
    assert len(changes) == 3 and lines == [f"note: {c}" for c in changes]
    assert "eos_token set to '<|im_end|>' (id 2" in "\n".join(changes)


def test_a_tokenizer_that_agrees_is_left_alone(tmp_path):
    f = _gguf(tmp_path / "m.gguf", eos_token_id=2)
    tok = _tok("<|im_end|>")
    assert align_gguf_special_tokens(tok, f, log=pytest.fail) == [] and tok.eos_token_id == 2


def test_an_id_outside_the_vocabulary_is_named_and_left(tmp_path):
    f = _gguf(tmp_path / "m.gguf", eos_token_id=99)
    tok = _tok("<|im_end|>")
    changes = align_gguf_special_tokens(tok, f, log=lambda s: None)
    assert tok.eos_token_id == 2 and changes == ["m.gguf: eos_token id 99 is outside the vocabulary (5); left as is"]
