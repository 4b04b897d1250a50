"""A run folder's config and summary records read without torch (the report, ``zfree status`` and the
study tables read them; ``zfree_lab.run.run_folder`` writes them and re-exports these names): the use
threshold, the timing keys, the latent-meaning file names, and the portable path fields of config.json (``zfree.core.paths.portable_path``)."""

from __future__ import annotations

import json
from pathlib import Path

from zfree.core.errors import InputError
from zfree.core.io import read_json
from zfree.core.paths import PATH_FIELDS, portable_path, resolve_path

#: a run "uses z" (summary ``latent_used``) when more than this fraction of its validation rows
#: does; ``predicted_latent_used`` applies it to the predicted fraction (zfree_lab.report.report reads it)
USE_THRESHOLD = 0.5
#: a run folder's files of what z learned (``zfree_lab.run.latent_meaning.write_latent_meaning``)
MEANING_FILE = "latent_meaning.json"
MEANING_TABLE = "latent_meaning.parquet"
#: the only summary keys that differ between a resumed and an uninterrupted run (wall seconds)
TIMING_KEYS = ("wall_s", "compute/train_wall_s", "compute/first_step_s", "decode/samples_s", "multiref/decode_s",
               "compute/device_peak_bytes", "compute/device_total_bytes")


def portable_flat(flat: dict, out: Path) -> dict:
    """``flat`` with its path fields in the stored form for run folder ``out``."""
    return {**flat, **{k: portable_path(flat[k], out) for k in PATH_FIELDS if isinstance(flat.get(k), str)}}


def resolved_flat(flat: dict, base: Path) -> dict:
    """``flat`` (a stored config or summary) with its path fields resolved against ``base``."""
    return {**flat, **{k: resolve_path(flat[k], base) for k in PATH_FIELDS if isinstance(flat.get(k), str)}}


PATH_BASE = "_paths_relative_to"  # the config.json key that marks portable paths


def read_run_config(config_file: Path | str) -> dict:
    """A run folder's config.json as a flat config ("_" keys dropped) with absolute paths: relative
    path fields resolve against the run folder (written so since ``PATH_BASE``; older records
    hold absolute paths). Also valid for a plain config file (relative paths stay as written).
    Raises FileNotFoundError when it is missing, InputError in one line naming the file when it is
    not a JSON object."""
    f = Path(config_file)
    try:
        raw = read_json(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{f}: not a run config (not JSON: {e}); move it away or train into another folder") from None
    if not isinstance(raw, dict):
        raise InputError(f"{f}: not a run config (a JSON object expected, got {type(raw).__name__})")
    flat = {k: v for k, v in raw.items() if not str(k).startswith("_")}
    return resolved_flat(flat, f.parent) if raw.get(PATH_BASE) == "run folder" else flat
