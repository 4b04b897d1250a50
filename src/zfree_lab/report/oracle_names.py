"""How the report names label oracles where a label has several (one per seed, injection route or arm):
``with_oracle_seeds`` reads each oracle run's fields, ``oracle_names`` joins them as runs are named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from zfree_lab.run.run_config import read_run_config


def with_oracle_seeds(oracles: pd.DataFrame, study_dir: Path | str) -> pd.DataFrame:
    """``oracles`` with a ``seed`` column (each oracle run's config.json seed; NaN where unreadable) and its
    ``injection`` and ``latent_capacity`` when a label has several oracles (one per seed, route or arm), so the
    report can tell them apart (``oracle_names``); as it is otherwise. Display columns: available_gain.csv is not
    changed."""
    if "oracle_run_id" not in oracles or "seed" in oracles or not oracles["label"].duplicated().any():
        return oracles

    def config(rid) -> dict:
        try:
            return read_run_config(Path(study_dir) / "runs" / str(rid) / "config.json")
        except (OSError, ValueError, KeyError, TypeError):
            return {}

    def seed(cfg: dict) -> float:
        try:
            return float(cfg["seed"])
        except (KeyError, TypeError, ValueError):
            return np.nan

    configs = [config(r) for r in oracles["oracle_run_id"]]
    return oracles.assign(seed=[seed(c) for c in configs], injection=[c.get("injection", "embedding") for c in configs],
                          latent_capacity=[c.get("latent_capacity", "per_value") for c in configs])


def oracle_names(oracles: pd.DataFrame) -> list[str]:
    """Each oracle's name in the report's tables, figures and lines: its label, followed, where the label has
    several oracles and ``oracles`` has their fields (``with_oracle_seeds``), by its injection route and
    ``latent_capacity`` when not their defaults (as ``zfree_lab.report.report.run_label`` names runs) and by its
    seed: three `complete` oracles of a 3-seed study read "complete, seed 0" ... (they read "complete" three
    times); an `n_sentences` oracle on the memory route "n_sentences, memory route, shared_delta, seed 1"."""
    labels = oracles["label"].astype(str)
    dup = labels.duplicated(keep=False)
    nan = pd.Series(np.nan, index=oracles.index)
    seeds, routes, capacity = (oracles[c] if c in oracles else nan for c in ("seed", "injection", "latent_capacity"))
    names = []
    for lab, d, s, r, c in zip(labels, dup, seeds, routes, capacity):
        parts = [lab]
        if d and isinstance(r, str) and r != "embedding":
            parts.append(f"{r} route")
        if d and c == "shared_delta":
            parts.append("shared_delta")
        if d and pd.notna(s):
            parts.append(f"seed {int(s)}")
        names.append(", ".join(parts))
    return names
