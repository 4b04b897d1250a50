"""zfree_lab: the study application built on the ``zfree`` library.

Specs and presets, the one pipeline, z-free controls and label oracles, budgets and probes, executors
(a local pool, submitit/SLURM), results, the report, widgets and the launch panel, and the ``zfree``
command. The lab imports the library's public names only; the library never imports the lab
(tests/test_packages.py).
"""

from pathlib import Path

from zfree import __version__
from zfree.core.paths import PACKAGES

__all__ = ["__version__"]

# no output folder inside this package either (zfree.core.paths.check_not_in_package)
if (_here := Path(__file__).resolve().parent) not in PACKAGES:
    PACKAGES.append(_here)
