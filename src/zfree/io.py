"""Atomic artifact writes and content hashes (DESIGN §5: writes are atomic, temp file then rename)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch


def _atomic_replace(path: Path, write) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: Path | str, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (a reader sees the old file or the new one, never half)."""
    return _atomic_replace(Path(path), lambda p: p.write_text(text))


def atomic_write_json(path: Path | str, obj: Any) -> Path:
    """Write ``obj`` as indented JSON atomically; non-finite floats are written as null."""
    return atomic_write_text(path, json.dumps(_finite(obj), indent=2, sort_keys=True) + "\n")


def append_jsonl(path: Path | str, row: dict) -> None:
    """Append one JSON row and fsync it (metrics.jsonl grows by whole lines only)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(_finite(row), sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def atomic_write_parquet(path: Path | str, df) -> Path:
    """Write a pandas DataFrame to parquet atomically."""
    return _atomic_replace(Path(path), lambda p: df.to_parquet(p, index=False))


def read_json(path: Path | str) -> Any:
    """The parsed JSON of ``path`` (FileNotFoundError naming it when missing)."""
    return json.loads(Path(path).read_text())


def read_jsonl(path: Path | str) -> list[dict]:
    """The rows of a JSON-lines file, one dict a line (blank lines skipped)."""
    rows = []
    with open(path) as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
    return rows


def sha256_file(path: Path | str) -> str:
    """sha256 of a file's bytes, hex (read in chunks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_state_dict(state: dict[str, torch.Tensor]) -> str:
    """Hash of a model's weights: names, dtypes, shapes and bytes, in sorted name order."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if hasattr(obj, "item") and getattr(obj, "ndim", 1) == 0:
        return _finite(obj.item())
    return obj
