"""JupyterLab's save hook for this project: notebooks are written without outputs, so a session
that runs and saves every notebook leaves ``git status`` clean.

``strip_on_save`` is the contents manager's ``pre_save_hook`` (``etc/jupyter/jupyter_server_config.py``,
loaded by ``make lab`` through ``JUPYTER_CONFIG_PATH``). It strips what ``nbstripout`` strips as
git's clean filter (``make install``, ``.gitattributes``) with the same keys (``EXTRA_KEYS``,
the Makefile's ``NBSTRIP_KEYS``): outputs, execution counts, cell ids renumbered, and the kernel
and widget metadata a session adds. The browser keeps showing the outputs of the session; a
notebook reopened later shows none. The py:percent twin is written by jupytext from the same
model (``notebooks/jupytext.toml`` filters its metadata).
"""

from __future__ import annotations

from typing import Any

import nbformat

#: notebook metadata stripped on save besides outputs and counts (keep in step with NBSTRIP_KEYS)
EXTRA_KEYS = ("metadata.language_info", "metadata.widgets", "metadata.papermill", "cell.metadata.papermill",
              "cell.metadata.execution", "cell.metadata.jupyter", "cell.metadata.editable",
              "cell.metadata.slideshow")


def strip_on_save(model: dict[str, Any], path: str, **kwargs: Any) -> None:
    """A ``ContentsManager.pre_save_hook``: strip a notebook model's outputs in place (nbstripout's
    ``strip_output``); other files (the .py twin, any text file) pass unchanged."""
    if model.get("type") != "notebook" or not str(path).endswith(".ipynb") or model.get("content") is None:
        return
    from nbstripout import strip_output  # lazy: ~1 s, an optional [lab] dependency, only when a notebook is saved

    nb = nbformat.from_dict(model["content"])
    model["content"] = strip_output(nb, keep_output=False, keep_count=False, keep_id=False,
                                    extra_keys=list(EXTRA_KEYS))
