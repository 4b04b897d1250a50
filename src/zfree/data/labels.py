"""The value of a named label on a row, and the values a label takes over a data set: what a label
oracle's z is (``ModelConfig.latent_source = "label:<key>"``).

A label key is ``strategy`` (the synthetic benchmark's hidden strategy) or a key of the rows'
``labels`` object; a joint label ``a*b`` (e.g. ``n_sentences*first_slot``) is the pair of both
values, written ``"va*vb"``.

A *derived* label is computed from the row when its ``labels`` lack the key (``DERIVED_LABELS``):
``y_words``, y's length in whitespace-separated words, bucketed ``1-20``, ``21-26``, ``27+`` (about the
terciles of the shipped E2E train split). It is read only where a study names it (``label:y_words``),
never by ``label_keys_of``. Words, not tokens: a label is a property of the data, the same for every model.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Sequence

from zfree.data.pairs import Pair

JOINT = "*"
#: the most values a label oracle's z takes: a label with more keeps its ``LABEL_VALUE_CAP - 1`` most
#: frequent values and pools the rest as ``OTHER``
LABEL_VALUE_CAP = 32
OTHER = "<other>"


def y_words_bucket(y: str) -> str:
    """``y_words`` (module docstring): the number of whitespace-separated words of ``y`` in buckets
    "1-20", "21-26", "27+" (an empty y counts as 1-20)."""
    n = len(y.split())
    return "1-20" if n <= 20 else "21-26" if n <= 26 else "27+"


#: derived label key -> its value from the row (module docstring); a row's own label of that key wins
DERIVED_LABELS: dict[str, Callable[[Pair], str]] = {"y_words": lambda p: y_words_bucket(p.y)}


def label_value(pair: Pair, key: str) -> str | None:
    """The row's value of ``key`` as a string (``strategy``, a labels key, a derived label of
    ``DERIVED_LABELS`` or a joint ``a*b``); None when the row lacks it (or any part of a joint key)."""
    if JOINT in key and key != "strategy" and not (pair.labels and key in pair.labels):
        parts = [label_value(pair, k) for k in key.split(JOINT)]
        return None if any(v is None for v in parts) else JOINT.join(parts)
    if key == "strategy":
        return pair.strategy
    if pair.labels is None or key not in pair.labels:
        return DERIVED_LABELS[key](pair) if key in DERIVED_LABELS else None
    return str(pair.labels[key])


def label_values(pairs: Sequence[Pair], key: str, *, source: str = "<pairs>") -> list[str]:
    """The sorted distinct values of ``key`` over ``pairs``. Raises ValueError naming ``source`` and
    the first row without the label (an oracle needs every row's value)."""
    values = set()
    for p in pairs:
        v = label_value(p, key)
        if v is None:
            raise ValueError(f"{source}: row {p.id!r} has no label {key!r} (a label oracle needs it on every row)")
        values.add(v)
    return sorted(values)


def label_keys_of(pairs: Sequence[Pair]) -> list[str]:
    """The label keys every row carries: ``strategy`` when all rows have one, then the labels keys
    present on all rows, in first-seen order."""
    keys = ["strategy"] if pairs and all(p.strategy is not None for p in pairs) else []
    seen = dict.fromkeys(k for p in pairs for k in p.labels or {})  # first-seen order
    return keys + [k for k in seen if all(p.labels is not None and k in p.labels for p in pairs)]


def capped_values(pairs: Sequence[Pair], key: str, cap: int = LABEL_VALUE_CAP, *,
                  source: str = "<pairs>") -> tuple[list[str], int]:
    """The values an oracle of ``key`` distinguishes over ``pairs`` and the label's own number of
    values: ``label_values`` when there are at most ``cap``; else the ``cap - 1`` most frequent
    (ties by value), sorted, then ``OTHER`` for the rest. Raises as ``label_values``."""
    values = label_values(pairs, key, source=source)
    if len(values) <= cap:
        return values, len(values)
    counts = Counter(label_value(p, key) for p in pairs)
    kept = sorted(sorted(counts, key=lambda v: (-counts[v], v))[: cap - 1])
    return kept + [OTHER], len(values)


def value_index(values: Sequence[str]) -> Callable[[str], int]:
    """value -> its index in ``values`` (``capped_values``' list); a value not in it -> ``OTHER``'s."""
    idx = {v: i for i, v in enumerate(values)}
    other = idx.get(OTHER)
    return lambda v: idx[v] if v in idx or other is None else other
