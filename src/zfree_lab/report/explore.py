"""The explore notebook's widgets over one study at a time, the study chosen in the notebook, not in
a file: ``StudyChooser`` (a dropdown of the finished studies under ``runs/``, a path box) and
``ExploreLab``, which re-points the explorer and the launch panel (``zfree_lab.report.widgets``) at the
chosen study. Choosing a study writes nothing: the notebook's cells stay as they are, so saving it
leaves ``git status`` clean."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Callable

import ipywidgets as W
import numpy as np
import pandas as pd

from zfree.config import TrainConfig
from zfree.core.errors import InputError, one_line
from zfree.core.paths import runs_home
from zfree_lab.experiment.results import SweepResults, load_sweep
from zfree_lab.experiment.study_folders import check_folder, count_runs, find_studies
from zfree_lab.experiment.study_notes import study_notes
from zfree_lab.report.labels_report import dashes
from zfree_lab.report.report import AIDED_COLUMNS, QUALITY_COLUMNS, USE_COLUMNS
from zfree_lab.report.widgets import WIDE, LaunchPanel, SweepExplorer

#: the columns of the chosen study's run table (those it has; ``source`` where runs were launched)
RUN_COLUMNS = ("run_id", "source", "weighting", "latent_kind", "aid", "beta", "recon_weight", "kl_prior_loss",
               "baseline_normalized_reconstruction_loss", "alignment_nmi", "task_correctness")
#: the run table's headers, its columns' keys renamed for display only (the runs keep their keys): the
#: report's names of the same summary.csv columns, a short name with its unit where it has one ("KL [nats]",
#: "ρ_recon": ``report.AIDED_COLUMNS``, ``USE_COLUMNS``, ``QUALITY_COLUMNS``), and those only this table shows
RUN_HEADERS = {**AIDED_COLUMNS, **USE_COLUMNS, **QUALITY_COLUMNS, "run_id": "run", "source": "source",
               "latent_kind": "latent kind", "recon_weight": "mean w"}
#: the launched runs' folder inside a study: the study's own runs and report stay as they were
LAUNCHED = "launched"


def runs_overview(sweep: SweepResults) -> pd.DataFrame:
    """The study's finished runs, one row each, for display: ``RUN_COLUMNS`` (those present; ``source``
    only where it tells runs apart: the study's and its launched ones) under their readable headers
    (``RUN_HEADERS``: "KL [nats]", not ``kl_prior_loss``), rounded to 4 digits, a missing
    value (NaN, None: e.g. a metric a run did not write) shown as "–" as in the report's tables
    (``labels_report.dashes``; the columns are then of object dtype)."""
    runs = sweep.runs
    cols = [c for c in RUN_COLUMNS if c in runs and (c != "source" or runs[c].nunique() > 1)]
    return dashes(runs[cols].round(4)).rename(columns=RUN_HEADERS)


def launch_template(sweep: SweepResults) -> dict[str, Any]:
    """The launch panel's template: the study's first finished run's flat config (same data and
    base run, paths absolute: ``SweepResults.config``), else ``TrainConfig``'s defaults."""
    return sweep.config(sweep.runs["run_id"].iloc[0]) if len(sweep.runs) else TrainConfig().to_flat()


def launch_log_beta(sweep: SweepResults) -> tuple[float, float]:
    """The β range (log10, lo, hi) offered around the study's own β and its predicted β*
    (theory's ``critical_betas``, or the study's notes on real data: ``launch_beta_range``)."""
    stars = [*sweep.critical_betas().values(),
             *(r["beta_star"] for r in study_notes(sweep.sweep_dir).get("predicted_boundaries", []))]
    return launch_beta_range(sweep.runs["beta"] if "beta" in sweep.runs else [], stars)


#: rows the run table shows before it scrolls in its box (a header and 12 rows of ~31 px in JupyterLab: the
#: default study's 8 runs and a few launched ones in view; at 260 px its 8th run was hidden below the fold)
TABLE_ROWS_SHOWN = 12
TABLE_MAX_PX = 31 * (TABLE_ROWS_SHOWN + 1) + 8


def _table_html(df: pd.DataFrame) -> str:
    """A table that fits the output's width: what is too wide or longer than ``TABLE_ROWS_SHOWN`` rows scrolls
    inside its own box (its headers, ``RUN_HEADERS``, break at their spaces; no zero-width space after "_" as
    the raw keys needed)."""
    return (f"<div style='max-height:{TABLE_MAX_PX}px;overflow:auto;max-width:100%'>"
            f"{df.to_html(index=False, border=0, classes='jp-RenderedHTMLCommon')}</div>")


class StudyChooser:
    """Choose a study in the notebook: a dropdown of the finished studies under ``root`` (default
    ``zfree.core.paths.runs_home()``: ``find_studies``, the newest first, with the current one
    always listed) and a path box for any other folder (Enter opens it); ↻ looks again.

    ``on_choose(folder)`` opens the folder; any exception it raises is shown as one line
    (``error``: "cannot open FOLDER: Type: message") and the choice goes back to ``current``.
    """

    def __init__(self, current: Path | str, on_choose: Callable[[Path], None], root: Path | str | None = None):
        self.root = Path(root) if root is not None else runs_home()
        self.current, self.on_choose = Path(current).resolve(), on_choose
        self.dropdown = W.Dropdown(description="study", layout=W.Layout(width="460px"), **WIDE)
        self.path = W.Text(placeholder="or a study folder, then Enter", continuous_update=False,
                           layout=W.Layout(width="360px"))
        self.rescan = W.Button(description="↻", tooltip=f"look again for finished studies under {self.root}",
                               layout=W.Layout(width="40px"))
        self.error = W.HTML()
        self._hold = False
        self.scan()
        self.dropdown.observe(lambda ch: self._hold or self.choose(ch["new"]), names="value")
        self.path.observe(lambda ch: ch["new"].strip() and self.choose(ch["new"].strip()), names="value")
        self.rescan.on_click(lambda _: self.scan())
        self.widget = W.VBox([W.HBox([self.dropdown, self.path, self.rescan]), self.error]).add_class("zfree-chooser")

    def _label(self, d: Path) -> str:
        """"runs/NAME (N runs)": N the study's finished CVAE runs, those its run table and the
        explorer show; its z-free controls and label oracles are named beside them, e.g.
        "(8 runs; +8 controls, 1 oracle)" (``count_runs``)."""
        c = count_runs(d / "runs")
        where = d.relative_to(self.root.parent) if d.is_relative_to(self.root.parent) else d
        given = [f"{c[k]} {name}{'s' * (c[k] != 1)}" for k, name in (("control", "control"), ("oracle", "oracle"),
                                                                       ("given", "other given-z run")) if c[k]]
        return f"{where} ({c['cvae']} run{'s' * (c['cvae'] != 1)}" + (f"; +{', '.join(given)})" if given else ")")

    def scan(self) -> list[Path]:
        """List the finished studies under ``root`` in the dropdown (the current study first when
        it is not among them); returns the folders listed."""
        found = [d.resolve() for d in find_studies(self.root)]
        folders = found if self.current in found else [self.current, *found]
        self._hold = True
        try:
            self.dropdown.options = [(self._label(d), str(d)) for d in folders]
            self.dropdown.value = str(self.current)
        finally:
            self._hold = False
        return folders

    def choose(self, folder: Path | str) -> Path | None:
        """Open ``folder`` (through ``on_choose``); returns it resolved, or None when it could not
        be opened (the reason in ``error``, the dropdown back on the current study)."""
        folder = Path(folder).expanduser().resolve()
        try:
            self.on_choose(folder)
        except Exception as e:  # noqa: BLE001 - any reason is shown in one line, the notebook keeps going
            self.error.value = (f"<span style='color:#b00'>cannot open {html.escape(str(folder))}: "
                                f"{type(e).__name__}: {html.escape(one_line(e))}</span>")
            self.scan()
            return None
        self.current = folder
        self.error.value = ""
        self.path.value = ""  # typed again later, the same folder is a change again
        self.scan()
        return folder


class ExploreLab:
    """The explore notebook over one study at a time: ``chooser`` (``StudyChooser``), the study's run
    table (``table``), ``explorer`` (``SweepExplorer`` over the study and its ``launched/`` runs) and
    ``panel`` (``LaunchPanel`` from the study's first run into ``<study>/launched``). ``open`` (a
    study chosen in the dropdown or path box) re-points all of them; ``widget`` is the chooser,
    table and explorer (the panel is displayed on its own: ``panel.widget``). The table shows the
    runs the explorer shows (the study's and its launched ones, a ``source`` column telling them
    apart): the panel refreshes both as each launched run ends (``refresh``).

    ``steps``, ``workers``, ``make_executor``: the panel's (``LaunchPanel``). ``root``: where the
    chooser looks for studies. NoStudyError (one line) when ``study_dir`` is missing.
    """

    def __init__(self, study_dir: Path | str, steps: int | None = None, workers: int = 2,
                 root: Path | str | None = None, make_executor: Callable[[], Any] | None = None):
        study_dir = Path(study_dir).resolve()
        sweep = load_sweep(study_dir)
        self.study_dir, self.table = study_dir, W.HTML()
        self.explorer = SweepExplorer([study_dir, study_dir / LAUNCHED])
        self.panel = LaunchPanel(launch_template(sweep), study_dir / LAUNCHED, explorer=self,
                                 workers=workers, steps=steps, make_executor=make_executor,
                                 log_beta=launch_log_beta(sweep))
        self._show()
        self.chooser = StudyChooser(study_dir, self.open, root=root)
        self.widget = W.VBox([self.chooser.widget, self.table, self.explorer.widget])

    def _show(self) -> None:
        """The run table from the explorer's runs: the study's and its launched ones."""
        results = self.explorer.results
        runs, failed = results.runs, len(results.errors)
        n = len(runs)
        launched = int((runs["source"] == LAUNCHED).sum()) if n and "source" in runs else 0
        self.table.value = (f"<div>study <code>{html.escape(str(self.study_dir))}</code>: {n} finished run"
                            f"{'s' * (n != 1)}{f' ({launched} launched)' if launched else ''}, {failed} failed</div>"
                            + (_table_html(runs_overview(results)) if n else ""))

    def refresh(self) -> None:
        """Reload the study and its launched runs into the explorer and the run table (the launch
        panel calls it as each run it launched ends)."""
        self.explorer.refresh()
        self._show()

    def open(self, study_dir: Path | str) -> None:
        """Show ``study_dir`` and launch from it: its runs, the explorer on it and its launched runs,
        the panel's template and target. Raises, changing nothing, NoStudyError for a missing
        folder, ``zfree.core.errors.InputError`` for one that is not a study, RuntimeError while a
        launch is running."""
        study_dir = Path(study_dir).resolve()
        if self.panel.thread is not None and self.panel.thread.is_alive():  # before anything changes
            raise RuntimeError(f"a launch is running into {self.panel.sweep_dir / 'runs'}: stop it, or let it "
                               "finish, first")
        if not (check_folder(study_dir) / "runs").is_dir():
            raise InputError(f"{study_dir} is not a study or sweep folder (no runs/ inside)")
        sweep = load_sweep(study_dir)
        self.explorer.open([study_dir, study_dir / LAUNCHED])
        self.panel.set_template(launch_template(sweep), study_dir / LAUNCHED, log_beta=launch_log_beta(sweep))
        self.study_dir = study_dir
        self._show()


def launch_beta_range(betas, beta_stars=(), pad_decades: float = 0.5, step: float = 0.25) -> tuple[float, float]:
    """(lo, hi) in log10 β for the launch panel: the study's ``betas`` and predicted ``beta_stars``
    (non-positive and NaN ignored) widened by ``pad_decades`` on each side and snapped outward to
    ``step`` (e.g. an E2E study at β 0.0043 with β* 0.0129 -> (-3.0, -1.25)); (-2, 0) when none is given."""
    v = np.asarray([*betas, *beta_stars], float)
    v = v[np.isfinite(v) & (v > 0)]
    if not len(v):
        return (-2.0, 0.0)
    lo, hi = np.log10(v.min()) - pad_decades, np.log10(v.max()) + pad_decades
    return float(np.floor(lo / step) * step), float(np.ceil(hi / step) * step)
