"""Checkpoint primitives that never load executable code from a run folder (docs/reference/artifacts.md).

Plain state (tensors in safetensors, the structure in JSON), older state.pt files read weights-only,
and checkpoint folders with a ``COMPLETE`` manifest (sizes, sha256) swapped in by renames."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zfree.core.errors import CheckpointError
from zfree.core.io import atomic_replace, atomic_write_text, sha256_file

# torch is imported inside the functions that need it (lazy, as in zfree.core.io)
if TYPE_CHECKING:
    import torch


def safe_torch_load(path: Path | str) -> Any:
    """``torch.load(path, weights_only=True, map_location="cpu")``: tensors and plain containers
    only, so a crafted pickle cannot run code (it is refused instead).

    Raises ``CheckpointError`` naming ``path`` for a missing, empty, truncated or non-plain file.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path} is empty")
    import torch  # lazy: see the module's imports

    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except Exception as e:  # noqa: BLE001 - UnpicklingError, EOFError, RuntimeError (zip), ...
        raise CheckpointError(f"{path} cannot be loaded as plain tensors ({type(e).__name__}: "
                              f"{str(e).splitlines()[0][:300] if str(e) else ''})") from None


_TENSOR, _DICT, _TUPLE, _FLOAT = "__tensor__", "__dict__", "__tuple__", "__float__"


def _pack(obj: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    import torch  # lazy: see the module's imports

    if isinstance(obj, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = obj.detach().cpu().contiguous().clone()
        return {_TENSOR: key}
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {_FLOAT: repr(obj)}
    if isinstance(obj, dict):
        for k in obj:
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise TypeError(f"{where}: dict key {k!r} must be a str or int to store as plain state")
        return {_DICT: [[k, _pack(v, tensors, f"{where}.{k}")] for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        packed = [_pack(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]
        return {_TUPLE: packed} if isinstance(obj, tuple) else packed
    raise TypeError(f"{where}: {type(obj).__name__} is not plain state (tensor, dict, list, tuple, "
                    "str, int, float, bool, None); convert it before saving")


def _unpack(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, list):
        return [_unpack(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if _TENSOR in obj:
            return tensors[obj[_TENSOR]]
        if _FLOAT in obj:
            return float(obj[_FLOAT])
        if _TUPLE in obj:
            return tuple(_unpack(v, tensors) for v in obj[_TUPLE])
        return {k: _unpack(v, tensors) for k, v in obj[_DICT]}
    return obj


#: the OS error inside a SafetensorError (no OSError, no file name): before safetensors 0.8 Rust's Debug
#: form ``IoError(Os { code: 28, ...``, from 0.8 its Display form ``I/O error: ... (os error 28)``
_SAFETENSORS_OS_ERROR = re.compile(r"IoError\(Os \{ code: (\d+)|\(os error (\d+)\)")


def safetensors_os_error(e: Exception, path: Path | str) -> Exception:
    """A SafetensorError of an I/O failure (a full disk, a quota, a read-only file system) as the
    OSError it was, naming ``path`` (the error names no file); any other error as it is."""
    m = _SAFETENSORS_OS_ERROR.search(str(e))
    if not m:
        return e
    code = int(m.group(1) or m.group(2))
    return OSError(code, os.strerror(code), str(path))


def save_plain_state(folder: Path | str, state: Any, name: str = "state") -> None:
    """Store a nest of tensors, dicts (str or int keys), lists, tuples and JSON scalars (an
    optimizer ``state_dict()``, ``np.random.Generator.bit_generator.state``,
    ``torch.get_rng_state()``, a dataclass as ``asdict``) as ``<name>.safetensors`` (the tensors)
    plus ``<name>.json`` (the structure), each written atomically. No pickle: loading it cannot
    run code. Raises TypeError naming the key path of anything else (e.g. a numpy scalar).
    """
    from safetensors.torch import save_file  # lazy: it imports torch (see the module's imports)

    folder = Path(folder)
    tensors: dict[str, torch.Tensor] = {}
    skeleton = _pack(state, tensors, name)
    from safetensors import SafetensorError

    try:
        atomic_replace(folder / f"{name}.safetensors", lambda p: save_file(tensors, str(p)))
    except SafetensorError as e:  # its I/O errors (disk full) are no OSError and name no file
        raise safetensors_os_error(e, folder / f"{name}.safetensors") from None
    atomic_write_text(folder / f"{name}.json", json.dumps(skeleton) + "\n")


def load_plain_state(folder: Path | str, name: str = "state") -> Any:
    """Inverse of ``save_plain_state`` (tensors come back on CPU, equal bit for bit).
    Raises ``CheckpointError`` naming the file when either file is missing, empty or damaged."""
    from safetensors.torch import load_file  # lazy: it imports torch (see the module's imports)

    folder = Path(folder)
    st, js = folder / f"{name}.safetensors", folder / f"{name}.json"
    for f in (st, js):
        if not f.is_file() or f.stat().st_size == 0:
            raise CheckpointError(f"{f} is {'missing' if not f.is_file() else 'empty'}")
    try:
        tensors = load_file(str(st))
    except Exception as e:  # noqa: BLE001 - SafetensorError carries no file name
        raise CheckpointError(f"{st} is damaged ({type(e).__name__}: {e})") from None
    try:
        return _unpack(json.loads(js.read_text()), tensors)
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{js} is damaged ({type(e).__name__}: {e})") from None


def read_plain_structure(folder: Path | str, name: str = "state") -> Any:
    """The structure ``save_plain_state`` wrote (``<name>.json``) with every tensor as None, without reading
    the tensors (a status line of a 2 GB checkpoint). CheckpointError naming the file when it is missing
    or damaged."""
    js = Path(folder) / f"{name}.json"
    try:
        return _unpack(json.loads(js.read_text()), _NoTensors())
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{js} cannot be read ({type(e).__name__}: {e})") from None


class _NoTensors(dict):
    def __missing__(self, key):
        return None


MANIFEST = "COMPLETE"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_checkpoint_dir(final: Path | str, write, previous: Path | str | None = None) -> Path:
    """Write a new checkpoint folder beside the last good one and switch to it.

    ``write(tmp_dir)`` fills a fresh temporary folder; then a manifest ``COMPLETE`` (every
    file's size and sha256) is written and fsynced, the old ``previous`` folder (default
    ``<final>.prev``) is removed, ``final`` is renamed to ``previous`` and the temporary folder
    to ``final``. At every instant at least one complete checkpoint exists (``final`` or
    ``previous``): a kill loses at most the newest one. If ``write`` raises, nothing existing is
    touched. Returns ``final``.
    """
    final = Path(final)
    previous = Path(previous) if previous is not None else final.with_name(final.name + ".prev")
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        write(tmp)
        manifest = {}
        for f in sorted(p for p in tmp.rglob("*") if p.is_file()):
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
            manifest[str(f.relative_to(tmp))] = {"bytes": f.stat().st_size, "sha256": sha256_file(f)}
        with open(tmp / MANIFEST, "w") as fh:
            fh.write(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        _fsync_dir(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        shutil.rmtree(previous, ignore_errors=True)
        final.rename(previous)
    tmp.rename(final)
    _fsync_dir(final.parent)
    return final


def verify_checkpoint_dir(folder: Path | str) -> None:
    """Check a checkpoint folder against its ``COMPLETE`` manifest; ``CheckpointError`` names the first
    missing, truncated or altered file (or the missing manifest)."""
    folder = Path(folder)
    m = folder / MANIFEST
    if not m.is_file():
        raise CheckpointError(f"{folder} is not a complete checkpoint ({m} is missing)")
    try:
        manifest = json.loads(m.read_text())
    except ValueError:  # the old layout wrote "ok\n": no per-file record to check against
        manifest = None
    if not isinstance(manifest, dict):
        return
    for rel, rec in manifest.items():
        f = folder / rel
        if not f.is_file():
            raise CheckpointError(f"{f} is missing from checkpoint {folder}")
        if f.stat().st_size != rec.get("bytes") or sha256_file(f) != rec.get("sha256"):
            raise CheckpointError(f"{f} does not match its manifest {m} (truncated or altered)")


def load_checkpoint_dir(candidates: list[Path | str], load, warn=None) -> tuple[Path, Any] | None:
    """Load the newest usable checkpoint: for each folder of ``candidates`` in order (e.g.
    ``[run/checkpoint, run/checkpoint.prev]``) that exists, ``verify_checkpoint_dir`` it and call
    ``load(folder)``; a folder that fails (``CheckpointError`` or any exception from ``load``) is
    reported through ``warn`` (default ``warnings.warn``) naming the file, and the next is tried.

    Returns ``(folder, load(folder))``, or None when no candidate exists; ``CheckpointError`` listing
    every failure when none loads. ``load`` must only read, so a failed candidate leaves no partial state.
    """
    warn = warn or (lambda msg: warnings.warn(msg, stacklevel=3))
    failures = []
    for d in map(Path, candidates):
        if not d.exists():
            continue
        try:
            verify_checkpoint_dir(d)
            return d, load(d)
        except Exception as e:  # noqa: BLE001 - any failure falls back to the previous checkpoint
            msg = str(e) if isinstance(e, CheckpointError) else f"{d}: {type(e).__name__}: {e}"
            failures.append(msg)
            warn(f"checkpoint {d} cannot be used, trying the previous one: {msg}")
    if failures:
        raise CheckpointError("no usable checkpoint: " + "; ".join(failures)
                              + " (delete the checkpoint folders to restart the run from step 0)")
    return None
