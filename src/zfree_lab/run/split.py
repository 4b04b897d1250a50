"""Split one JSONL file of pairs into train/val *by x* (or by row when x cannot carry a split), and
check a given val file against train.

Real data has many y per x (E2E: ~7.5 references per MR): a row-level split would put the same x on
both sides and reward memorised inputs, so every x goes wholly to one side (``split_by_x``).
Unconditional text (one x in every row, ``is_unconditional``) drops x (y is scored after the
beginning token alone, as in Bowman et al.'s sentence VAE and Optimus) and is split by row, no y on
both sides (``split_by_row``); so is conditional data with fewer than ``MIN_X_PER_SIDE`` x per side,
with a note (``split_pairs``).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Hashable, Literal, Sequence

import numpy as np

from zfree.data.pairs import Pair
from zfree.core.io import atomic_write_text

#: distinct x a split by x must leave on each side (``split_pairs``); fewer: split by row, with a note
MIN_X_PER_SIDE = 3


def _target_rows(n: int, val_fraction: float | None, val_size: int | None, source) -> int:
    """Validation rows asked for: ``val_size``, or ``ceil(val_fraction * n)``; ValueError naming
    ``source`` unless exactly one is given and in range."""
    if (val_fraction is None) == (val_size is None):
        raise ValueError(f"{source}: give exactly one of val_fraction and val_size")
    if val_fraction is not None:
        if not 0 < val_fraction < 1:
            raise ValueError(f"{source}: val_fraction={val_fraction} must lie in (0, 1)")
        return int(np.ceil(val_fraction * n))
    if val_size < 1:
        raise ValueError(f"{source}: val_size={val_size} must be >= 1 rows")
    return int(val_size)


def _val_groups(pairs: Sequence[Pair], key: Callable[[Pair], Hashable], target: int, seed: int
                ) -> tuple[list, set]:
    """``(groups, val_groups)``: the distinct keys in first-seen order and the ones moved, whole, to
    val: the keys shuffled by ``numpy.random.default_rng(seed)`` and taken until val holds >= ``target`` rows."""
    counts = Counter(key(p) for p in pairs)  # first-seen order
    groups = list(counts)
    val: set = set()
    got = 0
    for i in np.random.default_rng(seed).permutation(len(groups)):
        if got >= target:
            break
        val.add(groups[i])
        got += counts[groups[i]]
    return groups, val


def split_by_x(pairs: Sequence[Pair], *, val_fraction: float | None = None, val_size: int | None = None,
               seed: int = 0, source: Path | str = "<pairs>") -> tuple[list[Pair], list[Pair]]:
    """Split ``pairs`` into ``(train, val)`` with no x on both sides; every row kept, in input order.

    The distinct x, shuffled by ``numpy.random.default_rng(seed)``, move to val whole until it holds at
    least ``val_size`` rows (or ``ceil(val_fraction * n_rows)``). Give exactly one of ``val_fraction``
    (in (0, 1)) and ``val_size`` (>= 1). Raises ValueError naming ``source`` when neither or both are
    given, a value is out of range, there are fewer than 2 distinct x, or no x would be left for train.
    """
    n = len(pairs)
    target = _target_rows(n, val_fraction, val_size, source)
    xs, val_x = _val_groups(pairs, lambda p: p.x, target, seed)
    if len(xs) < 2:
        raise ValueError(f"{source}: {n} rows over {len(xs)} distinct x; a split by x needs at least 2")
    if len(val_x) == len(xs):
        raise ValueError(f"{source}: too small for a validation set of {target} rows: {n} rows over {len(xs)} "
                         f"distinct x leave no x for train; ask for a smaller validation size")
    return [p for p in pairs if p.x not in val_x], [p for p in pairs if p.x in val_x]


def split_by_row(pairs: Sequence[Pair], *, val_fraction: float | None = None, val_size: int | None = None,
                 seed: int = 0, source: Path | str = "<pairs>") -> tuple[list[Pair], list[Pair]]:
    """Split ``pairs`` into ``(train, val)`` by row: rows repeating an (x, y) move together, so no (x, y)
    is on both sides. Arguments, determinism and errors as ``split_by_x``, with the distinct (x, y) in
    place of the distinct x.
    """
    n = len(pairs)
    target = _target_rows(n, val_fraction, val_size, source)
    keys, val_keys = _val_groups(pairs, lambda p: (p.x, p.y), target, seed)
    if len(keys) < 2 or len(val_keys) == len(keys):
        raise ValueError(f"{source}: too small for a validation set of {target} rows: {n} rows hold {len(keys)} "
                         f"distinct (x, y); a split by row needs one for val and one for train")
    return [p for p in pairs if (p.x, p.y) not in val_keys], [p for p in pairs if (p.x, p.y) in val_keys]


def is_unconditional(pairs: Sequence[Pair]) -> bool:
    """True when every row has the same x (empty, absent or one constant prompt): unconditional text."""
    return len({p.x for p in pairs}) == 1


def without_x(pairs: Sequence[Pair]) -> list[Pair]:
    """``pairs`` with x set to ``""`` (the unconditional setting: y scored after the beginning token alone)."""
    return [p if p.x == "" else replace(p, x="") for p in pairs]


def unconditional_note(pairs: Sequence[Pair], what: str) -> str:
    """The note of unconditional ``pairs`` before ``without_x``: what x was and that it was dropped.
    ``what``: the rows' description (``"all 1664 rows"``)."""
    x = pairs[0].x
    given = "empty or absent" if x == "" else f"one constant prompt {x if len(x) <= 60 else x[:57] + '...'!r}"
    return (f"unconditional: x is {given} in {what}{'' if x == '' else ' (dropped)'}, so the study models y alone: "
            "p(y | z) warm-started from the LM's p(y), c_base being the LM's loss on y after its beginning token")


@dataclass(frozen=True)
class Split:
    """A train/val split (lists of ``Pair`` in input order) and how it was made. ``by``: ``"x"``,
    ``"row"`` or ``"given"`` (a val file used as it is); ``unconditional``: the one x was dropped;
    ``notes``: one line per decision a reader must know."""

    train: list[Pair]
    val: list[Pair]
    by: Literal["x", "row", "given"]
    unconditional: bool = False
    notes: tuple[str, ...] = ()
    shared_x: int = 0  # distinct x in both train and a given val file (``shared_x_count``); 0 for a split


def split_pairs(pairs: Sequence[Pair], *, val_size: int, seed: int = 0, source: Path | str = "<pairs>") -> Split:
    """Split one file's ``pairs`` into train/val of ``val_size`` rows (>= 1): unconditional rows
    without x and by row; conditional rows by x, or by row with a note when a split by x would leave
    fewer than ``MIN_X_PER_SIDE`` x on a side. Deterministic given ``seed``. Raises ValueError naming
    ``source`` for ``val_size`` < 1 or rows too few for a split by row.
    """
    n = len(pairs)
    if is_unconditional(pairs):
        train, val = split_by_row(without_x(pairs), val_size=val_size, seed=seed, source=source)
        repeats = n - len({p.y for p in pairs})
        how = (f"split by row (seeded; the {repeats} rows that repeat a y kept with it, so no y is on both sides)"
               if repeats else "split by row (seeded; every y distinct)")
        return Split(train, val, "row", True, (f"{unconditional_note(pairs, f'all {n} rows')}; {how}",))
    target = _target_rows(n, None, val_size, source)
    xs, val_x = _val_groups(pairs, lambda p: p.x, target, seed)
    if min(len(val_x), len(xs) - len(val_x)) >= MIN_X_PER_SIDE:  # split_by_x's split, unchanged
        return Split(*split_by_x(pairs, val_size=val_size, seed=seed, source=source), "x")
    train, val = split_by_row(pairs, val_size=val_size, seed=seed, source=source)
    shared = len({p.x for p in train} & {p.x for p in val})
    why = ("would leave no x for train" if len(val_x) == len(xs) else
           f"would hold {len(val_x)} distinct x and train {len(xs) - len(val_x)}, and each side needs at least "
           f"{MIN_X_PER_SIDE}")
    note = (f"{source}: {n} rows over {len(xs)} distinct x, too few for a split by x (a validation set of "
            f"{val_size} rows {why}); split by row instead (seeded): {shared} x on both sides, "
            "so the validation loss partly measures seen inputs")
    return Split(train, val, "row", False, (note,))


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
    """A fixed, seeded sample of ``n`` rows spread over all x, in sampled order.

    The distinct x in a random order, their rows shuffled within each x
    (``numpy.random.default_rng(seed)``), taken round-robin: the first k rows cover min(k, #x) distinct
    x, so any prefix of the sample is spread too. ``n`` = 0 or ``n`` >= len(pairs): every row. The same
    rows for every run that reads the same file. Raises ValueError for ``n`` < 0.
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


#: the seed of the hand-over gate's sample (``gate_sample``), fixed like ``EVAL_SAMPLE_SEED``
GATE_SAMPLE_SEED = 1


@dataclass(frozen=True)
class GateRows:
    """The rows the hand-over gate reads (``gate_sample``): ``split`` "val" or "train"; ``note``: the
    line a reader must see when the gate reads training rows, else ``""``."""

    pairs: list[Pair]
    split: Literal["val", "train"]
    note: str = ""


def gate_sample(val: Sequence[Pair], evaluated: Sequence[Pair], train: Sequence[Pair], n: int, *,
                seed: int = GATE_SAMPLE_SEED) -> GateRows:
    """The rows of the hand-over gate (and of the aggressive encoder's I(x; z)), none an evaluation
    row: a run's hand-over step is chosen on rows its evaluation never reads.

    ``val``: the validation file's rows; ``evaluated``: the evaluation rows; ``train``: the training
    rows; ``n``: ``handover_rows``. ``spread_sample(spare, n)`` of the validation rows not evaluated
    when there are at least ``n`` (``n`` = 0: all of them); else ``spread_sample(train, n)`` with a note
    (never a mix). Rows are disjoint from the evaluation's; their x need not be. Deterministic. Raises
    ValueError naming ``handover_rows`` for ``n`` < 0, or ``n`` = 0 with no spare validation row.
    """
    if n < 0:
        raise ValueError(f"handover_rows={n} must be >= 0")
    taken = {p.id for p in evaluated}
    spare = [p for p in val if p.id not in taken]
    if n == 0 and not spare:
        raise ValueError(f"handover_rows=0 (every validation row outside the evaluation rows) finds none: all "
                         f"{len(val)} validation rows are evaluated; set handover_rows > 0 to gate on training rows")
    if n == 0 or len(spare) >= n:
        return GateRows(spread_sample(spare, n, seed=seed), "val")
    note = (f"note: handover_rows={n} but only {len(spare)} validation rows lie outside the {len(taken)} evaluation "
            f"rows: the hand-over gate reads {min(n, len(train))} training rows (seeded; the run trains on them too)")
    return GateRows(spread_sample(train, n, seed=seed), "train", note)


def ids_sha256(ids: Sequence[str]) -> str:
    """sha256 (hex) of ``ids`` joined by newlines, in order (the gate rows' fingerprint in summary.json)."""
    return hashlib.sha256("\n".join(ids).encode("utf-8")).hexdigest()
