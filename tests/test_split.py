"""zfree.data.split: a split by x keeps every row and puts no x on both sides; errors and warnings
name the file."""

from __future__ import annotations

import math
import warnings

import pytest
from hypothesis import given, settings, strategies as st

from zfree.data.pairs import Pair, load_pairs
from zfree.data.split import shared_x_count, split_by_x, write_pairs


def make(groups: list[int]) -> list[Pair]:
    """Rows with x = "x<g>" repeated groups[g] times, interleaved (not grouped) in file order."""
    rows, left = [], list(groups)
    while any(left):
        for g, n in enumerate(left):
            if n:
                rows.append(Pair(f"r{len(rows)}", f"x{g}", f"y{len(rows)}", labels={"g": g}))
                left[g] -= 1
    return rows


@settings(max_examples=60, deadline=None)
@given(groups=st.lists(st.integers(1, 6), min_size=2, max_size=25), frac=st.floats(0.05, 0.6), seed=st.integers(0, 9))
def test_split_by_x_keeps_all_rows_and_no_x_on_both_sides(groups, frac, seed):
    pairs = make(groups)
    try:
        train, val = split_by_x(pairs, val_fraction=frac, seed=seed)
    except ValueError as e:
        assert "too small" in str(e)
        return
    assert not {p.x for p in train} & {p.x for p in val}
    assert sorted(p.id for p in train + val) == sorted(p.id for p in pairs)
    assert [p.id for p in train] == [p.id for p in pairs if p in train]  # input order kept
    target = math.ceil(frac * len(pairs))
    assert len(val) >= target and train
    assert len(val) - max(groups) < target  # stops as soon as the target is reached
    again = split_by_x(pairs, val_fraction=frac, seed=seed)
    assert again == (train, val)  # deterministic


def test_val_size_counts_rows_and_seed_changes_the_choice():
    pairs = make([3] * 40)
    train, val = split_by_x(pairs, val_size=30, seed=0)
    assert len(val) == 30 and len({p.x for p in val}) == 10
    assert {p.x for p in split_by_x(pairs, val_size=30, seed=1)[1]} != {p.x for p in val}


def test_too_small_for_the_asked_validation_size_names_the_file():
    pairs = make([2, 2, 2])
    with pytest.raises(ValueError, match=r"mine\.jsonl: too small for a validation set of 6 rows"):
        split_by_x(pairs, val_size=6, source="mine.jsonl")
    with pytest.raises(ValueError, match=r"mine\.jsonl: 3 rows over 1 distinct x"):
        split_by_x(make([3]), val_size=1, source="mine.jsonl")
    for kw in ({}, {"val_size": 1, "val_fraction": 0.1}, {"val_fraction": 1.0}, {"val_size": 0}):
        with pytest.raises(ValueError, match="mine.jsonl"):
            split_by_x(pairs, source="mine.jsonl", **kw)


def test_shared_x_warns_with_the_count():
    train, val = make([2, 2, 2]), [Pair("v0", "x0", "a"), Pair("v1", "x0", "b"), Pair("v2", "x9", "c")]
    with pytest.warns(UserWarning, match=r"val\.jsonl: 1 distinct x \(2 val rows\) also occur"):
        assert shared_x_count(train, val, val_source="val.jsonl") == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert shared_x_count(train, [Pair("v", "x9", "c")]) == 0


def test_written_split_reads_back_with_labels(tmp_path):
    pairs = make([2, 3, 1, 2])
    train, val = split_by_x(pairs, val_fraction=0.3, seed=0)
    write_pairs(train, tmp_path / "train.jsonl")
    write_pairs(val, tmp_path / "val.jsonl")
    assert load_pairs(tmp_path / "train.jsonl") == train and load_pairs(tmp_path / "val.jsonl") == val
