"""A run's identity: "is this the same run", answered in one place (``run_identity``).

Two configs are one run when their flat configs agree outside the logging choices (``LOG_ONLY_FIELDS``)
and the fields added later while at the default that reproduces the older runs (``LATER_FIELD_DEFAULTS``),
their data and base folders read as the question needs. A run folder's same-config check
(``zfree_lab.run.run_folder``), a study's run ids (``run_hash``) and a run's control lookup all ask it.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from zfree.core.io import sha256_file, sha256_json
from zfree.core.paths import PATH_FIELDS, ROOT_PREFIX, resolve_path

#: flat fields that change only what a run writes beside its numbers (its logs; how often it checkpoints by
#: the clock): turning one on or off reuses the runs
LOG_ONLY_FIELDS = frozenset({"tensorboard", "wandb", "checkpoint_every_s"})

#: fields added after run ids were first recorded, with the default that reproduces the older runs: left
#: out at that default (runs recorded without them keep their ids), part of the identity at any other value
LATER_FIELD_DEFAULTS: dict[str, Any] = {"word_dropout": 0.0, "handover_reference": "base", "injection": "embedding",
                                        "compile": False, "latent_capacity": "per_value"}

#: how ``run_identity`` reads the folder fields: as written; resolved against ``base``
#: (``zfree.core.paths.resolve_path``); or as what they hold, so a copied or moved study names its runs as before
FolderForm = Literal["as_written", "resolved", "content"]


def without_log_only(flat: dict[str, Any]) -> dict[str, Any]:
    """``flat`` without its ``LOG_ONLY_FIELDS`` and its ``LATER_FIELD_DEFAULTS`` fields at their
    default (``run_identity`` with the folders as written)."""
    return {k: v for k, v in flat.items()
            if k not in LOG_ONLY_FIELDS and not (k in LATER_FIELD_DEFAULTS and v == LATER_FIELD_DEFAULTS[k])}


def run_identity(cfg, folders: FolderForm = "as_written", base: Path | str | None = None) -> dict[str, Any]:
    """What identifies the run of ``cfg`` (a ``TrainConfig`` or its flat dict): its flat fields
    less ``without_log_only``'s, the folder fields as ``folders`` says (``FolderForm``; "resolved"
    against ``base``, the working directory when None)."""
    flat = without_log_only(cfg.to_flat() if hasattr(cfg, "to_flat") else dict(cfg))
    for key in PATH_FIELDS:
        v = flat.get(key)
        if not isinstance(v, str) or folders == "as_written":
            continue
        if folders == "resolved":
            flat[key] = resolve_path(v, Path.cwd() if base is None else base)
        elif v and not v.startswith(ROOT_PREFIX):  # content: a zfree: path stands for itself
            path = str(Path(v).expanduser().resolve())
            flat[key] = _folder_content(key, path, _stamp(path, key)) or v
    return flat


def run_hash(cfg) -> str:
    """8 hex of the sha256 of ``run_identity(cfg, "content")`` as sorted JSON: the hash in a run's id."""
    return sha256_json(run_identity(cfg, "content"))[:8]


def identity_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The fields, sorted, where two identities (``run_identity``) differ; [] for the same run."""
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


@functools.lru_cache(maxsize=256)
def _folder_content(key: str, path: str, stamp: tuple) -> str | None:
    """What a data folder (its train/val files' sha256) or a base folder (its reference's model and
    tokenizer sha256) holds; None when it does not hold them (the path then stands for itself).
    ``stamp`` (sizes and times of those files) keys the cache."""
    p = Path(path)
    if key == "data_dir":
        files = [p / "train.jsonl", p / "val.jsonl"]
        if not all(f.is_file() for f in files):
            return None
        return "data:" + hashlib.sha256(":".join(sha256_file(f) for f in files).encode()).hexdigest()
    try:
        ref = json.loads((p / "reference" / "reference.json").read_text())
        return f"base:{ref['model_sha256']}:{ref['tokenizer_sha256']}"
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _stamp(path: str, key: str) -> tuple:
    files = ("train.jsonl", "val.jsonl") if key == "data_dir" else ("reference/reference.json",)
    out = []
    for name in files:
        try:
            st = (Path(path) / name).stat()
            out.append((st.st_size, st.st_mtime_ns))
        except OSError:
            out.append(None)
    return tuple(out)
