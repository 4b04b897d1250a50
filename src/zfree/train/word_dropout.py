"""Word dropout on the decoder input, a training-loop plug-in (``zfree.train.plugins``).

Bowman et al. 2016, "Generating Sentences from a Continuous Space" (CoNLL), sec. 3.2 ("Word dropout
and historyless decoding"): in training, a fraction of the word tokens the decoder is conditioned on
is replaced by the generic unknown-word token, so the decoder cannot predict every next word from its
history alone and has to rely on z. They parameterize it by a keep rate k (historyless decoding at
k = 0) and sweep k; ``word_dropout`` here is 1 - k, the probability that one token is replaced.

What is dropped here: each y token as the decoder reads it (the input at the positions that predict
y_1 .. the end token); the prefix (x and the separator, which predicts y_0) is the condition, not the
sentence, and stays. The targets, the posterior's view of y (the z-free pass), the reference b and
every evaluation read the clean tokens. The replacement is the tokenizer's ``unk_token_id``, else
its pad id (GPT-2 and Llama-style byte-level BPEs define an unknown token that never occurs in text).

Which tokens drop is a function of (seed, step, the row's place in the step's batch) alone, so a
resumed run and a run under gradient accumulation (``micro_batch``) drop the same tokens as an
uninterrupted, unchunked one.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from zfree.data.batching import EncodedPair
from zfree.objective.plugin_api import Plugin, StepContext


def replacement_id(tokenizer, pad_id: int) -> int:
    """The token a dropped word becomes: the tokenizer's ``unk_token_id``, else ``pad_id``."""
    unk = getattr(tokenizer, "unk_token_id", None)
    return int(unk) if unk is not None else int(pad_id)


def drop_words(rows: Sequence[EncodedPair], p: float, replace_id: int, seed: int, step: int) -> list[EncodedPair]:
    """``rows`` with ``y_input_ids`` set: each y token but the last of a row (the end token as an
    input predicts nothing) replaced by ``replace_id`` with probability ``p``, independently, the
    draws of row i from ``numpy.random.default_rng((seed, step, i))``. ``p`` = 0: the rows unchanged."""
    if p <= 0:
        return list(rows)
    out = []
    for i, e in enumerate(rows):
        y = np.asarray(e.target_ids, dtype=np.int64)
        drop = np.random.default_rng((int(seed), int(step), i)).random(len(y)) < p
        drop[-1] = False
        out.append(dataclasses.replace(e, y_input_ids=tuple(int(t) for t in np.where(drop, replace_id, y))))
    return out


class WordDropout(Plugin):
    """The plug-in: ``rows`` replaces the step's rows by ``drop_words``' (config ``word_dropout`` > 0);
    the summary records the rate."""

    name, fields = "word_dropout", ("word_dropout",)
    source = "Bowman et al. 2016, Generating Sentences from a Continuous Space, sec. 3.2"

    def active(self, cfg):
        """On when ``word_dropout`` > 0."""
        return cfg.aid.word_dropout > 0

    def rows(self, ctx: StepContext, rows: list) -> list:
        """The step's ``EncodedPair`` rows with ``y_input_ids`` set by ``drop_words`` at rate
        ``word_dropout``, seeded by (``seed``, ``ctx.step``, row index); the replacement token from
        ``replacement_id``. Targets unchanged."""
        data = ctx.run.data
        return drop_words(rows, ctx.cfg.aid.word_dropout, replacement_id(data.tokenizer, data.pad_id),
                          ctx.cfg.optim.seed, ctx.step)

    def summary(self, cfg, state):
        """``{"aid/word_dropout": p}``, the drop probability of one y input token."""
        return {"aid/word_dropout": cfg.aid.word_dropout}
