"""The ``zfree`` command's path options checked before any output folder is made: an empty path (an
unset ``$OUT``), a name longer than the file system takes, a missing data file or model path, a folder or
device where one JSONL file of pairs is read, an output folder inside an installed package (``zfree.core.paths.check_not_in_package``)."""

from __future__ import annotations

from pathlib import Path

from zfree.core.errors import ConfigError, ModelLoadError
from zfree.core.paths import check_name_length, check_not_in_package, looks_like_hub_id, model_source

#: the options (argparse dests) that name a file, folder or model; positional ones print bare
PATH_ARGS = ("out", "data", "val", "model", "spec", "config", "resume", "src", "base", "init_from", "cache_dir", "study_dir",
             "study", "dir")
POSITIONAL = {("sweep", "spec"), ("report", "study_dir"), ("lab", "study")}
#: the (command, option) pairs that name one JSONL file of pairs (never a folder)
JSONL_ARGS = {("train", "data"), ("train", "val"), ("study", "data"), ("study", "val"), ("score", "data")}


def _given(args):
    """The path options given: ``(dest, flag, value)`` in ``PATH_ARGS`` order."""
    for dest in PATH_ARGS:
        value = getattr(args, dest, None)
        if value is not None:
            yield dest, dest if (args.cmd, dest) in POSITIONAL else "--" + dest.replace("_", "-"), value


def _missing_model_line(flag: str, value) -> str:
    from zfree_lab.run.fetch import KNOWN_MODELS, model_folder  # plain data: no torch

    hint = (f"; {value!r} is a model zfree fetches: `zfree model fetch {value}` puts it in {model_folder(value)}"
            if str(value) in KNOWN_MODELS else "")
    return (f"{flag} {value}: no such file or folder (a model is a transformers folder, a .gguf file or folder, "
            f"or an owner/name hub id){hint}")


def check_path_args(args) -> None:
    """Refuse, naming the option, before any output folder is made and before torch is imported.

    The refusal order (one line each, the first that applies; the commands' own checks come after):

    1. the form of every path given: empty (``--out ""``, as an unset ``$OUT`` gives: it would write
       into the current folder), a name longer than the file system takes, an output folder inside the
       installed package;
    2. what the paths name: an output or run folder that is a file; a JSONL file of pairs (``JSONL_ARGS``) that does not exist, is a folder or
       is a device (/dev/zero), pipe or socket; a ``--model`` path that does not exist and is not an
       ``owner/name`` hub id (``zfree.core.paths.looks_like_hub_id``), or that exists and is no model
       source (``zfree.core.paths.model_source``: a folder with neither config.json nor one .gguf file, a
       file that is not a .gguf).

    A typo'd path is thus refused at once (after torch it took 1-2 minutes on a busy machine); flag
    combinations, spec files, data rows, folder ownership and the model's loading are checked after."""
    for dest, flag, value in _given(args):
        if not str(value).strip():
            raise ConfigError(f"{flag} is empty{' (an unset $OUT?)' if dest == 'out' else ''}: give a "
                              f"{'folder' if dest in ('out', 'resume', 'study_dir', 'cache_dir', 'study', 'dir') else 'path'}"
                              f"{'; it would write into the current folder' if dest == 'out' else ''}")
        check_name_length(value, flag)
        if dest in ("out", "resume", "cache_dir"):
            check_not_in_package(value, flag)
    for dest, flag, value in _given(args):
        path = Path(value)
        if (args.cmd, dest) in JSONL_ARGS:
            if path.is_dir():
                raise ConfigError(f"{flag} {value}: a folder, not a file: give one JSONL file of pairs")
            if not path.exists():
                raise ConfigError(f"{flag} {value}: no such file: give one JSONL file of pairs")
            if not path.is_file():
                raise ConfigError(f"{flag} {value}: not a regular file (a device, pipe or socket, read without "
                                  f"end): give one JSONL file of pairs")
        if dest in ("out", "resume", "study_dir") and path.exists() and not path.is_dir():
            raise ConfigError(f"{flag} {value}: a file, not a folder: give a folder (new, or one zfree wrote)")
        if dest == "model" and not path.exists() and not looks_like_hub_id(str(value)):
            raise ConfigError(_missing_model_line(flag, value))
        if dest == "model" and path.exists():
            try:
                model_source(path)
            except ModelLoadError as e:  # e.g. the folder above the model's, or its tokenizer folder
                why = str(e).split(str(path), 1)[-1].lstrip(": ")
                also = " (a model is a transformers folder, a .gguf file or folder, or an owner/name hub id)"
                raise ConfigError(f"{flag} {value}: {why}{also if why.startswith('has neither') else ''}") from None
