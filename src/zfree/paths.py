"""Where zfree's shipped files live, and the file names it relies on (defined once)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository root (an editable install)
NOTEBOOKS = ROOT / "notebooks"
SPECS = ROOT / "analysis" / "sweeps"
SHIPPED_DATA = ROOT / "data" / "synth" / "default"
SHIPPED_BASE = ROOT / "data" / "base" / "default"
SHIPPED_E2E = ROOT / "data" / "e2e"  # the E2E real-text benchmark (CC BY-SA 4.0) and its base in base/

#: a model folder holds a tokenizer when it has one of these files (transformers 5 would invent an empty one)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "tokenizer.model",
                   "spiece.model", "merges.txt")
