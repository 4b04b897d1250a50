"""The text oracle's x (``ModelConfig.latent_source = "text:<key>"``): the row's label written into x,
so that a z-free arm (K = 1) reads it as input. Its gain over the control, D_control - D_text, is what
the label is worth given as text; beside the label oracle's it separates what the label carries from
how a latent route delivers it (docs/concepts/controls.md).

Templates, the first the tokenizer can write (``text_template``):

- ``TEXT_TEMPLATE``: x, a new line, then ``key: value``, encoded as the rest of x is;
- ``INDEX_TEMPLATE``, for a tokenizer that cannot write the key or a value without its unknown token
  (the synthetic benchmark's digits): the value's index among the label's values (``capped_values``
  over train + val), zero-padded to one width, its digits written after x, space-separated
  (``"6 5 2 3" -> "6 5 2 3 2"`` for the third strategy). A value pooled into ``OTHER`` writes its index.

A tokenizer that can write neither is refused (``ConfigError`` naming ``latent_source``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Sequence

from zfree.core.errors import ConfigError
from zfree.core.io import atomic_write_text
from zfree.data.labels import capped_values, label_value, value_index
from zfree.data.pairs import Pair, load_pairs

#: the label as a line of text after x
TEXT_TEMPLATE = "{x}\n{key}: {value}"
#: the label's index, as digits after x (a vocabulary that cannot write the label's name)
INDEX_TEMPLATE = "{x} {index}"
#: the splits a text oracle's data folder holds
SPLITS = ("train", "val")


def _writes(tokenizer, text: str) -> bool:
    """True when ``tokenizer`` encodes ``text`` (as x is encoded: no special tokens added, special-token
    text as its characters) to at least one token and without its unknown token."""
    ids = tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    unk = getattr(tokenizer, "unk_token_id", None)
    return bool(ids) and (unk is None or unk not in ids)


def text_template(tokenizer, key: str, values: Sequence[str]) -> tuple[str, Callable[[str, str], str]]:
    """``(name, write)``: the first template ("text" or "index") that ``tokenizer`` writes for every one
    of ``values`` (``capped_values``), and write(x, value) -> the text oracle's x. ConfigError naming
    ``latent_source`` when it writes neither."""
    if all(_writes(tokenizer, TEXT_TEMPLATE.format(x="", key=key, value=v)) for v in values):
        return "text", lambda x, v: TEXT_TEMPLATE.format(x=x, key=key, value=v)
    index, width = value_index(values), len(str(len(values) - 1))

    def digits(v: str) -> str:
        return " ".join(str(index(v)).zfill(width))

    if all(_writes(tokenizer, digits(v)) for v in values):
        return "index", lambda x, v: INDEX_TEMPLATE.format(x=x, index=digits(v))
    raise ConfigError(f"latent_source='text:{key}': the tokenizer writes neither '{key}: <value>' nor the value's "
                      f"index as digits without its unknown token, so the label cannot be written into x")


def text_pair(pair: Pair, key: str, write: Callable[[str, str], str]) -> Pair:
    """``pair`` with its x replaced by the text oracle's (``write`` from ``text_template``); the rest kept."""
    from dataclasses import replace

    return replace(pair, x=write(pair.x, label_value(pair, key)))


def _row(p: Pair) -> dict:
    """The JSONL row of a pair (``zfree.data.pairs``' keys; absent fields left out)."""
    row = {"id": p.id, "x": p.x, "y": p.y, "strategy": p.strategy, "bayes_nll": p.bayes_nll,
           "n_consistent": p.n_consistent, "labels": p.labels}
    return {k: v for k, v in row.items() if v is not None}


def write_text_data(data_dir: Path | str, out_dir: Path | str, key: str, tokenizer) -> tuple[Path, str]:
    """Write ``out_dir``/{train,val}.jsonl: ``data_dir``'s rows with the label ``key`` written into x
    (``text_template`` over the label's values on train + val; ids, y and labels kept), and return
    ``out_dir`` and the template's name. Raises ValueError naming the file and row for a row without the
    label, ConfigError when the tokenizer cannot write it."""
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    pairs = {s: load_pairs(data_dir / f"{s}.jsonl") for s in SPLITS}
    values, _ = capped_values(pairs["train"] + pairs["val"], key, source=f"{data_dir}/train.jsonl + val.jsonl")
    name, write = text_template(tokenizer, key, values)
    out_dir.mkdir(parents=True, exist_ok=True)
    for split, ps in pairs.items():
        lines = (json.dumps(_row(text_pair(p, key, write))) for p in ps)
        atomic_write_text(out_dir / f"{split}.jsonl", "\n".join(lines) + "\n")
    return out_dir, name
