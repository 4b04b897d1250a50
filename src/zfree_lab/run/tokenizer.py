"""Word-level tokenizer for the synthetic benchmark, built with ``tokenizers``.

Saved beside the base model, it loads as a user's tokenizer does (``AutoTokenizer.from_pretrained``).
``add_special_tokens=True`` prepends ``<bos>``, the convention the shipped base was trained with, so
zfree's default ``bos="auto"`` puts exactly one ``<bos>`` in front of x.
"""

from __future__ import annotations

from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

SPECIAL = {"pad_token": "<pad>", "bos_token": "<bos>", "sep_token": "<sep>", "eos_token": "<eos>", "unk_token": "<unk>"}


def build_digit_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A whitespace word-level tokenizer over the symbols "0".."V-1" plus pad/bos/sep/eos/unk that
    prepends ``<bos>`` when asked for special tokens (``add_special_tokens=True``).

    Special-token ids are 0..4 in the order pad, bos, sep, eos, unk; digit d has id 5 + d.
    Raises ValueError if vocab_size < 1.
    """
    if vocab_size < 1:
        raise ValueError(f"vocab_size={vocab_size} must be >= 1")
    vocab = {tok: i for i, tok in enumerate(SPECIAL.values())}
    for d in range(vocab_size):
        vocab[str(d)] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    bos = SPECIAL["bos_token"]
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B",
                                                       special_tokens=[(bos, vocab[bos])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=1024, **SPECIAL)
