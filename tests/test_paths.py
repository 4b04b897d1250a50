"""Where shipped files resolve (``zfree.core.paths``): in a clone, against the clone's root; in an
installed wheel, against the package's ``_shipped`` folder, which setup.py fills with every file a run
or a report reads from ROOT (issue 41 item 3; tests/test_wheel.py builds and runs the wheel itself)."""

from __future__ import annotations

import runpy
from pathlib import Path

import zfree.core.paths as paths
from zfree_lab.experiment.render import REPORT_NOTEBOOKS


def test_in_a_clone_root_is_the_clone():
    assert paths.IN_CLONE and not paths.INSTALLED_ROOT.exists()
    assert (paths.ROOT / "pyproject.toml").is_file() and (paths.ROOT / "src" / "zfree").is_dir()


def test_the_wheel_ships_every_file_read_from_root():
    """setup.py's list covers the notebooks runs and reports execute, the shipped benchmark and base
    runs (synthetic and E2E) file by file, the sweep specs and the presets."""
    shipped = set(runpy.run_path(str(paths.ROOT / "setup.py"), run_name="setup")["shipped_files"](paths.ROOT))
    notebooks = ["train_cvae", "labels_and_samples", *REPORT_NOTEBOOKS]
    needed = [paths.NOTEBOOKS / f"{n}.ipynb" for n in notebooks] + sorted(paths.SPECS.glob("*.yaml"))
    needed += sorted(paths.PRESET_SPECS.glob("*.yaml"))  # every `zfree study --preset`
    for folder in (paths.SHIPPED_DATA, paths.SHIPPED_BASE, paths.SHIPPED_E2E):
        needed += [p for p in folder.rglob("*") if p.is_file()]
    missing = [str(p.relative_to(paths.ROOT)) for p in needed if p.relative_to(paths.ROOT) not in shipped]
    assert not missing and len(needed) > 30, missing
    assert not any(p.suffix == ".py" or p.parts[0] in ("src", "tests") for p in shipped)


def test_a_folder_given_relative_is_the_working_directorys_else_roots(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "synth" / "default").mkdir(parents=True)
    assert paths.resolve_given("data/synth/default") == str(tmp_path / "data" / "synth" / "default")
    assert paths.resolve_given("data/base/default") == str(paths.SHIPPED_BASE.resolve())
    assert paths.resolve_given("zfree:data/e2e") == str(paths.SHIPPED_E2E.resolve())
    assert paths.resolve_given(str(tmp_path / "x")) == str(tmp_path / "x")
    assert paths.runs_home() == paths.ROOT / "runs"  # in a clone: the clone's, wherever zfree runs from


def test_from_a_wheel_a_notebook_looks_for_studies_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(paths, "IN_CLONE", False)
    assert paths.runs_home() == Path(tmp_path) / "runs"
