"""Split one JSONL file of pairs into train/val *by x*, and check a given val file against train.

Many y per x is the normal case for real data (E2E: ~7.5 references per MR), so a row-level split
would put the same x on both sides and let the validation loss reward memorised inputs. Here every
x goes wholly to one side.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np

from zfree.data.pairs import Pair
from zfree.core.io import atomic_write_text


def split_by_x(pairs: Sequence[Pair], *, val_fraction: float | None = None, val_size: int | None = None,
               seed: int = 0, source: Path | str = "<pairs>") -> tuple[list[Pair], list[Pair]]:
    """Split ``pairs`` into ``(train, val)`` with no x on both sides; every row is kept, in input order.

    The distinct x are shuffled with ``numpy.random.default_rng(seed)`` (deterministic) and moved
    to val, whole, until val holds at least ``val_size`` rows (or ``ceil(val_fraction * n_rows)``);
    val may exceed the target by less than the largest group of one x. Give exactly one of
    ``val_fraction`` (in (0, 1)) and ``val_size`` (>= 1 rows).

    Raises ValueError naming ``source`` when neither or both are given, a value is out of range,
    there are fewer than 2 distinct x, or the target would leave no x for train.
    """
    if (val_fraction is None) == (val_size is None):
        raise ValueError(f"{source}: give exactly one of val_fraction and val_size")
    n = len(pairs)
    if val_fraction is not None:
        if not 0 < val_fraction < 1:
            raise ValueError(f"{source}: val_fraction={val_fraction} must lie in (0, 1)")
        target = int(np.ceil(val_fraction * n))
    else:
        if val_size < 1:
            raise ValueError(f"{source}: val_size={val_size} must be >= 1 rows")
        target = int(val_size)
    xs = list(dict.fromkeys(p.x for p in pairs))  # distinct x, first-seen order
    counts: dict[str, int] = {}
    for p in pairs:
        counts[p.x] = counts.get(p.x, 0) + 1
    if len(xs) < 2:
        raise ValueError(f"{source}: {n} rows over {len(xs)} distinct x; a split by x needs at least 2")
    val_x: set[str] = set()
    got = 0
    for i in np.random.default_rng(seed).permutation(len(xs)):
        if got >= target:
            break
        val_x.add(xs[i])
        got += counts[xs[i]]
    if len(val_x) == len(xs):
        raise ValueError(f"{source}: too small for a validation set of {target} rows: {n} rows over {len(xs)} "
                         f"distinct x leave no x for train; ask for a smaller validation size")
    return [p for p in pairs if p.x not in val_x], [p for p in pairs if p.x in val_x]


def shared_x_count(train: Sequence[Pair], val: Sequence[Pair], *, val_source: Path | str = "<val>") -> int:
    """Number of distinct x present in both ``train`` and ``val``; warns (UserWarning naming
    ``val_source`` and the count) when it is not 0. A given val file is used as it is."""
    train_x = {p.x for p in train}
    shared = len(train_x & {p.x for p in val})
    if shared:
        n_rows = sum(p.x in train_x for p in val)
        warnings.warn(f"{val_source}: {shared} distinct x ({n_rows} val rows) also occur in the train data; "
                      f"the validation loss then partly measures memorised inputs", stacklevel=2)
    return shared


def pair_row(p: Pair) -> dict:
    """The JSONL row of a pair (optional fields only when set), as ``load_pairs`` reads it back."""
    row = {"id": p.id, "x": p.x, "y": p.y}
    for key in ("strategy", "bayes_nll", "n_consistent", "labels"):
        if getattr(p, key) is not None:
            row[key] = getattr(p, key)
    return row


def write_pairs(pairs: Sequence[Pair], path: Path | str) -> Path:
    """Write ``pairs`` as JSONL (UTF-8, one row per line), atomically."""
    return atomic_write_text(path, "".join(json.dumps(pair_row(p), ensure_ascii=False) + "\n" for p in pairs))


#: the seed of every study's evaluation sample (one sample per data set, whatever a run's own seed)
EVAL_SAMPLE_SEED = 0


def spread_sample(pairs: Sequence[Pair], n: int, *, seed: int = EVAL_SAMPLE_SEED) -> list[Pair]:
    """A fixed, seeded sample of ``n`` rows spread over all x (stratified by x), in sampled order.

    The distinct x are put in a random order and their rows shuffled within each x
    (``numpy.random.default_rng(seed)``); rows are then taken round-robin — one row of every x,
    then a second row of every x that has one, ... — so the first k rows of the sample cover
    min(k, #x) distinct x, and any prefix of it (the decoded rows, the hand-over gate's rows) is
    spread too. ``n`` = 0 or ``n`` >= len(pairs): every row, in that order. The same rows and order
    for every run that reads the same file (the seed does not depend on the run). Replaces the
    first-in-file rows, which on E2E held 40 of 543 MRs and on a TruthfulQA file one label value
    (issue "Real data, true numbers", item 4). Raises ValueError for ``n`` < 0.
    """
    if n < 0:
        raise ValueError(f"eval_rows={n} must be >= 0")
    rng = np.random.default_rng(seed)
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(pairs):
        groups.setdefault(p.x, []).append(i)
    order = [groups[x] for x in groups]
    order = [order[j] for j in rng.permutation(len(order))]
    order = [[g[j] for j in rng.permutation(len(g))] for g in order]
    picked: list[int] = []
    depth = 0
    total = len(pairs) if n == 0 else min(n, len(pairs))
    while len(picked) < total:
        picked.extend(g[depth] for g in order if depth < len(g))
        depth += 1
    return [pairs[i] for i in picked[:total]]
