"""The repository's scripts (analysis/, docs/), which are files rather than modules of the package, imported
by path for their tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def load_script(path: Path | str, name: str) -> ModuleType:
    """The script at ``path`` executed as a module named ``name`` (not added to ``sys.modules``)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
