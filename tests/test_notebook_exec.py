"""A notebook executed by zfree (``zfree_lab.experiment.notebook_exec.execute``: every run and report) talks
to its kernel over IPC sockets and prints nothing on the terminal (issue 41 item 4): the kernel's
"running over TCP without encryption" warning came twice per run of `make study`, and now and then
"KeyboardInterrupt caught in kernel." from the SIGINT jupyter_client sends before a shutdown."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import nbformat
import pytest
from jupyter_client.manager import KernelManager

from zfree.core.errors import Interrupted
from zfree_lab.experiment.notebook_exec import execute


def test_a_kernel_runs_over_ipc_is_not_interrupted_and_prints_nothing(tmp_path, capfd, monkeypatch):
    signals = []
    original = KernelManager._async_signal_kernel

    async def recorded(self, signum):
        signals.append(signum)
        await original(self, signum)

    monkeypatch.setattr(KernelManager, "_async_signal_kernel", recorded)
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells.append(nbformat.v4.new_code_cell(
        "from ipykernel.connect import get_connection_info\nprint(get_connection_info(unpack=True)['transport'])"))
    out = execute(nb, tmp_path / "out.ipynb")
    assert nbformat.read(out, as_version=4).cells[0].outputs[0]["text"].strip() == "ipc"
    assert signal.SIGINT not in signals
    # the kernel is a child process writing to this process's file descriptors: capfd sees its lines
    terminal = capfd.readouterr()
    assert terminal.out == "" and terminal.err == "", terminal


# ---------------------------------------------------------------------------- issue 61: interrupted and killed executions

WHOLE = '{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}'


def _half_executed(then):
    """papermill as a SIGTERM (``then``: the exception) finds it: the executed part written whole to its
    output, then the interrupt raised."""
    def run(nb, out, **kw):
        half = nbformat.v4.new_notebook()
        half.cells.append(nbformat.v4.new_markdown_cell("half of the report"))
        nbformat.write(half, out)
        raise then
    return run


@pytest.mark.parametrize("then", [Interrupted(signal.SIGTERM), KeyboardInterrupt(), RuntimeError("a cell failed")],
                         ids=["SIGTERM", "Ctrl-C", "failed-cell"])
def test_an_interrupted_report_keeps_the_last_complete_one(tmp_path_factory, tmp_path, monkeypatch, then):
    """SIGTERM during `zfree report` replaced the complete report.ipynb with a half-executed one: now an
    interrupted (or failed) report leaves the last complete report.ipynb and report.html in place and no
    partial file behind."""
    import papermill as pm

    from tests.tiny_sweep import make_tiny_sweep
    from zfree_lab.experiment.render import render_report

    study = tmp_path / "study"
    shutil.copytree(make_tiny_sweep(tmp_path_factory), study)
    (study / "report.ipynb").write_text(WHOLE)
    (study / "report.html").write_text("<html>the last report</html>")
    monkeypatch.setattr(pm, "execute_notebook", _half_executed(then))
    with pytest.raises(type(then)):
        render_report(study)
    assert (study / "report.ipynb").read_text() == WHOLE
    assert (study / "report.html").read_text() == "<html>the last report</html>"
    assert not [p.name for p in study.iterdir() if "partial" in p.name or ".tmp" in p.name]


def test_the_partial_file_of_a_killed_execution_is_removed_by_the_next(tmp_path_factory, tmp_path, monkeypatch):
    """After `kill -9` of `zfree report` (or of a study mid-notebook) its hidden .partial.ipynb stayed
    forever: the next execution to the same notebook removes it (a report under the study folder's lock)."""
    import papermill as pm

    from tests.tiny_sweep import make_tiny_sweep
    from zfree_lab.experiment.render import render_report

    def whole(nb, out, **kw):
        nbformat.write(nbformat.v4.new_notebook(), out)

    monkeypatch.setattr(pm, "execute_notebook", whole)
    study = tmp_path / "study"
    shutil.copytree(make_tiny_sweep(tmp_path_factory), study)
    killed = study / ".report.ipynb.k1ll3d.partial.ipynb"  # as mkstemp named it for the killed report
    killed.write_text('{"cells": [')
    other = study / "notes.partial.ipynb"  # not a partial of report.ipynb: kept
    other.write_text(WHOLE)
    render_report(study)
    assert not killed.exists() and other.exists() and (study / "report.html").exists()
    run = tmp_path / "run"
    run.mkdir()
    (run / ".train_cvae.ipynb.k1ll3d.partial.ipynb").write_text("{")
    execute(nbformat.v4.new_notebook(), run / "train_cvae.ipynb")
    assert sorted(p.name for p in run.iterdir()) == ["train_cvae.ipynb"]


def test_a_run_killed_between_its_summary_and_its_notebook_is_not_finished(tiny_run, tmp_path, monkeypatch):
    """`kill -9` just after training wrote summary.json left the run counted finished without its
    train_cvae.ipynb (a rerun skipped it forever). A run's notebook execution is marked until its notebook is
    written: a killed one is not finished, and the next study executes its notebook (training reused)."""
    from tests.tiny import tiny_flat
    from zfree.core.paths import NOTEBOOKS
    from zfree_lab.experiment import executor
    from zfree_lab.experiment.spec import Point, run_id

    data, base = tiny_run
    flat = tiny_flat(data, base, steps=2, device="cpu")
    point = Point(run_id(flat), flat)
    run_dir = tmp_path / "runs" / point.run_id

    def killed(nb, out, **kw):  # training finished inside the kernel, then the process died (no except ran)
        (Path(out).parent / "summary.json").write_text("{}")
        raise SystemExit("kill -9")

    monkeypatch.setattr(executor, "execute", killed)
    with pytest.raises(SystemExit):
        executor.run_point(point, str(tmp_path / "runs"), str(NOTEBOOKS / "train_cvae.ipynb"))
    assert (run_dir / "summary.json").exists() and not (run_dir / "train_cvae.ipynb").exists()
    assert not executor.is_finished(run_dir)

    def whole(nb, out, **kw):
        Path(out).write_text(WHOLE)

    monkeypatch.setattr(executor, "execute", whole)
    res = executor.run_point(point, str(tmp_path / "runs"), str(NOTEBOOKS / "train_cvae.ipynb"))
    assert res["status"] == "finished" and executor.is_finished(run_dir)
    assert executor.run_point(point, str(tmp_path / "runs"), "unused")["status"] == "skipped"


def test_a_notebook_is_read_and_run_without_jsonschemas_iri_parsers(tmp_path):
    """rfc3987-syntax (jsonschema's ``format-nongpl`` extra, installed beside JupyterLab) built ~35 Lark
    parsers at ``import nbformat``: 1.8 s of every process that runs or reads a notebook. A fresh interpreter
    that runs a notebook through ``execute`` never imports it, reads the notebook back as valid, and can
    still import rfc3987_syntax itself."""
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("rfc3987_syntax") is None:
        pytest.skip("rfc3987-syntax is not installed here: nothing to keep out")
    code = (
        "import sys\n"
        "from zfree_lab.experiment.notebook_exec import execute, import_nbformat\n"
        "nbformat = import_nbformat()\n"
        "nb = nbformat.v4.new_notebook()\n"
        "nb.metadata['kernelspec'] = {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'}\n"
        "nb.cells.append(nbformat.v4.new_code_cell('1 + 1'))\n"
        f"out = execute(nb, {str(tmp_path / 'out.ipynb')!r})\n"
        "nbformat.validate(nbformat.read(out, as_version=4))\n"
        "print('loaded' if 'rfc3987_syntax' in sys.modules else 'not loaded')\n"
        "import rfc3987_syntax\n"
        "print(rfc3987_syntax.is_valid_syntax('iri', 'https://example.org/a'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["not", "loaded", "True"], out.stdout


def test_the_report_writes_its_notebook_once_a_run_after_each_cell(tmp_path, monkeypatch):
    """papermill writes the partial notebook at every cell's start and end: a run's notebook shows how far
    it got; the report's (``save_each_cell=False``) is written once, when whole."""
    import papermill.engines
    import papermill.execute

    writes = []
    for module in (papermill.engines, papermill.execute):
        original = module.write_ipynb
        monkeypatch.setattr(module, "write_ipynb", lambda nb, path, _w=original: (writes.append(path), _w(nb, path)))
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells.extend(nbformat.v4.new_code_cell(f"x = {i}") for i in range(5))
    counts = {}
    for each in (True, False):
        writes.clear()
        out = execute(nb, tmp_path / f"{each}.ipynb", save_each_cell=each)
        assert [c.outputs for c in nbformat.read(out, as_version=4).cells] == [[]] * 5
        counts[each] = len(writes)
    assert counts[False] == 1 and counts[True] >= 10, counts
