"""A notebook executed by zfree (``zfree.experiment.notebook_exec.execute``: every run and report) talks
to its kernel over IPC sockets and prints nothing on the terminal (issue 41 item 4): the kernel's
"running over TCP without encryption" warning came twice per run of `make study`, and now and then
"KeyboardInterrupt caught in kernel." from the SIGINT jupyter_client sends before a shutdown."""

from __future__ import annotations

import signal

import nbformat
from jupyter_client.manager import KernelManager

from zfree.experiment.notebook_exec import execute


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
