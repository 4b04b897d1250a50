"""Atomic artifact writes (temp file, then rename), readers of records and tables, content hashes
(docs/reference/artifacts.md)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zfree.core.errors import InputError

# torch is imported lazily: zfree.config imports this module and `zfree --help` reads zfree.config
if TYPE_CHECKING:
    import torch


def atomic_replace(path: Path, write) -> Path:
    """Replace the file ``path`` atomically: ``write(tmp)`` writes a temporary file beside it (same
    folder, created with its parents), which is made mode 0644 and renamed over ``path``; if
    ``write`` raises, the temporary file is removed and ``path`` is untouched. Returns ``path``."""
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


def atomic_write_dir(path: Path | str, write) -> Path:
    """Fill a new folder ``path`` atomically: ``write(tmp)`` fills a temporary folder beside it,
    which is then renamed to ``path`` (a reader sees no folder or a complete one). The temporary
    folder is removed on any error; an OSError (e.g. ``path`` exists: another writer came first)
    propagates."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the folder is shared as a normal one
        write(tmp)
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def atomic_write_text(path: Path | str, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (a reader sees the old file or the new one, never half)."""
    return atomic_replace(Path(path), lambda p: p.write_text(text))


def atomic_write_json(path: Path | str, obj: Any) -> Path:
    """Write ``obj`` as indented JSON atomically; non-finite floats are written as null."""
    return atomic_write_text(path, json.dumps(_finite(obj), indent=2, sort_keys=True) + "\n")


def append_jsonl(path: Path | str, row: dict) -> None:
    """Append one JSON row and fsync it (metrics.jsonl grows by whole lines only). A symlink at
    ``path`` is never written through: it is replaced by a new regular file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with open(fd, "a") as f:
        f.write(json.dumps(_finite(row), sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def atomic_write_parquet(path: Path | str, df) -> Path:
    """Write a pandas DataFrame to parquet atomically."""
    return atomic_replace(Path(path), lambda p: df.to_parquet(p, index=False))


def read_record(path: Path | str) -> dict:
    """A JSON object zfree can rebuild (timings.json, controls.json): {} when the file is missing, and
    {} with a warning naming the file when it is not a JSON object (the caller then writes it anew)."""
    p = Path(path)
    if not p.exists():
        return {}
    try:
        obj = json.loads(p.read_text())
    except (OSError, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        obj = e
    if isinstance(obj, dict):
        return obj
    why = f"{type(obj).__name__}: {str(obj).splitlines()[0][:120]}" if isinstance(obj, Exception) else \
        f"a JSON object expected, got {type(obj).__name__}"
    warnings.warn(f"{p}: unreadable ({why}); it is written anew", stacklevel=2)
    return {}


def read_json(path: Path | str) -> Any:
    """The parsed JSON of ``path`` (FileNotFoundError naming it when missing)."""
    return json.loads(Path(path).read_text())


def read_json_object(path: Path | str) -> dict | None:
    """The JSON object in ``path``, or None when the file is missing, unreadable, not JSON or not an object:
    for a file another process may be writing, or one whose absence is a state (a run not finished yet)."""
    try:
        obj = json.loads(Path(path).read_text())
    except (OSError, ValueError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None
    return obj if isinstance(obj, dict) else None


def read_table(path: Path | str, columns: list[str] | None = None):
    """A parquet table a run or a reference wrote (``pandas.read_parquet``). InputError naming the file
    and why when it is missing, unreadable or lacks ``columns`` (the folder is not whole)."""
    import pandas as pd

    p = Path(path)
    hint = f"the folder {p.parent} is not whole: rerun it (zfree train --resume {p.parent}) or move it away"
    if not p.is_file():
        raise InputError(f"{p}: missing; {hint}")
    try:
        return pd.read_parquet(p, columns=columns)
    except Exception as e:  # noqa: BLE001 - pyarrow's many errors of a torn or foreign file: one line
        reason = " ".join(str(e).split())[:200]
        raise InputError(f"{p}: unreadable ({type(e).__name__}: {reason}); {hint}") from None


def read_jsonl(path: Path | str, drop_torn_tail: bool = False) -> list[dict]:
    """The rows of a JSON-lines file, one dict a line (blank lines skipped). ``InputError`` naming file and
    line for a line that is not JSON; with ``drop_torn_tail`` a torn last line (no newline, not JSON) is
    dropped with a warning instead."""
    rows = []
    with open(path, encoding="utf-8-sig") as f:
        lines = f.readlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError as e:
            if drop_torn_tail and i == len(lines) and not line.endswith("\n"):
                warnings.warn(f"{path}: dropped a torn last line {i} ({len(line)} characters without "
                              f"their newline: a writer stopped mid-line)", stacklevel=2)
                break
            raise InputError(f"{path}:{i}: not a JSON line ({e})") from None
    return rows


def sha256_file(path: Path | str) -> str:
    """sha256 of a file's bytes, hex (read in chunks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_json(obj: Any, default=None) -> str:
    """sha256 of ``json.dumps(obj, sort_keys=True, default=default)`` (UTF-8), hex: a content key."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=default).encode()).hexdigest()


def sha256_state_dict(state: dict[str, torch.Tensor]) -> str:
    """Hash of a model's weights: names, dtypes, shapes and bytes, in sorted name order."""
    import torch  # lazy: see the module's imports

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


def nonfinite_keys(obj: Any, prefix: str = "") -> list[str]:
    """Dotted key paths of every non-finite float (or 0-d tensor) in a nest of dicts/lists,
    e.g. an evaluation's metrics; empty when all are finite."""
    if isinstance(obj, dict):
        return [k for key, v in obj.items() for k in nonfinite_keys(v, f"{prefix}{key}.")]
    if isinstance(obj, (list, tuple)):
        return [k for i, v in enumerate(obj) for k in nonfinite_keys(v, f"{prefix}{i}.")]
    if hasattr(obj, "item") and getattr(obj, "ndim", 1) == 0:
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return [prefix.rstrip(".")]
    return []


def read_yaml(path: Path | str) -> Any:
    """``yaml.safe_load`` of ``path`` (every spec): InputError naming ``file:line:column`` for bad YAML,
    a tag that is not plain data (``!!python/object/apply`` ...) or text that is not UTF-8."""
    import yaml  # lazy: only the spec readers need it

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text at byte {e.start}") from None
    try:
        return yaml.safe_load(text)
    except RecursionError:
        raise InputError(f"{path}: not valid YAML: nested too deeply") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        if isinstance(e, yaml.constructor.ConstructorError):
            problem += " (a spec holds plain YAML data only: mappings, lists, strings and numbers, no tags)"
        hint = " (indent with spaces: YAML does not allow tabs)" if "\t" in problem or "\\t" in problem else ""
        raise InputError(f"{where}: not valid YAML: {problem.replace(chr(9), '<tab>')}{hint}") from None
