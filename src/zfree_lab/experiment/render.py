"""report.html of a study or sweep folder: the report notebooks executed on it in one kernel
(papermill) and rendered with nbconvert, code hidden, as one self-contained file: CSS and figures
inline, no script or stylesheet from a CDN (``OFFLINE_TEMPLATE``), so it opens the same offline."""

from __future__ import annotations

from contextlib import nullcontext

import errno
import json
import os
from pathlib import Path

from zfree.core.errors import FolderWriteError, InputError
from zfree.core.io import atomic_write_text
from zfree_lab.run.locks import run_folder_lock
from zfree.core.paths import NOTEBOOKS
from zfree_lab.run.run_config import MEANING_FILE
from zfree_lab.experiment.notebook_exec import execute, import_nbformat
from zfree_lab.experiment.folding import fold_empty_sections
from zfree_lab.experiment.tables import aggregate

REPORT_NOTEBOOKS = ("study_report", "sweep_beta_vs_recon_weight", "rate_distortion", "effective_beta", "rho_recon",
                    "training_dynamics", "switch_on")  # the sections of report.html, in order

#: nbconvert's lab template less everything it loads from the network when the page opens:
#: require.js, MathJax and Mermaid (cdnjs) and the widget manager (unpkg). The report's math is
#: Unicode text (β_eff = β·|S|/w), its figures PNGs, its CSS inline, and it has no widgets. One CSS
#: rule of its own (``html_head_css``): a table's box (pandas wraps each table in a ``div``) is a
#: block that scrolls sideways when the table is wider than the page, whether or not a browser
#: scrolls the lab template's table-cell output area.
OFFLINE_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block html_head_css -%}
<style type="text/css">
/* zfree: a table wider than the page scrolls inside its own box, not off the page */
.jp-OutputArea-output[data-mime-type="text/html"] > div, .jp-RenderedMarkdown table {
  display: block; overflow-x: auto; max-width: 100%;
}
</style>
{%- endblock html_head_css -%}
"""


def offline_exporter():
    """nbconvert's HTMLExporter for report.html: the lab template without CDN resources
    (``OFFLINE_TEMPLATE``), code and prompts hidden."""
    import jinja2  # lazy: with nbconvert

    import_nbformat()  # nbconvert imports nbformat: without the slow IRI checker
    from nbconvert import HTMLExporter  # lazy: as papermill in render_report

    return HTMLExporter(template_name="lab", template_file="zfree_offline.html.j2",
                        extra_loaders=[jinja2.DictLoader({"zfree_offline.html.j2": OFFLINE_TEMPLATE})],
                        exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True)


def report_title(study_dir: Path) -> str:
    """report.html's ``<title>``: the study's name (a sweep's spec name from its ``spec.json``, else the
    folder's name), so a browser's tab and history say which study it is (nbconvert's is "Notebook")."""
    try:
        name = json.loads((study_dir / "spec.json").read_text(encoding="utf-8")).get("name")
    except (OSError, ValueError, AttributeError):
        name = None
    return f"{name if isinstance(name, str) and name.strip() else Path(study_dir).resolve().name} · zfree report"


def html_of(nb, study_dir: Path) -> str:
    """report.html's text of the executed notebook ``nb`` (``offline_exporter``), its sections with nothing to
    show folded into one closing list (``zfree_lab.experiment.folding.fold_empty_sections``; ``nb`` unchanged), titled with the study's
    name (``report_title``; the template escapes it). Raises InputError in
    one line where nbconvert finds no 'lab' template (an environment whose Jupyter data files were
    not installed, e.g. ``pip install --target``): the runs and tables of ``study_dir`` are complete."""
    nb = fold_empty_sections(nb)  # sections that only say they are empty: one list at the end
    nb.metadata["title"] = report_title(study_dir)  # the lab template's <title>, before resources' "Notebook"
    try:
        body, _ = offline_exporter().from_notebook_node(nb)
    except ValueError as e:
        if "No template sub-directory" not in str(e):
            raise
        raise InputError(f"report.html: nbconvert found no 'lab' template (its data files are missing from this "
                         f"environment); the runs and tables in {study_dir} are complete: "
                         f"reinstall nbconvert (pip install --force-reinstall --no-deps nbconvert), then "
                         f"zfree report {study_dir}") from None
    return body


def _has_cvae_runs(study_dir: Path) -> bool:
    """Whether the study's summary.csv (``aggregate``'s) lists a CVAE run: a study of label oracles alone (their
    controls and null oracles are no CVAE runs) renders only the study section; its β, rate-distortion, ρ_recon,
    dynamics and switch-on sections would each have drawn nothing."""
    import pandas as pd  # lazy: as the report's tables

    try:
        return not pd.read_csv(study_dir / "summary.csv").empty
    except (OSError, ValueError):  # no summary (a sweep written before it), an empty file: as before
        return True


def _combined_report(study_dir: Path, parts: list[Path]):
    """One notebook made of ``parts``: each part's parameters cell (untagged, its defaults kept)
    is followed by an injected ``sweep_dir = ...`` cell, so all sections run in one kernel."""
    nbformat = import_nbformat()  # lazy: only a report needs it

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for part in parts:
        for cell in nbformat.read(part, as_version=4).cells:
            tags = cell.get("metadata", {}).get("tags", [])
            cell.metadata.pop("tags", None)
            nb.cells.append(cell)
            if "parameters" in tags:
                nb.cells.append(nbformat.v4.new_code_cell(f"sweep_dir = {str(study_dir)!r}",
                                                          metadata={"tags": ["injected-parameters"]}))
    for i, cell in enumerate(nb.cells):  # the parts' own ids repeat across notebooks ('0', '1', ...)
        cell["id"] = f"cell-{i}"
    return nb


def check_reportable(study_dir: Path) -> None:
    """InputError (one line) when ``study_dir/runs`` holds no finished run (nothing to report: the
    failed ones named by count, their error.json beside them) or ``study_dir`` cannot be written."""
    runs = study_dir / "runs"
    if not any(runs.glob("*/summary.json")):
        failed = len(list(runs.glob("*/error.json")))
        why = f"{failed} failed (see {runs}/*/error.json)" if failed else "none has finished yet"
        raise InputError(f"{study_dir}: no finished run to report in {runs} ({why}); "
                         "run or rerun the study or sweep first")
    if not os.access(study_dir, os.W_OK):
        raise InputError(f"cannot write in {study_dir} (read-only): `zfree report` writes its tables and report.html "
                         "there; copy the folder somewhere writable and report the copy")


def render_report(study_dir: Path | str, notebook: Path | str | None = None, progress: bool = False,
                  aggregated: bool = False, locked: bool = False) -> Path:
    """Aggregate a study or sweep folder (``zfree_lab.experiment.tables.aggregate``: runs.parquet, runs.csv,
    per_example.parquet, summary.csv), execute the report notebooks on it with papermill in one
    kernel (``REPORT_NOTEBOOKS``, or the one ``notebook``; their parameter ``sweep_dir`` set) and
    render ``report.html`` with nbconvert, code hidden, self-contained (``offline_exporter``).
    report.ipynb and report.html are written atomically (a symlink there is replaced, never written
    through) and only by a report executed to its end: an interrupted (SIGTERM, Ctrl-C) or failed one
    leaves the last complete pair in place, and the partial file of a killed one (``kill -9``) is removed
    by the next, under the study folder's lock (LockHeldError while another process holds it); a full
    disk is one line naming the folder (``full_disk_error``: FolderWriteError); the
    kernel is started outside the folder (``zfree_lab.experiment.notebook_exec``); papermill's
    progress bar with ``progress``; ``aggregated``: the caller has just written the tables (a study,
    after its grid), so they are not written again; ``locked``: the caller holds the folder's lock (a sweep:
    ``zfree_lab.experiment.sweeps.run_sweep``), which is then not taken again."""
    nbformat = import_nbformat()  # lazy: as in _combined_report

    study_dir = Path(study_dir).resolve()
    if not study_dir.exists():
        raise FileNotFoundError(f"{study_dir}: no such folder: give a study or sweep folder")
    if not (study_dir / "runs").is_dir() and (study_dir / "config.json").is_file():  # `zfree train`'s folder
        raise FileNotFoundError(f"{study_dir} is one run's folder (config.json, no runs/): `zfree status {study_dir}` "
                                "prints its numbers; a report is of a study or sweep folder")
    if not (study_dir / "runs").is_dir():
        raise FileNotFoundError(f"{study_dir} has no runs/ folder: not a study or sweep folder")
    check_reportable(study_dir)
    try:
        if not aggregated:
            aggregate(study_dir)
    except OSError as e:  # a read-only copy, a read-only mount, another owner's folder
        if e.errno in FULL_DISK:
            raise full_disk_error(e, study_dir) from None
        if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        raise InputError(f"cannot write in {study_dir} ({e.strerror}: {e.filename}): `zfree report` writes its tables "
                         "and report.html there; copy the folder somewhere writable and report the copy") from None
    parts = [Path(notebook).resolve()] if notebook else [NOTEBOOKS / f"{n}.ipynb" for n in REPORT_NOTEBOOKS]
    if notebook is None and not _has_cvae_runs(study_dir):  # label oracles alone: the per-run sections have no run
        parts = parts[:1]
    if notebook is None and (study_dir / "notes.json").exists():  # an own-data study: labels, notes, samples
        parts.append(NOTEBOOKS / "labels_and_samples.ipynb")  # (with what z learned, above the confusions)
    elif notebook is None and any((study_dir / "runs").glob(f"*/{MEANING_FILE}")):
        parts.append(NOTEBOOKS / "what_z_learned.ipynb")
    # one report at a time: its leftovers are its own to remove (``locked``: the caller, a sweep, holds the lock)
    with nullcontext() if locked else run_folder_lock(study_dir, "study folder"):
        try:  # replaced only when whole and executed to the end: an interrupted or failed report keeps the last one
            out_nb = execute(_combined_report(study_dir, parts), study_dir / "report.ipynb", progress=progress,
                             keep_failed=False, save_each_cell=False)
            atomic_write_text(study_dir / "report.html", html_of(nbformat.read(out_nb, as_version=4), study_dir))
        except OSError as e:
            if e.errno not in FULL_DISK:
                raise
            raise full_disk_error(e, study_dir) from None
    return study_dir / "report.html"


#: the errnos of a disk that takes no more bytes: full, or over the user's quota
FULL_DISK = (errno.ENOSPC, errno.EDQUOT)


def full_disk_error(e: OSError, study_dir: Path) -> FolderWriteError:
    """The one line of a full disk (``FULL_DISK``) met while the report of ``study_dir`` is written: a
    write() error names no file, so the study folder is named, with the file when the error has one,
    what was kept, and how to go on."""
    kept = ("the last complete report.html is kept" if (study_dir / "report.html").is_file()
            else "no report.html was written")
    return FolderWriteError(f"cannot write the report in {study_dir} ({e.strerror or e}"
                            f"{f': {e.filename}' if e.filename else ''}); {kept}; free space and rerun "
                            f"`zfree report {study_dir}`")
