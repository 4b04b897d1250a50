"""``zfree lab`` saves notebooks as ``make lab`` does, without outputs, and writes no jupytext twin.

JupyterLab is not started: its contents manager is built from the very command line ``zfree lab``
runs (``zfree_lab.report.lab_launch.lab_plan``), parsed by jupyter_server's ``ServerApp`` as the
server parses it, and a notebook run in the explorer is saved through it (the contents API's save,
which is what JupyterLab's save and autosave call). Before, ``zfree lab`` named only the contents
manager: a saved explore.ipynb kept its outputs, and jupytext wrote explore.py beside it (the
shipped notebooks carry their pairing in their metadata).
"""

from __future__ import annotations

import asyncio
import json

import nbformat
import pytest

pytest.importorskip("jupyter_server")
pytest.importorskip("nbstripout")

MARK = "zfree-lab-save-test output"


def _contents_manager(plan):
    """The contents manager JupyterLab builds from ``plan.argv`` (its options after ``-m jupyterlab``)."""
    from jupyter_server.serverapp import ServerApp
    from traitlets.utils.importstring import import_item

    app = ServerApp()
    app.parse_command_line(plan.argv[3:])
    cls = app.contents_manager_class
    cls = import_item(cls) if isinstance(cls, str) else cls
    return cls(config=app.config, root_dir=str(plan.folder))


def test_a_notebook_saved_in_zfree_lab_keeps_no_outputs_and_gets_no_py_twin(tmp_path, monkeypatch):
    from zfree_lab.report.lab_launch import lab_plan

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ZFREE_STUDY", raising=False)
    plan = lab_plan(None)  # as typed in an empty folder: the notebooks copied to ./zfree-lab
    assert plan.copied and "explore.ipynb" in plan.copied and not plan.kept
    nb_file = plan.folder / "explore.ipynb"
    copied = nb_file.read_bytes()
    cm = _contents_manager(plan)

    async def run_and_save():
        model = await cm.get("explore.ipynb")
        nb = nbformat.from_dict(model["content"])
        code = [c for c in nb.cells if c.cell_type == "code"]
        for i, cell in enumerate(code, 1):  # as a session leaves it: outputs, counts, widget state
            cell.execution_count = i
            cell.outputs = [nbformat.v4.new_output("stream", text=f"{MARK} {i}\n")]
        nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
        await cm.save({"type": "notebook", "format": "json", "content": nb}, "explore.ipynb")

    asyncio.run(run_and_save())
    saved = nb_file.read_text(encoding="utf-8")
    assert MARK not in saved and all(c.get("outputs", []) == [] for c in nbformat.reads(saved, 4).cells)
    assert saved.encode() == copied  # stripped back to the copy exactly: nothing a session adds is kept
    # no explore.py: the copy is not paired with a .py twin
    assert sorted(p.name for p in plan.folder.iterdir() if not p.name.startswith(".")) == sorted(plan.copied)
    assert "jupytext" not in json.loads(copied)["metadata"]


def test_the_lab_opens_on_the_explorer_not_the_launcher(tmp_path, monkeypatch):
    """A new user's `zfree lab STUDY --no-browser` printed `/lab?token=…`, which opened JupyterLab's Launcher; the
    explorer had to be found and opened by hand. JupyterLab's own LabApp, parsing the command ``zfree lab`` runs,
    now opens (and prints) the URL of the copied explore.ipynb."""
    pytest.importorskip("jupyterlab")
    from jupyterlab.labapp import LabApp

    from zfree_lab.report.lab_launch import EXPLORER_URL, lab_plan

    monkeypatch.chdir(tmp_path)
    plan = lab_plan(None, no_browser=True)
    app = LabApp()
    app.parse_command_line(plan.argv[3:])
    assert app.default_url == EXPLORER_URL == "/lab/tree/explore.ipynb"
    assert (plan.folder / EXPLORER_URL.removeprefix("/lab/tree/")).is_file()
