"""The score cache of ``zfree.reference.scoring.score_pairs``: where it lives, the hashes that key an
entry, and one entry read or written whole.

An entry is a folder ``<cache>/<key[:2]>/<key>``: per_example.parquet, per_token.parquet, their
sha256 in checksums.json, and settings.json; renamed into place when written, read back only when
checksums, rows and token counts match.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Sequence

import pandas as pd

from zfree.core.io import atomic_write_dir, read_json, sha256_file, sha256_json
from zfree.data.pairs import Pair


def default_cache_dir() -> Path:
    """``$ZFREE_CACHE_DIR``, else ``~/.cache/zfree/scores``."""
    return Path(os.environ.get("ZFREE_CACHE_DIR") or Path.home() / ".cache" / "zfree" / "scores")


def tokenizer_sha256(tokenizer) -> str:
    """Hash of a tokenizer: class, full serialized pipeline (vocabulary, merges, normalizer,
    pre-tokenizer, added tokens) when it is a fast tokenizer, else its vocabulary, and special tokens."""
    h = hashlib.sha256(type(tokenizer).__name__.encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    h.update(backend.to_str().encode() if backend is not None else
             json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    h.update(json.dumps({k: str(v) for k, v in tokenizer.special_tokens_map.items()}, sort_keys=True).encode())
    return h.hexdigest()


_CONFIG_NOISE = ("_name_or_path", "transformers_version", "_commit_hash", "torch_dtype", "dtype", "_attn_implementation_autoset")


def config_sha256(model) -> str:
    """Hash of everything in the model's config.json and generation config that can change the
    numbers (sliding window, soft-capping, scaling constants, rope, ...); the folder name, the
    transformers version and the dtype (keyed separately) are left out."""
    def clean(d):
        return {k: v for k, v in sorted(d.items()) if k not in _CONFIG_NOISE}
    src = {"config": clean(model.config.to_dict()), "class": type(model).__name__}
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        src["generation"] = clean(gen.to_dict())
    return sha256_json(src, default=str)


def rows_sha256(pairs: Sequence[Pair]) -> str:
    """Hash of the data rows as scored: (id, x, y) of every row, in order."""
    h = hashlib.sha256()
    for p in pairs:
        h.update(json.dumps([p.id, p.x, p.y]).encode() + b"\n")
    return h.hexdigest()


_ENTRY_FILES = ("per_example.parquet", "per_token.parquet")


def load_entry(key_dir: Path, ids: Sequence[str], n_tokens: int) -> tuple[pd.DataFrame, pd.DataFrame, dict] | None:
    """``(per_example, per_token, settings)`` of the entry in ``key_dir`` for the rows ``ids`` (in order)
    holding ``n_tokens`` y tokens, or None when there is none. An entry that fails its checksums, cannot
    be read or holds other rows or tokens is removed with a warning, and None returned."""
    if not (key_dir / "settings.json").exists():
        return None
    try:
        sums = read_json(key_dir / "checksums.json")
        bad = [f for f in _ENTRY_FILES if sha256_file(key_dir / f) != sums.get(f)]
        if bad:
            raise ValueError(f"checksum mismatch in {', '.join(bad)}")
        per_example = pd.read_parquet(key_dir / "per_example.parquet")
        per_token = pd.read_parquet(key_dir / "per_token.parquet")
        if len(per_example) != len(ids) or per_example["id"].astype(str).tolist() != [str(i) for i in ids]:
            raise ValueError(f"per_example.parquet holds {len(per_example)} rows, not the {len(ids)} rows scored")
        if len(per_token) != n_tokens or int(per_example["n_tokens"].sum()) != n_tokens:
            raise ValueError(f"per_token.parquet holds {len(per_token)} tokens, not the {n_tokens} y tokens scored")
        return per_example, per_token, read_json(key_dir / "settings.json")
    except (OSError, ValueError, KeyError) as e:
        warnings.warn(f"score cache entry {key_dir} is damaged ({type(e).__name__}: {str(e).splitlines()[0]}); "
                      f"dropping it and scoring again")
        shutil.rmtree(key_dir, ignore_errors=True)
        return None


def store_entry(key_dir: Path, per_example: pd.DataFrame, per_token: pd.DataFrame, settings: dict) -> None:
    """Write a cache entry into a temp folder renamed into place; a failure (another writer came first,
    an unwritable cache) is ignored."""
    def write(tmp: Path) -> None:
        per_example.to_parquet(tmp / "per_example.parquet", index=False)
        per_token.to_parquet(tmp / "per_token.parquet", index=False)
        (tmp / "checksums.json").write_text(json.dumps({f: sha256_file(tmp / f) for f in _ENTRY_FILES}))
        (tmp / "settings.json").write_text(json.dumps(settings, sort_keys=True))

    try:
        atomic_write_dir(key_dir, write)
    except OSError:
        pass  # another process stored the same key first, or the cache is not writable: not an error
