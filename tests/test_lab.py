"""Daily use in JupyterLab leaves the repository clean: in a fresh clone with the notebook filter
of ``make install`` (nbstripout, ``.gitattributes``), notebooks are opened, executed in a kernel
and saved through the contents manager JupyterLab saves with (jupytext's, paired with the
py:percent twin by ``notebooks/jupytext.toml``, configured by ``make lab``'s
``etc/jupyter/jupyter_server_config.py``: ``zfree_lab.report.lab.strip_on_save``); ``git status`` is then
empty. The default tier runs the explorer (widgets) and one figure notebook, the slow tier every
notebook."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tests.tiny_sweep import make_tiny_sweep

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
#: the sweep folders the notebooks' default parameters name (relative to the clone)
SWEEP_DIRS = ("runs/study-default", "runs/study-aided", "runs/sweep-beta-vs-recon-weight")


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def make_lab_clone(tmp_path: Path, sweep: Path) -> Path:
    """A clone of this repository's HEAD with ``make``'s notebook filter installed, its ``.venv``
    the running environment, and the tiny sweep at every ``sweep_dir`` the notebooks default to."""
    if shutil.which("git") is None or shutil.which("make") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git, make and a git checkout of the project")
    clone = tmp_path / "clone"
    _git(tmp_path, "clone", "-q", str(ROOT), str(clone))
    (clone / ".venv").symlink_to(Path(sys.prefix))
    subprocess.run(["make", "-s", "_git-filter"], cwd=clone, check=True, capture_output=True)
    for d in SWEEP_DIRS:
        shutil.copytree(sweep, clone / d)
    assert _git(clone, "status", "--porcelain") == ""
    return clone


async def run_and_save_like_jupyterlab(notebooks_dir: Path, names: list[str]) -> None:
    """Open each notebook with JupyterLab's contents manager class (jupytext's async manager over
    jupyter_server's AsyncLargeFileManager), execute it in a python3 kernel, save it back."""
    from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
    from jupytext.async_contentsmanager import build_async_jupytext_contents_manager_class
    from nbclient import NotebookClient

    from traitlets.config import PyFileConfigLoader

    config = PyFileConfigLoader("jupyter_server_config.py", path=str(notebooks_dir.parent / "etc" / "jupyter")).load_config()
    cm = build_async_jupytext_contents_manager_class(AsyncLargeFileManager)(config=config, root_dir=str(notebooks_dir))
    assert cm.pre_save_hook is not None
    for name in names:
        nb = nbformat.from_dict((await cm.get(name))["content"])
        await NotebookClient(nb, kernel_name="python3", timeout=600,
                             resources={"metadata": {"path": str(notebooks_dir)}}).async_execute()
        await cm.save({"type": "notebook", "format": "json", "content": nb}, name)


def _check_clean_after_running(tmp_path_factory, tmp_path, monkeypatch, names):
    clone = make_lab_clone(tmp_path, make_tiny_sweep(tmp_path_factory))
    # the kernels import the clone's own package, whose runs/ is where explore.ipynb looks for its
    # study (sweep_dir None), not the package the environment's editable install points at
    monkeypatch.setenv("PYTHONPATH", str(clone / "src"))
    monkeypatch.delenv("ZFREE_STUDY", raising=False)
    mtimes = {n: (clone / "notebooks" / n).stat().st_mtime_ns for n in names}
    asyncio.run(run_and_save_like_jupyterlab(clone / "notebooks", names))
    for n in names:  # really saved (both twins), and clean because the save hook stripped it
        assert (clone / "notebooks" / n).stat().st_mtime_ns > mtimes[n], n
    assert _git(clone, "status", "--porcelain") == "", _git(clone, "diff")[:3000]


@pytest.mark.slow  # moved to the slow tier (issue 23's tests kept the default tier under 10 min)
def test_running_the_explorer_in_the_lab_leaves_git_clean(tmp_path_factory, tmp_path, monkeypatch):
    _check_clean_after_running(tmp_path_factory, tmp_path, monkeypatch, ["explore.ipynb", "rate_distortion.ipynb"])


def _lab_contents_manager(notebooks_dir: Path):
    """The contents manager the lab server builds from etc/jupyter (as `make lab` and `zfree lab` load
    it): the configured class, else the one jupytext's server extension makes of the default."""
    from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
    from jupytext.async_contentsmanager import build_async_jupytext_contents_manager_class
    from traitlets.config import PyFileConfigLoader
    from traitlets.utils.importstring import import_item

    config = PyFileConfigLoader("jupyter_server_config.py", path=str(ROOT / "etc" / "jupyter")).load_config()
    name = config.ServerApp.get("contents_manager_class")
    cls = import_item(name) if name else build_async_jupytext_contents_manager_class(AsyncLargeFileManager)
    return cls(config=config, root_dir=str(notebooks_dir))


def test_a_notebook_opens_with_the_language_info_its_kernel_reports(tmp_path):
    """Issue 60: opening explore.ipynb in JupyterLab marked it unsaved before anything ran: the kernel,
    on connecting, wrote its language_info into a notebook stored without one. The lab's contents
    manager hands the notebook over with exactly what a python3 kernel reports, so nothing changes on
    connect; saving it back writes the file as it was (the save hook strips it again)."""
    from jupyter_client.manager import start_new_kernel

    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    for name in ("explore.ipynb", "explore.py", "jupytext.toml"):
        shutil.copy(ROOT / "notebooks" / name, nbs / name)
    stored = (nbs / "explore.ipynb").read_text(encoding="utf-8")
    assert "language_info" not in nbformat.reads(stored, as_version=4).metadata
    cm = _lab_contents_manager(nbs)
    model = asyncio.run(cm.get("explore.ipynb"))
    km, kc = start_new_kernel(kernel_name=model["content"]["metadata"]["kernelspec"]["name"])
    try:
        kc.kernel_info()
        reply = kc.get_shell_msg(timeout=60)
        while reply["msg_type"] != "kernel_info_reply":
            reply = kc.get_shell_msg(timeout=60)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert model["content"]["metadata"].get("language_info") == reply["content"]["language_info"]
    asyncio.run(cm.save({"type": "notebook", "format": "json", "content": model["content"]}, "explore.ipynb"))
    assert (nbs / "explore.ipynb").read_text(encoding="utf-8") == stored


def test_the_save_hook_strips_what_a_session_adds():
    from zfree_lab.report.lab import strip_on_save

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1", id="abc", execution_count=3, outputs=[
        nbformat.v4.new_output("execute_result", {"text/plain": "2"}, execution_count=3)],
        metadata={"tags": ["parameters"], "execution": {"iopub.status.busy": "x"}})],
        metadata={"language_info": {"name": "python"}, "widgets": {"state": {}}, "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    model = {"type": "notebook", "content": nb}
    strip_on_save(model, "notebooks/x.ipynb")
    (cell,) = model["content"].cells
    assert cell.outputs == [] and cell.execution_count is None and cell.id == "0"
    assert cell.metadata == {"tags": ["parameters"]} and set(model["content"].metadata) == {"kernelspec"}
    text = {"type": "file", "content": "# %%\n1 + 1\n"}
    strip_on_save(text, "notebooks/x.py")
    assert text["content"] == "# %%\n1 + 1\n"


@pytest.mark.slow
def test_running_every_notebook_in_the_lab_leaves_git_clean(tmp_path_factory, tmp_path, monkeypatch):
    """Every notebook, train_cvae at its defaults included (300 steps on the shipped benchmark)."""
    _check_clean_after_running(tmp_path_factory, tmp_path, monkeypatch, NOTEBOOKS)
