"""JSONL (x, y) pairs: reading and validating rows ``{"id", "x"?, "y", "strategy"?, "labels"?}``.

``labels`` is an optional flat object of named categorical factors (values strings or integers,
e.g. ``{"n_sentences": "2", "first_slot": "name"}``); each key keeps one type across the file.
``x`` is given in every row or in none: a file without x is unconditional text (x read as ``""``,
``zfree_lab.run.split.is_unconditional``), the setting of Bowman et al.'s sentence VAE and Optimus.

A file is read line by line, and only a regular file of at most ``MAX_DATA_BYTES`` bytes and
``MAX_DATA_ROWS`` rows: tokenized rows and batches take about 30x the file's size in memory
(docs/results/real-models.md), so a larger file is refused up front rather than by a MemoryError
later. ``$ZFREE_MAX_DATA_BYTES`` / ``$ZFREE_MAX_DATA_ROWS`` or ``load_pairs``' arguments override them.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from zfree.core.errors import ConfigError, InputError

#: the largest data file read (bytes; ~4 GB of memory once tokenized); $ZFREE_MAX_DATA_BYTES overrides
MAX_DATA_BYTES = 128 * 2**20
#: the most rows read from one data file (E2E has 42k); $ZFREE_MAX_DATA_ROWS overrides
MAX_DATA_ROWS = 500_000
#: the environment variables that override ``MAX_DATA_BYTES`` and ``MAX_DATA_ROWS``
LIMIT_ENV = {"bytes": "ZFREE_MAX_DATA_BYTES", "rows": "ZFREE_MAX_DATA_ROWS"}


def data_limits(max_bytes: int | None = None, max_rows: int | None = None) -> tuple[int, int]:
    """``(max_bytes, max_rows)``: the arguments when given, else ``$ZFREE_MAX_DATA_BYTES`` /
    ``$ZFREE_MAX_DATA_ROWS`` when set, else ``MAX_DATA_BYTES`` / ``MAX_DATA_ROWS``. ConfigError naming
    the variable for a value that is not a positive integer."""
    out = []
    for key, given, default in (("bytes", max_bytes, MAX_DATA_BYTES), ("rows", max_rows, MAX_DATA_ROWS)):
        raw = os.environ.get(LIMIT_ENV[key], "").strip()
        if given is None and raw:
            try:
                given = int(raw.replace("_", ""))
            except ValueError:
                given = 0
            if given <= 0:
                raise ConfigError(f"{LIMIT_ENV[key]}={raw!r}: give a positive integer (the most {key} of a data file read)")
        out.append(default if given is None else given)
    return out[0], out[1]


def check_data_file(path: Path, max_bytes: int) -> None:
    """FileNotFoundError for a missing ``path``; InputError naming it for a folder, a file that is not
    a regular file (a device, pipe or socket) or one over ``max_bytes`` bytes, before a byte is read."""
    if not path.exists():
        raise FileNotFoundError(f"data file {path} does not exist")
    if path.is_dir():
        raise InputError(f"{path}: a folder, not a JSONL file of pairs")
    if not path.is_file():
        raise InputError(f"{path}: not a regular file (a device, pipe or socket); give a JSONL file of pairs")
    size = path.stat().st_size
    if size > max_bytes:
        raise InputError(f"{path}: {size:,} bytes, over the data file limit of {max_bytes:,} bytes (about 30x the "
                         f"file in memory once tokenized); take a sample of the rows, or raise the limit with "
                         f"{LIMIT_ENV['bytes']}")


def _lines(path: Path):
    """``(line number, text)`` of each line of ``path`` (lines end at "\\n"), decoded as UTF-8 without
    a leading byte-order mark; InputError naming the line and byte offset of text that is not UTF-8."""
    offset = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                text = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise InputError(f"{path}:{lineno}: not UTF-8 text at byte {offset + e.start} of the file (column "
                                 f"{e.start + 1} of the line); the data file must be JSONL in UTF-8") from None
            offset += len(raw)
            yield lineno, text


@dataclass(frozen=True)
class Pair:
    """One (x, y) row as read by ``load_pairs``: its id, x (``""`` for unconditional text), y, and the
    optional ``strategy``, ``labels`` and, on the synthetic benchmark, ``bayes_nll`` and ``n_consistent``
    (the number of strategies that map x to y)."""

    id: str
    x: str
    y: str
    strategy: str | None = None
    bayes_nll: float | None = None  # synthetic benchmark only: -log p*(y|x), nats per sequence
    n_consistent: int | None = None
    labels: dict[str, str | int] | None = field(default=None, hash=False)  # named categorical factors


def _check_labels(value, where: str, types: dict[str, tuple[type, str]]) -> dict[str, str | int]:
    """Validate one row's ``labels``: a flat object of str or int values whose type per key agrees
    with the rows before (``types``: key -> (type, where first seen), updated in place)."""
    if not isinstance(value, dict):
        raise ValueError(f"{where}: field 'labels' must be an object of strings or integers, "
                         f"got {type(value).__name__}")
    for k, v in value.items():
        if not k.strip():  # a nameless label would be a nameless column, oracle and figure axis
            raise ValueError(f"{where}: field 'labels' has an empty key {k!r}: give every label a name")
        if isinstance(v, bool) or not isinstance(v, (str, int)):
            raise ValueError(f"{where}: field 'labels.{k}' must be a string or an integer (labels are a flat "
                             f"object), got {type(v).__name__}")
        kind = str if isinstance(v, str) else int
        first = types.setdefault(k, (kind, where))
        if first[0] is not kind:
            raise ValueError(f"{where}: field 'labels.{k}' is {kind.__name__} here but {first[0].__name__} at "
                             f"{first[1]}; one label keeps one type")
    return dict(value)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _check_unicode(row: dict, where: str) -> None:
    """InputError naming the row and field for a lone surrogate (JSON's unpaired ``\\ud800`` ..
    ``\\udfff`` escape): not Unicode text, so no tokenizer or parquet file takes it."""
    values = [(k, row.get(k)) for k in ("x", "y", "id", "strategy")]
    labels = row.get("labels")
    if isinstance(labels, dict):
        values += [(f"labels.{k}", v) for k, v in labels.items()] + [("labels (a key)", k) for k in labels]
    for key, v in values:
        m = _SURROGATE.search(v) if isinstance(v, str) else None
        if m:
            raise InputError(f"{where}: field {key!r} holds a lone surrogate U+{ord(m.group()):04X} at character "
                             f"{m.start()} (an unpaired \\u{ord(m.group()):04x} escape: not Unicode text); fix that row")


def _parse_line(line: str, where: str) -> dict:
    """One JSONL line as a row object; InputError naming ``where`` for a line that is not JSON, not
    a usable JSON value, or not an object with a ``y``."""
    try:
        row = json.loads(line.rstrip("\r\n"))  # a column past the line's end is the line's, not the next's
    except json.JSONDecodeError as e:
        hint = ("; a tab or line break inside a string is written \\t or \\n"
                if e.msg.startswith("Invalid control character") else "")
        raise InputError(f"{where}: not valid JSON ({e.msg.removesuffix(' at')} at column {e.pos + 1}{hint}); "
                         "the data file must be JSONL (one JSON object per line)") from None
    except (ValueError, RecursionError) as e:  # an integer of > 4300 digits, nesting too deep
        raise InputError(f"{where}: not a usable JSON row ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(row, dict):
        raise InputError(f"{where}: each row must be a JSON object with fields x and y")
    if "y" not in row:
        keys = ", ".join(repr(k) for k in list(row)[:8]) + (", ..." if len(row) > 8 else "")
        raise InputError(f"{where}: missing field 'y' (the row's fields: {keys or 'none'}); zfree reads the "
                         "target as 'y' and the condition as 'x' (optional)")
    return row


def _check_texts(row: dict, where: str, x_first: tuple[bool, str]) -> None:
    """InputError naming ``where`` unless x is given here exactly when it was in the first row
    (``x_first``: x given?, where), x and y are strings, y is not blank and no field holds a lone
    surrogate."""
    if ("x" in row) != x_first[0]:
        what = (f"missing field 'x' (given at {x_first[1]})" if x_first[0] else
                f"field 'x' given, but missing at {x_first[1]}")
        raise InputError(f"{where}: {what}; give x in every row, or in none for unconditional text")
    for key in ("x", "y"):
        if key in row and not isinstance(row[key], str):
            raise InputError(f"{where}: field {key!r} must be a string, got {type(row[key]).__name__}")
    if not row["y"].strip():
        raise InputError(f"{where}: field 'y' is empty")
    _check_unicode(row, where)


def load_pairs(path: Path | str, limit: int | None = None, *, max_bytes: int | None = None,
               max_rows: int | None = None) -> list[Pair]:
    """Read and validate a JSONL file of pairs, line by line.

    ``x`` absent from every row: each x is ``""`` (unconditional text); absent from some rows only: an
    error. ``limit``: read only the first ``limit`` rows (the file size is then not checked).
    ``max_bytes`` / ``max_rows``: the file's limits (``data_limits``). Rows without ``id`` get
    ``"<file stem>-<line>"``.

    Raises InputError (a ValueError) naming file and line for a line that is not JSON, a row that is
    not an object, a missing ``y``, x given in some rows only, a non-string x or y, an empty y, a lone
    surrogate in any string field, a duplicated id, or a row over ``max_rows``; ValueError naming
    ``labels.<key>`` for labels that are not a flat object of strings or integers of one type per key;
    InputError before reading for a folder, a non-regular file or one over ``max_bytes``;
    FileNotFoundError if the file is missing.
    """
    path = Path(path)
    max_bytes, max_rows = data_limits(max_bytes, max_rows)
    check_data_file(path, max_bytes if limit is None else float("inf"))
    pairs: list[Pair] = []
    seen: set[str] = set()
    label_types: dict[str, tuple[type, str]] = {}
    x_first: tuple[bool, str] | None = None  # (x given?, where) of the first row: every row agrees with it
    for lineno, line in _lines(path):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        if len(pairs) >= max_rows:
            raise InputError(f"{where}: more than {max_rows:,} rows, the data file limit; take a sample of the rows, "
                             f"or raise the limit with {LIMIT_ENV['rows']}")
        row = _parse_line(line, where)
        x_first = x_first or ("x" in row, where)
        _check_texts(row, where, x_first)
        rid = str(row.get("id", f"{path.stem}-{lineno}"))
        if rid in seen:
            raise InputError(f"{where}: duplicated id {rid!r}")
        seen.add(rid)
        strategy = row.get("strategy")
        labels = None if row.get("labels") is None else _check_labels(row["labels"], where, label_types)
        pairs.append(Pair(rid, row.get("x", ""), row["y"], None if strategy is None else str(strategy),
                          row.get("bayes_nll"), row.get("n_consistent"), labels))
        if limit is not None and len(pairs) >= limit:
            break
    if not pairs:
        raise InputError(f"{path}: no rows")
    return pairs
