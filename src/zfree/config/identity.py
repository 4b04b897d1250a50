"""A run's identity: "is this the same run", answered in one place.

Two configs are the same run when ``run_identity`` of both is equal: the flat config without the
fields that change only what a run writes beside its numbers (``LOG_ONLY_FIELDS``) and without the
fields added later while they hold the default that reproduces the older runs
(``LATER_FIELD_DEFAULTS``), its folder fields (``zfree.core.paths.PATH_FIELDS``) read as the
caller's question needs: as written, resolved to absolute paths, or as what the folder holds. A
run's id hashes it (``run_hash``); a run folder's same-config check (``zfree.train.run_folder``), a
study's run ids (``zfree_lab.experiment.spec.run_id``) and a run's control lookup
(``zfree_lab.experiment.gains``) all call it.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from zfree.core.io import sha256_file, sha256_json
from zfree.core.paths import PATH_FIELDS, ROOT_PREFIX, resolve_path

#: flat fields that change only what a run writes beside its numbers, never the numbers: left out of
#: a run's identity, so turning one on or off reuses the finished runs, and runs recorded before the
#: field existed
LOG_ONLY_FIELDS = frozenset({"tensorboard", "wandb"})

#: fields added after run ids were first recorded, with the default that reproduces the runs of the
#: versions before them: at that default a field is left out of a run's identity (its id, the
#: same-config check), so finished runs recorded without it keep their ids and are reused; set to
#: anything else it is part of the identity like every other field
LATER_FIELD_DEFAULTS: dict[str, Any] = {"word_dropout": 0.0, "handover_reference": "base", "injection": "embedding",
                                        "compile": False, "latent_capacity": "per_value"}

#: how ``run_identity`` reads the folder fields: as written; resolved against ``base`` (a stored
#: config's run folder, or the working directory: ``zfree.core.paths.resolve_path``); or as what the
#: folder holds (``folder_content``), so a copied or moved study names its runs as before
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
