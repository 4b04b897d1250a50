"""The E2E NLG real-text benchmark: the cleaned CSVs -> JSONL pairs with labels a latent could carry.

Data: Ondřej Dušek, David M. Howcroft and Verena Rieser (2019), "Semantic Noise Matters for Neural
Natural Language Generation", INLG 2019 (the cleaned release of the E2E NLG Challenge data of
Novikova, Dušek and Rieser, SIGDIAL 2017), licence CC BY-SA 4.0. Each CSV row is a reference text
``ref`` written for the meaning representation ``orig_mr`` (what the writer was shown), with ``mr``
re-annotated to the slots that reference actually realises.

Rows: ``{"id", "x": orig_mr, "y": ref, "labels": {"n_sentences", "first_slot", "complete"}}``;
``test-fixed.csv`` is the train split, ``devel-fixed.no-ol.csv`` the validation split (they share no
MR). The label rules (``LABELS``, also written to metadata.json):

- ``n_sentences``: pieces of the reference holding a letter, cut after ``.``/``!``/``?`` followed by
  whitespace or the end; buckets "1", "2", "3+".
- ``first_slot``: the realised slot (of ``mr``) whose earliest cue (``slot_cues``) occurs first in
  the lowercased reference; ties: the longer cue, then ``SLOTS`` order; "none" if no cue occurs.
- ``complete``: "yes" when every slot=value of ``orig_mr`` is in ``mr``, else "no".
"""

from __future__ import annotations

import csv
import json
import re
from collections import Counter
from dataclasses import replace
from pathlib import Path

from zfree.core.io import atomic_write_json, atomic_write_text, sha256_file

SOURCES = {"train": "test-fixed.csv", "val": "devel-fixed.no-ol.csv"}
COLUMNS = ("mr", "ref", "orig_mr")
SLOTS = ("name", "eatType", "food", "priceRange", "customer rating", "area", "familyFriendly", "near")
ATTRIBUTION = ("Ondřej Dušek, David M. Howcroft and Verena Rieser (2019), 'Semantic Noise Matters for Neural "
               "Natural Language Generation', INLG 2019 (cleaned E2E NLG data, repository tuetschek/e2e-cleaning); "
               "original E2E data: Novikova, Dušek and Rieser (SIGDIAL 2017). Licence CC BY-SA 4.0; derived data "
               "are shared under the same licence.")
LABELS = {
    "n_sentences": "sentences in y, cut after . ! ? followed by whitespace or the end; bucketed 1, 2, 3+",
    "first_slot": "the realised slot (of mr) whose cue occurs first in y; cues: the value (name, near, eatType, "
                  "food, area; area also 'city center'/'river'), price/priced/expensive/cost or a value other "
                  "than 'high' (priceRange), rating/rated/star/score or a value other than 'high'/'low' "
                  "(customer rating), family/child/kid (familyFriendly); ties: longer cue, then slot order; "
                  "'none' if no cue occurs",
    "complete": "yes when every slot=value of orig_mr (x) is realised per the re-annotated mr, else no",
}

_SLOT_RE = re.compile(r"([^\[\],]+)\[([^\]\[]*)\]")
_SENT_END = re.compile(r"(?<=[.!?])\s+")


def parse_mr(mr: str) -> list[tuple[str, str]]:
    """``"name[Blue Spice], eatType[pub]"`` -> ``[("name", "Blue Spice"), ("eatType", "pub")]``.

    A slot may repeat (the re-annotated ``mr`` lists both areas of a reference that names two).
    Raises ValueError naming the MR when a piece is not ``slot[value]`` or the MR is empty.
    """
    out: list[tuple[str, str]] = []
    end = 0
    for m in _SLOT_RE.finditer(mr):
        if mr[end:m.start()].strip(", "):
            raise ValueError(f"MR {mr!r}: {mr[end:m.start()]!r} is not slot[value]")
        out.append((m.group(1).strip(), m.group(2).strip()))
        end = m.end()
    if mr[end:].strip(", ") or not out:
        raise ValueError(f"MR {mr!r}: {mr[end:]!r} is not slot[value]")
    return out


def count_sentences(text: str) -> int:
    """Number of sentences: pieces between ``.``/``!``/``?`` + whitespace that hold a letter (>= 1)."""
    return max(1, sum(bool(re.search(r"[^\W\d_]", s)) for s in _SENT_END.split(text.strip())))


def sentence_bucket(n: int) -> str:
    """1 -> "1", 2 -> "2", >= 3 -> "3+"."""
    return str(n) if n < 3 else "3+"


def slot_cues(slot: str, value: str) -> list[str]:
    """Lowercase strings whose occurrence in a reference marks ``slot``: the value itself (area also
    "city center"/"river"); for priceRange the value unless "high", and price/priced/expensive/cost;
    for customer rating the value unless "high"/"low", and rating/rated/star/score; for familyFriendly
    family/child/kid."""
    v = value.lower()
    if slot == "priceRange":
        return ([v] if v != "high" else []) + ["price", "priced", "expensive", "cost"]
    if slot == "customer rating":
        return ([v] if v not in ("high", "low") else []) + ["rating", "rated", "star", "score"]
    if slot == "familyFriendly":
        return ["family", "child", "kid"]
    if slot == "area":
        return [v] + (["city center"] if v == "city centre" else ["river"] if v == "riverside" else [])
    return [v]


def first_slot(ref: str, realised: list[tuple[str, str]]) -> str:
    """The slot of ``realised`` whose earliest cue comes first in ``ref`` (ties: longer cue, then
    ``SLOTS`` order; unknown slots last); "none" if no cue occurs."""
    text = ref.lower()
    best = None
    for slot, value in realised:
        order = SLOTS.index(slot) if slot in SLOTS else len(SLOTS)
        for cue in slot_cues(slot, value):
            pos = text.find(cue)
            if pos >= 0 and (best is None or (pos, -len(cue), order) < best[0]):
                best = ((pos, -len(cue), order), slot)
    return "none" if best is None else best[1]


def row_labels(mr: str, ref: str, orig_mr: str) -> dict[str, str]:
    """The three labels of one CSV row (module docstring). Raises ValueError from ``parse_mr``."""
    realised, shown = parse_mr(mr), parse_mr(orig_mr)
    complete = set(shown) <= set(realised)
    return {"n_sentences": sentence_bucket(count_sentences(ref)), "first_slot": first_slot(ref, realised),
            "complete": "yes" if complete else "no"}


def read_e2e_csv(path: Path | str, split: str) -> list[dict]:
    """Rows ``{"id", "x", "y", "labels"}`` of one cleaned E2E CSV, in file order.

    Raises FileNotFoundError if the file is missing, ValueError naming the file (and row) for a
    missing column, an empty ``ref`` or ``orig_mr``, or an MR that does not parse.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"E2E file {path} does not exist")
    with path.open(encoding="utf-8-sig", newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing column(s) {missing}; expected {list(COLUMNS)}")
        rows = []
        for i, r in enumerate(reader):
            where = f"{path}: row {i + 2}"  # 1-based, after the header line
            if not r["ref"].strip() or not r["orig_mr"].strip():
                raise ValueError(f"{where}: empty ref or orig_mr")
            try:
                labels = row_labels(r["mr"], r["ref"].strip(), r["orig_mr"])
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
            rows.append({"id": f"e2e-{split}-{i:05d}", "x": r["orig_mr"].strip(), "y": r["ref"].strip(),
                         "labels": labels})
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


def convert_e2e(src: Path | str, out: Path | str) -> dict:
    """Convert ``src/{test-fixed,devel-fixed.no-ol}.csv`` into ``out/{train,val}.jsonl`` plus
    ``out/metadata.json`` (counts, label definitions and distributions, sha256 of each split and
    source, attribution). Every file is read and converted before anything is written; each file
    is written atomically, metadata.json last. Returns the metadata. Raises as ``read_e2e_csv``,
    and ValueError if the two files share an MR.
    """
    src, out = Path(src), Path(out)
    splits = {split: read_e2e_csv(src / name, split) for split, name in SOURCES.items()}
    shared = {r["x"] for r in splits["train"]} & {r["x"] for r in splits["val"]}
    if shared:
        raise ValueError(f"{src}: {len(shared)} MRs are in both {SOURCES['train']} and {SOURCES['val']}")
    meta = {"kind": "e2e", "attribution": ATTRIBUTION, "licence": "CC BY-SA 4.0", "label_definitions": LABELS,
            "x": "orig_mr (the MR shown to the writer)", "y": "ref (the human reference)", "splits": {}}
    for split, rows in splits.items():
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        atomic_write_text(out / f"{split}.jsonl", text)
        meta["splits"][split] = {
            "source": SOURCES[split], "source_sha256": sha256_file(src / SOURCES[split]),
            "n_rows": len(rows), "n_x": len({r["x"] for r in rows}),
            "sha256": sha256_file(out / f"{split}.jsonl"),
            "labels": {k: dict(sorted(Counter(r["labels"][k] for r in rows).items())) for k in LABELS}}
    atomic_write_json(out / "metadata.json", meta)
    return meta


_ONSETS = ("b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z", "br", "ch", "st")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou")


def pseudo_name(rng) -> str:
    """A random capitalised name of 1-2 words of 2-3 syllables (``rng``: a numpy Generator)."""
    words = []
    for _ in range(int(rng.integers(1, 3))):
        w = "".join(_ONSETS[rng.integers(len(_ONSETS))] + _VOWELS[rng.integers(len(_VOWELS))]
                    for _ in range(int(rng.integers(2, 4))))
        words.append(w.capitalize())
    return " ".join(words)


def swap_names(pair, rng):
    """Training-time augmentation for a base model trained from scratch: the ``name`` and ``near``
    values of x replaced by pseudo-names in x and y (where the value occurs verbatim in y), so the
    model learns to copy names from x rather than memorise the train split's. Returns a new Pair."""
    x, y = pair.x, pair.y
    for slot, value in parse_mr(x):
        if slot in ("name", "near") and value and value in y:
            new = pseudo_name(rng)
            x, y = x.replace(f"{slot}[{value}]", f"{slot}[{new}]"), y.replace(value, new)
    return replace(pair, x=x, y=y)
