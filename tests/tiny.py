"""Tiny fixtures for tests, each seconds to build (the real loading path via save_pretrained):

* ``make_tiny_run``: a tiny benchmark + base run (data_dir, base_dir); the session fixture
  ``tiny_run`` (tests/conftest.py) builds it once per session, shared with ``tests/tiny_sweep``.
* ``PAIRS`` / ``SHORT_PAIRS`` and ``tiny_gpt2``: a small list of digit pairs and a tiny random GPT-2
  with its digit tokenizer; the session fixture ``tiny_lm`` builds each variant once.
* ``tiny_flat``: the flat TrainConfig of a few-step CVAE run on the tiny base run.
* ``poison_loss_at``: a training step whose loss (and its KL term) is NaN, for the non-finite checks.
"""

from __future__ import annotations

from pathlib import Path

from zfree.config import BaseTrainConfig, TrainConfig
from zfree.data.pairs import Pair
from zfree.data.synth import DataConfig, write_benchmark
from zfree_lab.run.base_training import train_base

TINY_DATA = DataConfig(n_min=3, n_max=6, n_train=400, n_val=48, n_test=16, seed=3)
TINY_BASE = BaseTrainConfig(n_layer=1, n_embd=32, n_head=2, max_steps=40, eval_every=40, warmup_steps=5, lr=3e-3)

#: four pairs of the digit tokenizer: ragged lengths, an empty x, a y equal to its x
PAIRS = [Pair("a", "1 2 3", "3 2 1"), Pair("b", "4 5 6 7 8 9 0", "0 9 8 7 6 5 4"), Pair("c", "", "1"),
         Pair("d", "7 7", "7 7")]
#: four shorter pairs (no empty x)
SHORT_PAIRS = [Pair("a", "1 2 3", "3 2 1"), Pair("b", "4 5 6 7", "7 6 5 4"), Pair("c", "2", "2"), Pair("d", "7 7", "7 7")]

#: the flat defaults of TrainConfig (what a key left out of ``tiny_flat`` would be)
TRAIN_DEFAULTS = TrainConfig().to_flat()
#: the few-step run of ``tiny_flat``
TINY_FLAT = {"steps": 4, "batch_size": 8, "eval_every": 2, "eval_rows": 24, "decode_rows": 8, "warmup_backbone": 2}


def make_tiny_run(root: Path) -> tuple[Path, Path]:
    """Returns (data_dir, base_dir) under ``root`` (the base run trained only if absent)."""
    data = write_benchmark(TINY_DATA, root / "data")
    base = root / "base"
    if not (base / "reference" / "reference.json").exists():
        train_base(data, base, TINY_BASE, threads=1, progress=False)
    return data, base


def tiny_flat(data: Path | str, base: Path | str, **overrides) -> dict:
    """``TrainConfig().to_flat()`` with data_dir, base_dir, ``TINY_FLAT`` and then ``overrides``
    (e.g. ``steps=6, eval_every=3, device="cpu"``); a fresh dict each call."""
    return {**TrainConfig().to_flat(), "data_dir": str(data), "base_dir": str(base), **TINY_FLAT, **overrides}


def tiny_gpt2(*, n_layer: int = 2, seed: int = 1, folder: Path | None = None):
    """``(model, tokenizer)``: ``build_synthetic_gpt2`` (n_embd 32, 2 heads, dropout 0) on the digit
    tokenizer of 10 digits. With ``folder``: both saved there with save_pretrained and loaded back
    with ``load_base`` (the real loading path); without: the built model in eval mode."""
    from zfree_lab.run.tokenizer import build_digit_tokenizer
    from zfree.models.base import build_synthetic_gpt2, load_base

    tok = build_digit_tokenizer(10)
    model = build_synthetic_gpt2(len(tok), n_layer=n_layer, n_embd=32, n_head=2, seed=seed)
    if folder is None:
        return model.eval(), tok
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return load_base(folder)


def pairs_batch(tok, pairs=PAIRS):
    """The padded ``Batch`` of ``pairs`` (right padding with the tokenizer's pad id)."""
    from zfree.data.batching import collate, encode_pair

    return collate([encode_pair(tok, p) for p in pairs], pad_id=tok.pad_token_id)


def poison_loss_at(monkeypatch, step: int) -> None:
    """Make the loss of training step ``step`` NaN, its total and its ``kl_prior_loss`` term, through
    ``zfree.objective.objectives.assemble`` (the one assembler every training step calls, issue 12)."""
    import zfree.objective.objectives as objectives

    real = objectives.assemble

    def poisoned(*a, **kw):
        br = real(*a, **kw)
        if kw.get("step") == step:
            br.total = br.total * float("nan")
            br.terms["kl_prior_loss"] = br.terms["kl_prior_loss"] * float("nan")
        return br

    monkeypatch.setattr(objectives, "assemble", poisoned)
