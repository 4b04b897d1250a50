"""The z-free reference: per-example b, per-token surprisal, c_base, and its artifacts.

c_base = mean of b over validation rows (> 0), nats per token (seed 000). Two estimators:
  entangled_run      load c_base and b from the base run's ``reference/`` artifacts;
  pretrained_source  score the current validation rows with the source model now.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from zfree.data.pairs import load_pairs
from zfree.io import atomic_write_json, atomic_write_parquet, read_json, sha256_file, sha256_state_dict
from zfree.models.base import load_base
from zfree.scoring import score_pairs
from zfree.theory import analytic_c_base


@dataclass
class Reference:
    c_base: float  # nats per token
    per_example: pd.DataFrame  # id, b, n_tokens, sequence_nll
    meta: dict

    def b_of(self, ids) -> list[float]:
        m = dict(zip(self.per_example["id"], self.per_example["b"]))
        missing = [i for i in ids if i not in m]
        if missing:
            raise KeyError(f"reference has no b for rows {missing[:5]}{'...' if len(missing) > 5 else ''}")
        return [m[i] for i in ids]


def build_reference(base_dir: Path | str, data_dir: Path | str, split: str = "val") -> Reference:
    """Score the ``split`` rows with the base model in ``base_dir/model`` and write ``base_dir/reference/``:
    per_example.parquet, per_token.parquet and reference.json (c_base, c_base_analytic when the
    rows carry the generator's Bayes loss, model and data hashes)."""
    base_dir, data_dir = Path(base_dir), Path(data_dir)
    data_file = data_dir / f"{split}.jsonl"
    pairs = load_pairs(data_file)
    model, tok = load_base(base_dir / "model")
    res = score_pairs(model, tok, pairs, progress=True)
    ref_dir = base_dir / "reference"
    atomic_write_parquet(ref_dir / "per_example.parquet", res.per_example)
    atomic_write_parquet(ref_dir / "per_token.parquet", res.per_token)
    meta = {
        "c_base": res.c_base,
        "c_base_analytic": analytic_c_base(pairs) if all(p.bayes_nll is not None for p in pairs) else None,
        "n_rows": len(pairs),
        "split": split,
        "data_file": str(data_file),
        "data_sha256": sha256_file(data_file),
        "model_sha256": sha256_state_dict(model.state_dict()),
        "units": "nats per token (masked mean over y tokens and the end token)",
        "estimator": "entangled_run",
    }
    atomic_write_json(ref_dir / "reference.json", meta)
    return Reference(res.c_base, res.per_example, meta)


def load_reference(base_dir: Path | str) -> Reference:
    """Entangled-run estimator: load c_base and b from ``base_dir/reference``.

    Raises FileNotFoundError naming the missing file, ValueError if c_base is missing, non-finite
    or not positive.
    """
    ref_dir = Path(base_dir) / "reference"
    path = ref_dir / "reference.json"
    if not path.exists():
        raise FileNotFoundError(f"base run {base_dir} has no reference: {path} is missing "
                                f"(build it with `zfree base reference --base {base_dir} --data DATA_DIR`)")
    meta = read_json(path)
    c = meta.get("c_base")
    if not isinstance(c, (int, float)) or not math.isfinite(c) or c <= 0:
        raise ValueError(f"{path}: c_base={c!r} must be a finite positive number")
    pe_path = ref_dir / "per_example.parquet"
    if not pe_path.exists():
        raise FileNotFoundError(f"base run {base_dir}: {pe_path} is missing")
    return Reference(float(c), pd.read_parquet(pe_path), meta)
