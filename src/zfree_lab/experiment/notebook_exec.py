"""One way to execute a notebook with papermill, so that nothing in the folder it writes can run or
be written through.

A run folder or study folder is the user's (or a colleague's, or a copied archive's), so:
- the kernel starts in a fresh empty folder of zfree's, never in the folder: ``python -m
  ipykernel_launcher`` and IPython put the working directory first on ``sys.path``, so an
  ``ipykernel_launcher.py`` or ``pandas.py`` left there would run;
- the executed notebook goes to a new file that only this call created (``mkstemp``: exclusive,
  never through a symlink), renamed over the destination when whole (a symlink there is replaced,
  not written through; a reader never sees a torn notebook); an interrupted execution (Ctrl-C,
  SIGTERM) never replaces the destination, nor, with ``keep_failed=False`` (the report), a failed
  one: the last complete notebook stays; the partial file a killed process (``kill -9``) left
  behind is removed by the next execution to the same destination (its caller owns the folder);
- the kernel talks to zfree over IPC sockets (files in Jupyter's runtime folder, readable by this
  user only), not TCP on localhost: no port to race for between parallel kernels, nothing another
  local user could connect to, and no "Kernel is running over TCP without encryption" warning on
  every run; it is shut down without the SIGINT jupyter_client sends first (``_ipc_kernel_manager``);
- paths are not format strings: papermill formats ``output_path`` with the parameters
  (``papermill.parameterize.parameterize_path``), so braces in a folder name are doubled here and the
  source notebook is passed as a node (papermill formats no node).
"""

from __future__ import annotations

import functools
import glob
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from zfree.core.progress import on_terminal


@functools.cache
def _ipc_kernel_manager():
    """jupyter_client's async kernel manager (nbclient's default class) with the IPC transport (its
    ``transport`` default is "tcp") and a shutdown that does not interrupt the kernel first."""
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import default

    class IPCKernelManager(AsyncKernelManager):
        @default("transport")
        def _transport_default(self):
            return "ipc"

        async def _async_interrupt_kernel(self) -> None:
            # jupyter_client's shutdown sends SIGINT before its shutdown request, for a kernel still
            # busy. papermill shuts a kernel down when its notebook is done, so it is idle, and that
            # SIGINT could land inside a message handler: "[IPKernelApp] ERROR | KeyboardInterrupt
            # caught in kernel." on the terminal, now and then, in a run that went well. A kernel
            # that does not answer the shutdown request is killed after shutdown_wait_time anyway.
            if getattr(self, "shutting_down", False):
                return
            await super()._async_interrupt_kernel()

    return IPCKernelManager


def import_nbformat():
    """``nbformat``, imported without the IRI format checker of jsonschema where nothing has imported
    jsonschema yet. jsonschema's ``format-nongpl`` extra (pulled in beside JupyterLab) installs
    rfc3987-syntax, which builds about 35 Lark parsers when jsonschema is imported: 1.8 s of the 1.9 s
    ``import nbformat`` took here, in every process that runs or reads a notebook (jsonschema issue
    #1428). No notebook schema uses the ``iri`` formats; the process's jsonschema then has no checker for
    them (it skips an unknown format, as it does where the extra is not installed), and a later explicit
    ``import rfc3987_syntax`` still works."""
    blocked = "jsonschema" not in sys.modules and "rfc3987_syntax" not in sys.modules
    if blocked:
        sys.modules["rfc3987_syntax"] = None  # jsonschema imports it under suppress(ImportError)
    try:
        import nbformat
    finally:
        if blocked:
            del sys.modules["rfc3987_syntax"]
    return nbformat


def _literal(path: Path | str) -> str:
    """``path`` as papermill's ``str.format`` of it gives it back: braces doubled."""
    return str(path).replace("{", "{{").replace("}", "}}")


#: the partial file of an execution to ``output``: ``.<output name>.<random>.partial.ipynb`` beside it
PARTIAL_SUFFIX = ".partial.ipynb"


def leftover_partials(output: Path | str) -> list[Path]:
    """The partial files of earlier executions to ``output`` still beside it: a process killed
    (``kill -9``, a dead machine) mid-execution leaves its ``.<name>.<random>.partial.ipynb``."""
    output = Path(output)
    return sorted(output.parent.glob(f".{glob.escape(output.name)}.*{PARTIAL_SUFFIX}"))


def execute(notebook, output: Path | str, parameters: dict[str, Any] | None = None, *,
            progress: bool = False, keep_failed: bool = True, save_each_cell: bool = True) -> Path:
    """Execute ``notebook`` (a path or an ``nbformat`` node) with papermill (kernel ``python3``; its cell bar with
    ``progress`` where stderr is a terminal, none in a log) and
    write the executed notebook to ``output`` atomically. On a failure inside the notebook the executed
    part (with the error) replaces ``output`` when it is a whole notebook and ``keep_failed`` (a run's
    notebook shows its error), and papermill's exception propagates; with ``keep_failed=False`` (the
    report) and after an interrupt (KeyboardInterrupt: Ctrl-C, SIGTERM) ``output`` is left as it was:
    the last complete notebook. A torn partial file (disk full) is removed, never left as ``output``,
    and so are the partial files a killed earlier execution to ``output`` left (``leftover_partials``:
    the caller owns ``output``'s folder, under its lock). ``save_each_cell``: papermill writes the partial
    file after each cell (a run's notebook shows how far it got); False writes it once, at the end or on a
    failure (the report: 60 cells whose figures made the 120 writes of a growing notebook cost seconds).
    Returns ``output``."""
    nbformat = import_nbformat()  # lazy: as papermill
    import papermill as pm  # lazy: measured 2.8 s to import (nbclient, jupyter_client)

    output = Path(output)
    node = notebook if isinstance(notebook, nbformat.NotebookNode) else nbformat.read(str(notebook), as_version=4)
    for old in leftover_partials(output):
        old.unlink(missing_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{output.name}.", suffix=PARTIAL_SUFFIX, dir=output.parent)
    os.close(fd)
    workdir = tempfile.mkdtemp(prefix="zfree-kernel-")
    try:
        pm.execute_notebook(node, _literal(tmp), parameters=parameters, kernel_name="python3",
                            progress_bar=progress and on_terminal(), log_output=False, cwd=workdir,
                            kernel_manager_class=_ipc_kernel_manager(), request_save_on_cell_execute=save_each_cell)
    except Exception:  # an interrupt (a BaseException) is no result: output stays as it was
        if keep_failed and is_whole(tmp):
            os.chmod(tmp, 0o644)
            os.replace(tmp, output)
        raise
    else:
        os.chmod(tmp, 0o644)
        os.replace(tmp, output)
    finally:
        Path(tmp).unlink(missing_ok=True)
        shutil.rmtree(workdir, ignore_errors=True)
    return output


def is_whole(path: Path | str) -> bool:
    """True when the notebook at ``path`` exists and reads back whole (a run counts as finished only
    then: a torn one from an earlier fault makes it rerun)."""
    nbformat = import_nbformat()  # lazy: as papermill

    if not Path(path).is_file():
        return False
    try:
        nbformat.read(str(path), as_version=4)
        return True
    except Exception:  # noqa: BLE001 - any reason it does not read back (a write torn by a full disk): not whole
        return False
