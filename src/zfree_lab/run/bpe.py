"""A small byte-level BPE tokenizer for English text (a base model trained from scratch on E2E).

Byte-level: no text is out of vocabulary and decoding restores it exactly. As the synthetic
benchmark's tokenizer, it prepends ``<bos>`` when asked for special tokens, and its special tokens
have ids 0..4 (pad, bos, sep, eos, unk); it loads with ``AutoTokenizer.from_pretrained``.
"""

from __future__ import annotations

from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from zfree_lab.run.tokenizer import SPECIAL


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int = 1500, model_max_length: int = 1024
                        ) -> PreTrainedTokenizerFast:
    """Byte-level BPE (GPT-2 pre-tokenization, no prefix space) with ``vocab_size`` entries in all:
    the 5 special tokens, the 256 byte symbols and the merges learnt from ``texts``; encoding with
    ``add_special_tokens=True`` prepends ``<bos>``.

    Raises ValueError if vocab_size < 5 + 256 + 1.
    """
    if vocab_size < len(SPECIAL) + 257:
        raise ValueError(f"vocab_size={vocab_size} must be >= {len(SPECIAL) + 257} (specials + 256 bytes + 1 merge)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL.values()),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    bos = SPECIAL["bos_token"]  # the convention zfree's bases train with, declared by the tokenizer itself
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B",
                                                       special_tokens=[(bos, tok.token_to_id(bos))])
    return PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=model_max_length, **SPECIAL)
