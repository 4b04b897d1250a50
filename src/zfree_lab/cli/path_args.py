"""The ``zfree`` command's path options checked before any output folder is made: an empty path (an
unset ``$OUT``), a name longer than the file system takes, a folder or device where one JSONL file of
pairs is read, an output folder inside an installed package (``zfree.core.paths.check_not_in_package``)."""

from __future__ import annotations

from pathlib import Path

from zfree.core.errors import ConfigError
from zfree.core.paths import check_name_length, check_not_in_package

#: the options (argparse dests) that name a file, folder or model; positional ones print bare
PATH_ARGS = ("out", "data", "val", "model", "spec", "config", "resume", "src", "base", "init_from", "cache_dir", "study_dir",
             "study", "dir")
POSITIONAL = {("sweep", "spec"), ("report", "study_dir"), ("lab", "study")}
#: the (command, option) pairs that name one JSONL file of pairs (never a folder)
JSONL_ARGS = {("train", "data"), ("train", "val"), ("study", "data"), ("study", "val"), ("score", "data")}


def check_path_args(args) -> None:
    """Refuse, naming the option, a path given empty (``--out ""``, as an unset ``$OUT`` gives:
    it would write into the current folder) or with a name longer than the file system takes, a folder
    or a device (/dev/zero), pipe or socket given where a JSONL file of pairs is read (``JSONL_ARGS``),
    and an output folder inside the installed package, before any output folder is made."""
    for dest in PATH_ARGS:
        value = getattr(args, dest, None)
        if value is None:
            continue
        flag = dest if (args.cmd, dest) in POSITIONAL else "--" + dest.replace("_", "-")
        if not str(value).strip():
            raise ConfigError(f"{flag} is empty{' (an unset $OUT?)' if dest == 'out' else ''}: give a "
                              f"{'folder' if dest in ('out', 'resume', 'study_dir', 'cache_dir', 'study', 'dir') else 'path'}"
                              f"{'; it would write into the current folder' if dest == 'out' else ''}")
        check_name_length(value, flag)
        if dest in ("out", "resume", "cache_dir"):
            check_not_in_package(value, flag)
        if (args.cmd, dest) in JSONL_ARGS and Path(value).is_dir():
            raise ConfigError(f"{flag} {value}: a folder, not a file: give one JSONL file of pairs")
        if (args.cmd, dest) in JSONL_ARGS and Path(value).exists() and not Path(value).is_file():
            raise ConfigError(f"{flag} {value}: not a regular file (a device, pipe or socket, read without end): "
                              f"give one JSONL file of pairs")
