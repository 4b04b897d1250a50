"""``zfree lab``: JupyterLab on the shipped notebooks, from a clone or an installed wheel.

The notebooks are copied into a folder the user owns (``DEFAULT_DIR`` under the working directory,
never inside the installed package: a wheel's notebooks sit in site-packages), files already there
kept. The copies are the notebooks alone, without their jupytext pairing (``lab_copy``): in the
repository each ``.ipynb`` is paired with its reviewed ``.py`` twin, but in a lab folder a twin
written beside every saved notebook is clutter, and a stale twin would win over a fresh copy (a
notebook deleted to get the shipped one back would reopen with the old twin's cells). JupyterLab
starts on that folder with this project's contents manager (``zfree_lab.report.lab_contents``:
notebooks open without being marked unsaved) and its save hook (``zfree_lab.report.lab.strip_on_save``:
saved notebooks keep no outputs, as ``make lab`` saves them; the explorer is a tool to rerun, not a
record, and a rerun shows its figures again), both on the command line since a wheel has no
``etc/jupyter`` to load them from; the explorer
(``explore.ipynb``) opens on the chosen study through ``$ZFREE_STUDY`` and lists the studies under
``$ZFREE_RUNS``, the ``runs/`` of where the command was typed (``zfree.core.paths.runs_home``), not
of the lab folder its kernel runs in. ``lab_plan`` computes all of it without starting anything.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from zfree.core.errors import ConfigError, InputError
from zfree.core.paths import NOTEBOOKS, PACKAGES, runs_home

#: the lab folder under the working directory when none is given
DEFAULT_DIR = "zfree-lab"
#: the extra that installs JupyterLab (pyproject.toml's [project.optional-dependencies] lab)
LAB_EXTRA = "install zfree's lab extra: pip install 'zfree[lab]' (from a wheel file: pip install 'dist/zfree-….whl[lab]')"
#: the contents manager JupyterLab runs with (a dotted name, imported by the server)
CONTENTS_MANAGER = "zfree_lab.report.lab_contents.LabContentsManager"
#: the contents manager's save hook: notebooks saved without outputs (as etc/jupyter/jupyter_server_config.py)
SAVE_HOOK = "zfree_lab.report.lab.strip_on_save"


@dataclass
class LabPlan:
    """What ``zfree lab`` runs: ``argv`` with ``env`` (the variables it sets, on top of the
    caller's), JupyterLab's root ``folder``, and the notebooks ``copied`` there or ``kept`` (already
    there: the user's, never overwritten)."""

    argv: list[str]
    env: dict[str, str]
    folder: Path
    copied: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)

    def command_line(self) -> str:
        """The command as one shell line: the variables, then the program and its arguments."""
        import shlex

        return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in self.env.items()), shlex.join(self.argv)])


def check_jupyterlab() -> None:
    """InputError, in one line naming the extra, when JupyterLab is not installed."""
    if importlib.util.find_spec("jupyterlab") is None:
        raise InputError(f"JupyterLab is not installed in this environment ({sys.prefix}); {LAB_EXTRA}")


def _installed_places() -> list[Path]:
    """Folders a lab folder must not be in: the zfree and zfree_lab packages (a wheel's notebooks are in
    zfree's) and site-packages."""
    places = [p.resolve() for p in PACKAGES]
    for key in ("purelib", "platlib"):
        if sysconfig.get_paths().get(key):
            places.append(Path(sysconfig.get_paths()[key]).resolve())
    return places


def lab_folder(folder: Path | str | None) -> Path:
    """The lab folder, absolute: ``folder`` or ``./DEFAULT_DIR``. ConfigError for the shipped
    notebooks' own folder or a folder inside the installation (site-packages, the package)."""
    path = Path(folder if folder not in (None, "") else DEFAULT_DIR).expanduser().resolve()
    if path == NOTEBOOKS.resolve():
        raise ConfigError(f"--dir {path} is the shipped notebooks' own folder: give another (default ./{DEFAULT_DIR})")
    inside = next((p for p in _installed_places() if path.is_relative_to(p)), None)
    if inside is not None:
        raise ConfigError(f"--dir {path} is inside the installation ({inside}): give a folder of yours "
                          f"(default ./{DEFAULT_DIR})")
    return path


def lab_copy(notebook: Path) -> str:
    """The text of a shipped notebook as copied into a lab folder: the notebook without its jupytext
    pairing (``metadata.jupytext``: no ``.py`` twin is written beside it on save), otherwise as
    shipped (nbformat's JSON layout, which the shipped files already have)."""
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    nb.get("metadata", {}).pop("jupytext", None)
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def copy_notebooks(folder: Path) -> tuple[list[str], list[str]]:
    """Copy the shipped notebooks (``NOTEBOOKS/*.ipynb``, unpaired: ``lab_copy``) into ``folder``; a
    file already there is kept. Returns (copied, kept) names."""
    sources = sorted(NOTEBOOKS.glob("*.ipynb"))
    if not sources:
        raise InputError(f"no notebooks in {NOTEBOOKS}: this installation of zfree is incomplete")
    folder.mkdir(parents=True, exist_ok=True)
    copied, kept = [], []
    for src in sources:
        dst = folder / src.name
        if dst.exists():
            kept.append(src.name)
        else:
            dst.write_text(lab_copy(src), encoding="utf-8")
            copied.append(src.name)
    return copied, kept


#: where JupyterLab opens (the URL it prints and a browser it starts): the explorer, not the Launcher
EXPLORER_URL = "/lab/tree/explore.ipynb"


def lab_plan(study: Path | str | None = None, folder: Path | str | None = None, *, port: int | None = None,
             ip: str | None = None, no_browser: bool = False, copy: bool = True) -> LabPlan:
    """The plan of ``zfree lab [STUDY]``: the lab folder (``lab_folder``) with the notebooks copied
    (``copy``), the environment (``ZFREE_STUDY``: ``study`` checked and absolute; ``ZFREE_RUNS``:
    ``runs_home()`` here; ``HF_HUB_OFFLINE=1`` unless set, as ``make lab``) and JupyterLab's command
    from this Python, with the project's contents manager and save hook, opening on explore.ipynb
    (``EXPLORER_URL``). InputError for a ``study`` that is missing or not a study."""
    env = {}
    if study not in (None, ""):
        study_dir = Path(study).expanduser().resolve()
        if not (study_dir / "runs").is_dir():
            what = "no such folder" if not study_dir.exists() else "not a study or sweep folder (no runs/ inside)"
            raise InputError(f"STUDY {study_dir}: {what}; give a folder written by `zfree study --out DIR` or "
                             "`zfree sweep`, or none (the newest study under runs/)")
        env["ZFREE_STUDY"] = str(study_dir)
    env["ZFREE_RUNS"] = str(runs_home().resolve())
    if "HF_HUB_OFFLINE" not in os.environ:
        env["HF_HUB_OFFLINE"] = "1"
    path = lab_folder(folder)
    copied, kept = copy_notebooks(path) if copy else ([], [])
    argv = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={path}", f"--LabApp.default_url={EXPLORER_URL}",
            f"--ServerApp.contents_manager_class={CONTENTS_MANAGER}", f"--ContentsManager.pre_save_hook={SAVE_HOOK}"]
    argv += [f"--port={port}"] * (port is not None) + [f"--ip={ip}"] * (ip is not None)
    argv += ["--no-browser"] * no_browser + ["--allow-root"] * (hasattr(os, "geteuid") and os.geteuid() == 0)
    return LabPlan(argv, env, path, copied, kept)
