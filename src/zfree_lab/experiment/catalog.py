"""Every preset of ``zfree study``: one YAML spec file each in ``analysis/studies/presets/``
(``zfree.core.paths.PRESET_SPECS``; a new preset is one file there). ``zfree_lab.experiment.spec_file``
loads their specs (``zfree_lab.experiment.study.PRESETS``, ``zfree_lab.experiment.own_study.OWN_PRESETS``);
this module reads only their plain YAML, so ``zfree study --help`` stays fast (no torch): each file's
``catalog`` (runs, what, cost), whether it needs your model (``base: {kind: pretrained}``) and the
model and data files of a preset ``bound`` to a model zfree fetches. ``tests/test_presets.py`` checks
every file's runs against its expanded grid."""

from __future__ import annotations

import functools
import textwrap
from dataclasses import dataclass
from pathlib import Path

from zfree.core.errors import ConfigError
from zfree.core.io import read_yaml
from zfree.core.paths import PRESET_SPECS, ROOT, ROOT_PREFIX

#: the budget an own-data preset is sized to when --budget is not given (practical by default)
DEFAULT_OWN_BUDGET = "20m"


@dataclass(frozen=True)
class PresetEntry:
    """One preset as ``zfree study --help`` lists it."""
    runs: int  # its CVAE runs (the z-free controls and oracles not counted)
    what: str  # what it runs, one line
    cost: str  # its wall time measured on 2 CPU cores (README "Presets of zfree study")
    own: bool  # its base is a pretrained model given at run time (--model and --data), unless bound
    bound: tuple[str, Path, Path] | None = None  # the model zfree fetches, the train and val files


def preset_files() -> dict[str, Path]:
    """Preset name (the file's stem) -> its spec file, sorted by name."""
    return {p.stem: p for p in sorted(PRESET_SPECS.glob("*.yaml"), key=lambda p: p.stem)}


def _text(path: Path, key: str, v) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ConfigError(f"{path}: {key}={v!r} must be a line of text")
    return v


def _shipped(path: Path, key: str, v) -> Path:
    """A bound preset's file: ``zfree:<path>`` under ROOT."""
    if not isinstance(v, str) or not v.startswith(ROOT_PREFIX):
        raise ConfigError(f"{path}: {key}={v!r} must be a shipped file, written zfree:<path>")
    return ROOT / v[len(ROOT_PREFIX):]


def read_entry(path: Path) -> PresetEntry:
    """The ``PresetEntry`` of a preset file: its ``catalog: {runs, what, cost}``, its base's kind and
    its ``bound: {model, data, val}`` (optional). Raises ConfigError naming the file and the key."""
    raw = read_yaml(path)
    cat = raw.get("catalog") if isinstance(raw, dict) else None
    if not isinstance(cat, dict) or set(cat) != {"runs", "what", "cost"}:
        raise ConfigError(f"{path}: catalog must be a mapping with keys cost, runs and what (zfree study --help); "
                          f"got {cat!r}")
    runs = cat["runs"]
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise ConfigError(f"{path}: catalog.runs={runs!r} must be an integer >= 1")
    bound = raw.get("bound")
    if bound is not None:
        if not isinstance(bound, dict) or set(bound) != {"model", "data", "val"}:
            raise ConfigError(f"{path}: bound must be a mapping with keys data, model and val; got {bound!r}")
        bound = (_text(path, "bound.model", bound["model"]), _shipped(path, "bound.data", bound["data"]),
                 _shipped(path, "bound.val", bound["val"]))
    base = raw.get("base")
    own = isinstance(base, dict) and base.get("kind") == "pretrained"
    return PresetEntry(runs, _text(path, "catalog.what", cat["what"]), _text(path, "catalog.cost", cat["cost"]),
                       own, bound)


@functools.cache
def preset_catalog() -> dict[str, PresetEntry]:
    """Every preset file's ``PresetEntry``, by name (``preset_files``' order), read once. Raises
    ConfigError naming the file and the key of a bad catalog or bound (``read_entry``), InputError for
    a file that is not YAML."""
    return {name: read_entry(path) for name, path in preset_files().items()}


def preset_help(width: int = 100) -> str:
    """The presets as ``zfree study --help`` prints them: per preset a line with its name, its runs and
    its cost, then what it runs, wrapped to ``width`` and indented (the names are of any length)."""
    cat = preset_catalog()
    name_w = max(len(n) for n in cat)
    lines = textwrap.wrap(
        "presets (runs: the CVAE runs, or oracle arms, the preset trains as it is, its own seeds included; "
        "--seeds trains each once per seed given; the study adds a z-free control per recipe and, on labelled "
        "data, an oracle and its null per label. cost: on 2 CPU cores; every study first prints its own "
        "estimate):", width)
    for name, e in cat.items():
        lines += textwrap.wrap(f"{name:<{name_w}}  {e.runs:>3} {'run' if e.runs == 1 else 'runs':<4}  cost: {e.cost}",
                               width, initial_indent="  ", subsequent_indent=" " * (name_w + 19))
        lines += textwrap.wrap(e.what, width, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return "\n".join(lines)


def preset_option_help() -> str:
    """The ``--preset`` option's help: the presets that run as they are (a bound one fetches its
    model), then those that need ``--model``."""
    cat = preset_catalog()
    alone = [n + (" (fetches its model)" if e.bound else "") for n, e in cat.items() if not e.own or e.bound]
    own = [n for n, e in cat.items() if e.own and not e.bound]
    return " | ".join(alone) + "; with --model: " + " | ".join(own)
