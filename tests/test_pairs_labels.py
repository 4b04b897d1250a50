"""zfree.data.pairs: the optional ``labels`` object (flat, strings or integers, one type per key)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

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


# ---------------------------------------------------------------------------- issue 61: unbounded data


def test_a_data_file_over_the_stated_limits_is_refused_in_one_line_naming_it(tmp_path, monkeypatch):
    """A 1 GB data file took about 30x its size in memory with no warning: a file over the byte limit
    (``MAX_DATA_BYTES``, here set small by $ZFREE_MAX_DATA_BYTES) is refused before it is read, and one
    of more rows than the row limit at its first extra row, each in one line naming the file and the
    limit; at the limits it is read."""
    from zfree.core.errors import ConfigError, InputError

    f = write(tmp_path / "d.jsonl", [{"x": "x", "y": f"y{i}"} for i in range(8)])
    size = f.stat().st_size
    monkeypatch.setenv("ZFREE_MAX_DATA_BYTES", str(size - 1))
    with pytest.raises(InputError) as e:
        load_pairs(f)
    assert str(e.value).startswith(f"{f}: {size:,} bytes, over the data file limit of {size - 1:,} bytes")
    assert "ZFREE_MAX_DATA_BYTES" in str(e.value) and "\n" not in str(e.value)
    monkeypatch.setenv("ZFREE_MAX_DATA_BYTES", str(size))
    assert len(load_pairs(f)) == 8
    monkeypatch.setenv("ZFREE_MAX_DATA_ROWS", "5")
    with pytest.raises(InputError, match=rf"^{f}:6: more than 5 rows, the data file limit; .*ZFREE_MAX_DATA_ROWS"):
        load_pairs(f)
    assert len(load_pairs(f, max_rows=8)) == 8 and len(load_pairs(f, limit=5)) == 5  # an argument, a sample
    monkeypatch.setenv("ZFREE_MAX_DATA_ROWS", "lots")
    with pytest.raises(ConfigError, match="ZFREE_MAX_DATA_ROWS='lots': give a positive integer"):
        load_pairs(f)
    from zfree.data.pairs import MAX_DATA_BYTES, MAX_DATA_ROWS

    assert MAX_DATA_BYTES >= 2**20 and MAX_DATA_ROWS >= 50_000  # E2E (1.8 MB, 42k rows) reads as it is


def _under_a_memory_limit(code: str, tmp_path) -> subprocess.CompletedProcess:
    """``code`` run in a Python whose heap is capped at 1 GiB (RLIMIT_DATA): a read of /dev/zero there
    ends in a MemoryError within seconds rather than filling this machine's memory."""
    import os
    import sys

    prelude = "import resource; resource.setrlimit(resource.RLIMIT_DATA, (1 << 30, 1 << 30))\n"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env=env)


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_dev_zero_as_data_is_refused_without_reading_it(tmp_path):
    """`--data /dev/zero` was read whole into memory (5.3 GB in 11 s, then a MemoryError traceback): a
    device, pipe or socket is not a regular file and is refused in one line, by `load_pairs` and by
    `zfree train` / `zfree study` / `zfree score` before any folder is made. Run under a 1 GiB heap cap."""
    proc = _under_a_memory_limit(
        "from zfree.core.errors import InputError\nfrom zfree.data.pairs import load_pairs\n"
        "try:\n    load_pairs('/dev/zero')\nexcept InputError as e:\n    print(e)\n", tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "/dev/zero: not a regular file (a device, pipe or " \
        "socket); give a JSONL file of pairs", proc.stderr[-2000:]
    for argv in (["train", "--model", "m", "--data", "/dev/zero", "--out", "o"],
                 ["study", "--model", "m", "--data", "/dev/zero", "--out", "o"],
                 ["score", "--model", "m", "--data", "/dev/zero", "--out", "o"]):
        proc = _under_a_memory_limit(f"import sys\nfrom zfree_lab.cli import main\nsys.exit(main({argv!r}))\n", tmp_path)
        err = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(err) == 1, (argv, proc.stderr[-2000:])
        assert err[0] == "zfree: error: --data /dev/zero: not a regular file (a device, pipe or socket, read " \
                         "without end): give one JSONL file of pairs", err
        assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("line, where", [
    ('{"x": "a\tb", "y": "c"}', r"not valid JSON \(Invalid control character at column 9; a tab or line break "
                                r"inside a string is written \\t or \\n\)"),
    ('{"x": "a", "y": }', r"not valid JSON \(Expecting value at column 17\)"),
    ('{"x": "a", "y": "b"', r"not valid JSON \(Expecting ',' delimiter at column 20\)"),  # at the line's end
])
def test_a_row_that_is_not_json_is_named_with_its_column_and_the_whole_reason(tmp_path, line, where):
    """The JSON error's message was cut short ("Invalid control character at"): it names the row, the
    column and, for a raw control character, how to write one, in one line."""
    from zfree.core.errors import InputError

    f = tmp_path / "d.jsonl"
    f.write_text('{"x": "a", "y": "b"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(InputError, match=rf"^{f}:2: {where}; the data file must be JSONL") as e:
        load_pairs(f)
    assert "\n" not in str(e.value)
