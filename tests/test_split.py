"""zfree_lab.run.split: a split by x keeps every row and puts no x on both sides; unconditional text (one x)
and too few x split by row; errors and warnings name the file; the hand-over gate's rows are never
evaluation rows (``gate_sample``)."""

from __future__ import annotations

import dataclasses
import math
import warnings

import pytest
from hypothesis import given, settings, strategies as st

from zfree.data.pairs import Pair, load_pairs
from zfree_lab.run.split import (MIN_X_PER_SIDE, gate_sample, is_unconditional, shared_x_count, split_by_row,
                              split_by_x, split_pairs, spread_sample, write_pairs)


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


# --- unconditional text and too few x (issue 35, item 8): zfree_lab.run.split.split_pairs decides ---------------------


@pytest.mark.parametrize("x", ["", "Write a sentence:"])
def test_one_x_is_unconditional_dropped_and_split_by_row_with_no_y_on_both_sides(x):
    pairs = [Pair(f"r{i}", x, f"text {i % 7}", labels={"k": i % 2}) for i in range(30)]  # y repeats
    assert is_unconditional(pairs)
    s = split_pairs(pairs, val_size=6, seed=3, source="mine.jsonl")
    assert s.by == "row" and s.unconditional and s.shared_x == 0
    assert {p.x for p in s.train + s.val} == {""}  # the constant prompt dropped: y after the beginning token alone
    assert not {p.y for p in s.train} & {p.y for p in s.val}
    assert sorted(p.id for p in s.train + s.val) == sorted(p.id for p in pairs) and len(s.val) >= 6
    for part in (s.train, s.val):  # input order and every field but x kept
        assert part == [dataclasses.replace(p, x="") for p in pairs if p.id in {q.id for q in part}]
    (note,) = s.notes
    assert note.startswith("unconditional: x is ") and ("(dropped)" in note) == bool(x)
    assert "the 23 rows that repeat a y kept with it" in note  # 30 rows over 7 distinct y
    assert split_pairs(pairs, val_size=6, seed=3, source="mine.jsonl") == s  # deterministic


def test_distinct_rows_split_by_row_is_a_seeded_row_split():
    pairs = [Pair(f"r{i}", "", f"y{i}") for i in range(20)]
    train, val = split_by_row(pairs, val_size=5, seed=0)
    assert len(val) == 5 and len(train) == 15
    assert {p.id for p in split_by_row(pairs, val_size=5, seed=1)[1]} != {p.id for p in val}
    with pytest.raises(ValueError, match=r"mine\.jsonl: too small.*1 distinct \(x, y\)"):
        split_by_row([Pair("a", "", "y"), Pair("b", "", "y")], val_size=1, source="mine.jsonl")
    with pytest.raises(ValueError, match=r"mine\.jsonl: val_size=0"):
        split_pairs(pairs, val_size=0, source="mine.jsonl")


def test_conditional_data_splits_by_x_exactly_as_before():
    pairs = make([3] * 10 + [1, 2])
    s = split_pairs(pairs, val_size=7, seed=2, source="mine.jsonl")
    assert (s.train, s.val, s.by, s.unconditional, s.notes) == (*split_by_x(pairs, val_size=7, seed=2), "x", False, ())


def test_too_few_x_for_a_split_by_x_splits_by_row_with_a_note():
    pairs = [Pair("a0", "A", "alone")] + [Pair(f"b{i}", "B", f"y{i}") for i in range(19)]
    with pytest.raises(ValueError, match="leave no x for train"):  # what a split by x says on these rows
        split_by_x(pairs, val_size=4, seed=0, source="mine.jsonl")
    s = split_pairs(pairs, val_size=4, seed=0, source="mine.jsonl")
    assert s.by == "row" and not s.unconditional and len(s.val) == 4 and len(s.train) == 16
    assert {p.x for p in s.train + s.val} == {"A", "B"}  # x kept: conditional data
    (note,) = s.notes
    assert "mine.jsonl: 20 rows over 2 distinct x, too few for a split by x" in note and "split by row" in note


def test_rows_without_x_read_as_empty_and_a_file_mixing_them_is_refused(tmp_path):
    f = tmp_path / "u.jsonl"
    f.write_text('{"y": "one"}\n{"id": "b", "y": "two", "labels": {"k": "a"}}\n')
    assert [(p.id, p.x, p.y) for p in load_pairs(f)] == [("u-1", "", "one"), ("b", "", "two")]
    assert is_unconditional(load_pairs(f))
    f.write_text('{"x": "p", "y": "one"}\n{"y": "two"}\n')
    with pytest.raises(ValueError, match=r"u\.jsonl:2: missing field 'x' \(given at .*u\.jsonl:1\)"):
        load_pairs(f)
    f.write_text('{"y": "one"}\n{"x": "p", "y": "two"}\n')
    with pytest.raises(ValueError, match=r"u\.jsonl:2: field 'x' given, but missing at .*u\.jsonl:1"):
        load_pairs(f)


def test_three_prompts_are_split_by_row_not_one_prompt_in_val():
    """Issue 35: 3 distinct x of many rows each and a 300-row validation set: a split by x would put
    one prompt's rows in val (the evaluation reading one x); split by row instead, each x on both sides."""
    pairs = [Pair(f"{x}{i}", x, f"{x} text {i}") for x in ("Define:", "Explain:", "Describe:") for i in range(555)]
    assert len({p.x for p in split_by_x(pairs, val_size=300, seed=0)[1]}) == 1  # what a split by x would do here
    s = split_pairs(pairs, val_size=300, seed=0, source="mine.jsonl")
    assert s.by == "row" and not s.unconditional and len(s.val) == 300
    assert {p.x for p in s.val} == {p.x for p in s.train} == {"Define:", "Explain:", "Describe:"}
    (note,) = s.notes
    assert "1665 rows over 3 distinct x" in note and "would hold 1 distinct x and train 2, and each side needs at least 3" in note


def test_enough_prompts_on_each_side_keep_the_split_by_x():
    pairs = make([4] * 30)  # 30 x of 4 rows: val of 20 rows holds 5 x, train 25
    s = split_pairs(pairs, val_size=20, seed=1, source="mine.jsonl")
    assert s.by == "x" and len({p.x for p in s.val}) >= MIN_X_PER_SIDE and not {p.x for p in s.val} & {p.x for p in s.train}


@settings(max_examples=40, deadline=None)
@given(groups=st.lists(st.integers(1, 5), min_size=1, max_size=20), n_eval=st.integers(0, 60), n=st.integers(0, 40))
def test_gate_rows_are_never_evaluation_rows(groups, n_eval, n):
    """The gate split (issue 54, item 4): validation rows outside the evaluation sample when there are
    ``n`` of them (``n`` = 0: all of them), else ``n`` training rows; never an evaluation row, the same
    rows every call, a spread sample of its source."""
    val, train = make(groups), [Pair(f"t{i}", f"x{i % 7}", f"y{i}") for i in range(30)]
    evaluated = spread_sample(val, n_eval)
    spare = [p for p in val if p not in evaluated]
    if n == 0 and not spare:
        with pytest.raises(ValueError, match="handover_rows=0"):
            gate_sample(val, evaluated, train, n)
        return
    gate = gate_sample(val, evaluated, train, n)
    ids = [p.id for p in gate.pairs]
    assert not set(ids) & {p.id for p in evaluated}
    assert ids == [p.id for p in gate_sample(val, evaluated, train, n).pairs]  # deterministic
    if n == 0 or len(spare) >= n:
        assert gate.split == "val" and not gate.note
        assert ids == [p.id for p in spread_sample(spare, n, seed=1)]
    else:
        assert gate.split == "train" and "handover_rows" in gate.note
        assert ids == [p.id for p in spread_sample(train, n, seed=1)]


def test_gate_rows_on_the_shipped_benchmark_leave_the_evaluation_rows_alone():
    """The default study's aided runs (eval_rows 500, handover_rows 500) on data/synth/default: the 500
    gate rows are the other 500 validation rows. Before issue 54 they were the first 500 evaluation
    rows: ``spread_sample(val, 500)[:500]``, all of them evaluated."""
    from pathlib import Path

    val = load_pairs(Path(__file__).parents[1] / "data" / "synth" / "default" / "val.jsonl")
    evaluated = spread_sample(val, 500)
    gate = gate_sample(val, evaluated, [], 500)
    assert gate.split == "val" and len(gate.pairs) == 500
    assert {p.id for p in gate.pairs} == {p.id for p in val} - {p.id for p in evaluated}
