"""zfree.data.pairs: the optional ``labels`` object (flat, strings or integers, one type per key)."""

from __future__ import annotations

import json

import pytest

from zfree.data.pairs import Pair, load_pairs


def write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def test_labels_are_read_and_optional(tmp_path):
    f = write(tmp_path / "d.jsonl", [{"id": "a", "x": "1", "y": "2", "labels": {"n_sentences": "2", "k": 3}},
                                     {"id": "b", "x": "1", "y": "3"},
                                     {"id": "c", "x": "1", "y": "4", "labels": {}},
                                     {"id": "d", "x": "1", "y": "5", "labels": None}])
    a, b, c, d = load_pairs(f)
    assert a.labels == {"n_sentences": "2", "k": 3}
    assert b.labels is None and c.labels == {} and d.labels is None
    assert hash(a) == hash(Pair("a", "1", "2"))  # labels do not enter the hash (a dict is unhashable)


@pytest.mark.parametrize("labels,field,what", [
    ({"k": {"nested": 1}}, "labels.k", "dict"),
    ({"k": [1, 2]}, "labels.k", "list"),
    ({"k": 1.5}, "labels.k", "float"),
    ({"k": True}, "labels.k", "bool"),
    ({"k": None}, "labels.k", "NoneType"),
])
def test_non_flat_or_wrong_type_label_names_file_line_and_field(tmp_path, labels, field, what):
    f = write(tmp_path / "bad.jsonl", [{"x": "1", "y": "2"}, {"x": "1", "y": "2", "labels": labels}])
    with pytest.raises(ValueError, match=rf"bad\.jsonl:2: field '{field}' must be a string or an integer.*got {what}"):
        load_pairs(f)


@pytest.mark.parametrize("labels", ["first", ["a"], 3])
def test_labels_must_be_an_object(tmp_path, labels):
    f = write(tmp_path / "bad.jsonl", [{"x": "1", "y": "2", "labels": labels}])
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: field 'labels' must be an object"):
        load_pairs(f)


def test_mixed_label_types_across_rows_name_both_lines(tmp_path):
    f = write(tmp_path / "mix.jsonl", [{"x": "1", "y": "2", "labels": {"k": "a", "n": 1}},
                                       {"x": "1", "y": "3", "labels": {"n": 2}},
                                       {"x": "1", "y": "4", "labels": {"k": 7}}])
    with pytest.raises(ValueError, match=r"mix\.jsonl:3: field 'labels\.k' is int here but str at .*mix\.jsonl:1"):
        load_pairs(f)


@pytest.mark.parametrize("key", ["", "  "])
def test_an_empty_label_key_is_refused_naming_the_row(tmp_path, key):
    """Issue 34 (weak case): a nameless label became a nameless column, oracle and axis."""
    import json

    from zfree.data.pairs import load_pairs

    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"x": "a", "y": "b", "labels": {"style": "s"}}) + "\n"
                 + json.dumps({"x": "c", "y": "d", "labels": {key: "v"}}) + "\n")
    with pytest.raises(ValueError, match=rf"d\.jsonl:2: field 'labels' has an empty key '{key}': give every label a name"):
        load_pairs(f)


def test_a_label_with_many_values_is_capped_for_its_oracle():
    """A 5,000-value label: the oracle distinguishes the LABEL_VALUE_CAP - 1 most frequent values and
    pools the rest as OTHER; a label within the cap is untouched."""
    from zfree.data.labels import LABEL_VALUE_CAP, OTHER, capped_values, value_index

    rows = [Pair(f"r{i}", "x", "y", labels={"id": f"v{i}" if i >= 100 else f"common{i % 3}"}) for i in range(5000)]
    values, n_all = capped_values(rows, "id")
    assert n_all == 4900 + 3 and len(values) == LABEL_VALUE_CAP and values[-1] == OTHER
    assert {"common0", "common1", "common2"} <= set(values)
    index = value_index(values)
    assert index("common1") == values.index("common1") and index("v4321") == LABEL_VALUE_CAP - 1
    few = [Pair(str(i), "x", "y", labels={"k": "ab"[i % 2]}) for i in range(10)]
    assert capped_values(few, "k") == (["a", "b"], 2) and value_index(["a", "b"])("b") == 1
