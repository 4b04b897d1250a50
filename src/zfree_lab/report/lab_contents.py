"""JupyterLab's contents manager for this project: a notebook opens without being marked unsaved.

The notebooks are stored without ``metadata.language_info`` (``zfree_lab.report.lab.strip_on_save`` and
nbstripout drop it: it names the Python patch version of whoever saved). JupyterLab writes the
kernel's language_info into an open notebook as soon as its kernel connects, so every notebook was
marked dirty (unsaved) on open, before anything was run (issue 60). ``LabContentsManager``, jupytext's
contents manager (paired notebooks as before), hands JupyterLab each notebook with the language_info
its kernel will report (``kernel_language_info``): connecting then changes nothing, and saving strips
it again. ``etc/jupyter/jupyter_server_config.py`` selects it (``make lab``, ``zfree lab``).
"""

from __future__ import annotations

from typing import Any

from jupytext.async_contentsmanager import AsyncTextFileContentsManager


def kernel_language_info(kernel_name: str | None = "python3") -> dict[str, Any] | None:
    """The ``language_info`` a kernel of ``kernel_name`` reports on connecting: ipykernel's, for the
    python3 kernel of the server's own environment (the kernel JupyterLab starts for these
    notebooks); None for another kernel, whose language_info the server cannot know."""
    if kernel_name != "python3":
        return None
    from ipykernel.ipkernel import IPythonKernel  # lazy: IPython, once per server

    return dict(IPythonKernel.language_info)


def with_kernel_language_info(model: dict[str, Any]) -> dict[str, Any]:
    """A notebook ``model`` (the contents API's, with content) given its kernel's language_info where
    it has none; any other model unchanged. Returns the model (changed in place)."""
    content = model.get("content") if model.get("type") == "notebook" else None
    if not content:
        return model
    metadata = content["metadata"]
    if "language_info" not in metadata:
        info = kernel_language_info((metadata.get("kernelspec") or {}).get("name"))
        if info is not None:
            metadata["language_info"] = info
    return model


class LabContentsManager(AsyncTextFileContentsManager):
    """jupytext's contents manager whose notebooks carry their kernel's language_info when opened
    (module docstring)."""

    async def get(self, path, content=True, type=None, format=None, **kwargs):  # noqa: A002 - the API's names
        """jupytext's model of ``path`` (the contents API's arguments), a notebook with its kernel's
        language_info (``with_kernel_language_info``)."""
        return with_kernel_language_info(await super().get(path, content=content, type=type, format=format,
                                                           **kwargs))
