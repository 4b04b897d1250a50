"""The given latent values of the z-free control and the label oracles (``ModelConfig.latent_source``):
row id -> value index, read from the run's data folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from zfree.config import LatentSource, TrainConfig
from zfree.core.errors import ConfigError
from zfree.data.labels import LABEL_VALUE_CAP, capped_values, label_value, label_values, value_index
from zfree.data.pairs import Pair


def given_index(cfg: TrainConfig, pairs: dict[str, list[Pair]], data_dir: Path) -> dict[str, int]:
    """Row id -> the given value for every row of ``pairs`` (``{"train": ..., "val": ...}``, the rows
    of ``data_dir``, which the messages name): 0 for the control and the text oracle (its label is in x,
    not in z);
    under ``label:<key>`` the index of the row's value among the label's sorted values over
    train.jsonl + val.jsonl (``zfree.data.labels.label_values``; a label of more than
    ``LABEL_VALUE_CAP`` values: its most frequent ones and the rest pooled, ``capped_values``). Raises ValueError naming the file
    and row for a row without the label; ConfigError when ``n_latent`` is not the label's number of
    values."""
    rows = pairs["train"] + pairs["val"]
    source = LatentSource.parse(cfg.model.latent_source)
    if source.z_free:
        return {p.id: 0 for p in rows}
    key = source.label
    for split, ps in pairs.items():
        label_values(ps, key, source=str(Path(data_dir) / f"{split}.jsonl"))
    values, n_all = capped_values(rows, key)
    if cfg.model.n_latent != len(values):
        raise ConfigError(f"n_latent={cfg.model.n_latent} but label {key!r} takes {len(values)} values in "
                          f"{data_dir}/train.jsonl + val.jsonl"
                          + (f" (its {LABEL_VALUE_CAP - 1} most frequent of {n_all} and the rest pooled)"
                             if n_all > len(values) else "") + f": set n_latent={len(values)}")
    index = value_index(values)
    given = {p.id: index(label_value(p, key)) for p in rows}
    if source.kind == "null":  # another row's value: a seeded permutation over train + val (the run's seed)
        ids = list(given)
        shuffled = np.random.default_rng(cfg.optim.seed).permutation(len(ids))
        given = {i: given[ids[j]] for i, j in zip(ids, shuffled)}
    return given
