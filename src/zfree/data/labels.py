"""The value of a named label on a row, and the values a label takes over a data set: what a label
oracle's z is (``ModelConfig.latent_source = "label:<key>"``).

A label key is ``strategy`` (the synthetic benchmark's hidden strategy) or a key of the rows'
``labels`` object; a joint label ``a*b`` (e.g. ``n_sentences*first_slot``) is the pair of both
values, written ``"va*vb"``.
"""

from __future__ import annotations

from typing import Sequence

from zfree.data.pairs import Pair

JOINT = "*"


def label_value(pair: Pair, key: str) -> str | None:
    """The row's value of ``key`` as a string (``strategy``, a labels key, or a joint ``a*b``);
    None when the row lacks it (or any part of a joint key)."""
    if JOINT in key and key != "strategy" and not (pair.labels and key in pair.labels):
        parts = [label_value(pair, k) for k in key.split(JOINT)]
        return None if any(v is None for v in parts) else JOINT.join(parts)
    if key == "strategy":
        return pair.strategy
    if pair.labels is None or key not in pair.labels:
        return None
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
    seen: dict[str, None] = {}
    for p in pairs:
        for k in p.labels or {}:
            seen.setdefault(k, None)
    return keys + [k for k in seen if all(p.labels is not None and k in p.labels for p in pairs)]
