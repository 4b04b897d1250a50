"""Where zfree's shipped files live, and the file names it relies on (defined once)."""

from __future__ import annotations

import os
from pathlib import Path

from zfree.core.errors import ConfigError, ModelLoadError

_PACKAGE = Path(__file__).resolve().parents[1]  # src/zfree in a clone, site-packages/zfree in a wheel
#: the installed package: no output folder may lie inside it (``check_not_in_package``)
PACKAGE = _PACKAGE
#: the installed packages no output folder may lie inside (an application adds its own on import)
PACKAGES: list[Path] = [PACKAGE]
#: in a wheel, the clone's files that runs need (notebooks, shipped data, specs), copied by setup.py
INSTALLED_ROOT = _PACKAGE / "_shipped"
#: True in a clone (an editable install: the files are the clone's own), False in an installed wheel
IN_CLONE = not INSTALLED_ROOT.is_dir()
#: the repository root in a clone, ``INSTALLED_ROOT`` in a wheel: every path below and every stored
#: ``zfree:<path>`` resolves against it
ROOT = _PACKAGE.parents[1] if IN_CLONE else INSTALLED_ROOT
NOTEBOOKS = ROOT / "notebooks"
SPECS = ROOT / "analysis" / "sweeps"
PRESET_SPECS = ROOT / "analysis" / "studies" / "presets"  # one YAML file per `zfree study --preset`
SHIPPED_DATA = ROOT / "data" / "synth" / "default"
SHIPPED_BASE = ROOT / "data" / "base" / "default"
SHIPPED_E2E = ROOT / "data" / "e2e"  # the E2E real-text benchmark (CC BY-SA 4.0) and its base in base/

#: a model folder holds a tokenizer when it has one of these files (transformers 5 would invent an empty one)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "tokenizer.model",
                   "spiece.model", "merges.txt")

#: the longest file or folder name, and path, the common file systems take (ext4, xfs, btrfs, APFS,
#: NTFS: 255 bytes a name; Linux: 4096 bytes a path); ``check_name_length`` refuses longer ones
NAME_MAX, PATH_MAX = 255, 4096


def check_name_length(path: Path | str, what: str, *, extra: int = 0) -> None:
    """ConfigError naming ``what`` when a name in ``path`` is longer than ``NAME_MAX`` bytes (UTF-8)
    or the whole path than ``PATH_MAX`` (the OSError "File name too long" otherwise met mid-run);
    ``extra``: bytes zfree adds to the last name (a ``sweep-`` prefix)."""
    text = str(path)
    for part in Path(text).parts:
        n = len(part.encode("utf-8", "surrogatepass")) + (extra if part == Path(text).name else 0)
        if n > NAME_MAX:
            shown = part if len(part) <= 40 else part[:20] + "..." + part[-12:]
            raise ConfigError(f"{what}: the name {shown!r} is {n} bytes{f' (with {extra} added)' if extra else ''}; "
                              f"file systems allow at most {NAME_MAX} bytes a name: choose a shorter one")
    if len(text.encode("utf-8", "surrogatepass")) > PATH_MAX:
        raise ConfigError(f"{what}: the path is {len(text.encode('utf-8', 'surrogatepass'))} bytes; "
                          f"file systems allow at most {PATH_MAX} bytes a path")


def check_out_dir(out: Path | str, what: str = "out_dir") -> None:
    """ConfigError for an output folder given as an empty string (an unset variable): ``Path("")``
    is the current folder, which zfree would fill (and whose ``runs/`` it would reuse)."""
    if isinstance(out, str) and not out.strip():
        raise ConfigError(f"{what} is empty: give a folder (an empty path would write into the current folder)")


def check_not_in_package(out: Path | str, what: str = "out_dir") -> None:
    """ConfigError naming ``what`` and the folder when output folder ``out`` lies inside an installed
    package (``PACKAGES``, symlinks resolved): a reinstall or ``git clean`` would take the files."""
    p = Path(out).expanduser().resolve()
    for package in PACKAGES:
        if p.is_relative_to(package):
            raise ConfigError(f"{what} {out}: inside the installed {package.name} package ({package}); a run or "
                              f"study would write its files among {package.name}'s modules: give a folder outside it")


# ---------------------------------------------------------------------------- portable paths

PATH_FIELDS = ("data_dir", "base_dir")  # the TrainConfig fields that name folders
ROOT_PREFIX = "zfree:"  # a path inside the zfree repository (or a wheel's INSTALLED_ROOT), written from ROOT


def portable_root(run_dir: Path | str) -> Path:
    """The folder a run folder's relative paths may point into: the study/sweep folder (the parent
    of ``runs/``) for ``<study>/runs/<id>``, else the run folder's parent."""
    run_dir = Path(run_dir).resolve()
    return run_dir.parent.parent if run_dir.parent.name == "runs" else run_dir.parent


def portable_path(value: str, run_dir: Path | str) -> str:
    """How a run folder stores path ``value`` (absolute, or relative to the working directory):
    relative to ``run_dir`` (posix, e.g. "../../data") when it lies inside
    ``portable_root(run_dir)``, so the study can be copied or moved; ``zfree:<path from ROOT>``
    when it lies inside this repository (the shipped benchmark and base run), so another clone, or
    an installed wheel, resolves it to its own copy; else absolute. Inverse: ``resolve_path``."""
    p, run_dir = Path(value).resolve(), Path(run_dir).resolve()
    if p.is_relative_to(portable_root(run_dir)):
        return Path(os.path.relpath(p, run_dir)).as_posix()
    if p.is_relative_to(ROOT):
        return ROOT_PREFIX + p.relative_to(ROOT).as_posix()
    return str(p)


def resolve_path(value: str, base: Path | str) -> str:
    """The absolute path (symlinks resolved) of a stored or given path: ``zfree:<rel>`` under
    ROOT, a relative path under ``base`` (the run folder for a stored one, the working directory
    for a user's), an absolute one as is."""
    if value.startswith(ROOT_PREFIX):
        return str((ROOT / value[len(ROOT_PREFIX):]).resolve())
    return str((Path(base) / value).resolve())


def resolve_given(value: str) -> str:
    """The absolute path of a data or base folder as a user names it (a sweep spec, a config file,
    ``--set``): ``zfree:<rel>`` under ROOT; a relative path under the working directory when it exists
    there, else under ROOT (``data/synth/default`` is the shipped benchmark from any folder, in a
    clone or from a wheel); an absolute one as is."""
    path = Path(value)
    if value.startswith(ROOT_PREFIX) or path.is_absolute() or path.exists():
        return resolve_path(value, Path.cwd())
    return str((ROOT / path).resolve())


def runs_home() -> Path:
    """The ``runs/`` folder a notebook looks in for the latest study: ``$ZFREE_RUNS`` when set (``zfree
    lab`` sets it), else the clone's, or with a wheel the working directory's."""
    if os.environ.get("ZFREE_RUNS"):
        return Path(os.environ["ZFREE_RUNS"])
    return (ROOT if IN_CLONE else Path.cwd()) / "runs"


def looks_like_hub_id(source: str) -> bool:
    """Whether a model source that is not an existing path reads as an ``owner/name`` hub id: one slash,
    both sides non-empty, not starting with ``.``, ``/`` or ``~`` (``model_source``
    loads it so; the command line refuses any other missing ``--model`` path before it imports torch)."""
    return source.count("/") == 1 and not source.startswith((".", "/", "~")) and all(source.split("/"))


def model_source(source: Path | str) -> tuple[str, str | None, str]:
    """Where a model loads from, read from the path alone (no torch): ``(path_or_id, gguf_file or None, kind)``,
    kind in folder / gguf / hub.

    A ``.gguf`` file, or a folder without config.json that holds exactly one ``.gguf`` file, is a GGUF
    source; a folder with config.json is a transformers folder; a string that is not an existing path but
    ``looks_like_hub_id`` is a hub id. Raises FileNotFoundError for a path that does not exist, ModelLoadError
    for another file than a .gguf and for a folder with several or no loadable files."""
    p = Path(source)
    if p.is_file():
        if p.suffix != ".gguf":
            raise ModelLoadError(f"model {p}: a file must be a .gguf file (or pass the model folder)")
        return str(p.parent), p.name, "gguf"
    if p.is_dir():
        if (p / "config.json").exists():
            return str(p), None, "folder"
        ggufs = sorted(f.name for f in p.glob("*.gguf"))
        if len(ggufs) == 1:
            return str(p), ggufs[0], "gguf"
        if len(ggufs) > 1:
            raise ModelLoadError(f"model folder {p} holds several .gguf files ({', '.join(ggufs)}): pass one file")
        raise ModelLoadError(f"model folder {p} has neither config.json nor a .gguf file")
    if looks_like_hub_id(str(source)):
        return str(source), None, "hub"
    raise FileNotFoundError(f"model folder {p} does not exist")
