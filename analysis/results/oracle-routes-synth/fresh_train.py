"""A data folder for the oracle check on fresh training rows (issue 55; README, "on fresh training rows").

    .venv/bin/python analysis/results/oracle-routes-synth/fresh_train.py DIR

writes DIR/train.jsonl: rows 50,000-179,999 of the shipped benchmark's seed-0 training stream
(``zfree.data.synth.generate_split(DataConfig(), "train", 180_000)[50_000:]``: the same generator and prior,
none of them among the 50,000 shipped training rows the base was first trained on; 130,000 rows), the shipped
val.jsonl and test.jsonl unchanged (so the base's stored reference still matches its validation rows), and
metadata.json (the benchmark's parameters with n_train 130000 and each file's sha256). A z-free control
fine-tuned on the shipped split drifts above its base after ~1800 steps (it memorises the split). Batches are
drawn with replacement (``rng.integers``), so 1800 steps of 64 (115,200 draws) read each row 0.89 times on
average: about 59 % of these rows at least once, and about a third of the draws repeat a row already read,
against each shipped row read 2.3 times on average over the same steps.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from zfree.core.io import atomic_write_json, atomic_write_text, sha256_file
from zfree.core.paths import ROOT
from zfree.data.synth import DataConfig, generate_split

SHIPPED = ROOT / "data" / "synth" / "default"
SKIP, FRESH = 50_000, 130_000


def write(out: Path) -> Path:
    """DIR as the module docstring says; FileExistsError (nothing written) where DIR already has a train.jsonl."""
    out.mkdir(parents=True, exist_ok=True)
    if (out / "train.jsonl").exists():
        raise FileExistsError(f"{out / 'train.jsonl'} exists; choose an empty folder")
    rows = generate_split(DataConfig(), "train", SKIP + FRESH)[SKIP:]
    atomic_write_text(out / "train.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    for split in ("val", "test"):
        shutil.copyfile(SHIPPED / f"{split}.jsonl", out / f"{split}.jsonl")
    meta = json.loads((SHIPPED / "metadata.json").read_text())
    meta["parameters"]["n_train"] = FRESH
    meta["sha256"] = {s: sha256_file(out / f"{s}.jsonl") for s in ("train", "val", "test")}
    meta["note"] = f"train: rows {SKIP}-{SKIP + FRESH - 1} of the seed-0 train stream (fresh to the shipped base)"
    atomic_write_json(out / "metadata.json", meta)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: fresh_train.py DIR")
    print(write(Path(sys.argv[1])))
