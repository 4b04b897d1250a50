"""Tiny benchmark + base run for tests (seconds to build; the real loading path via save_pretrained)."""

from __future__ import annotations

from pathlib import Path

from zfree.train.base_training import train_base
from zfree.config import BaseTrainConfig, DataConfig
from zfree.data.synth import write_benchmark

TINY_DATA = DataConfig(n_min=3, n_max=6, n_train=400, n_val=48, n_test=16, seed=3)
TINY_BASE = BaseTrainConfig(n_layer=1, n_embd=32, n_head=2, max_steps=40, eval_every=40, warmup_steps=5, lr=3e-3)


def make_tiny_run(root: Path) -> tuple[Path, Path]:
    """Returns (data_dir, base_dir) under ``root``."""
    data = write_benchmark(TINY_DATA, root / "data")
    base = root / "base"
    if not (base / "reference" / "reference.json").exists():
        train_base(data, base, TINY_BASE, threads=1, progress=False)
    return data, base
