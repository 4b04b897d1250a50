"""ipywidgets explorers over finished sweeps, and a panel that launches a small sweep.

``SweepExplorer`` redraws the figures of ``zfree_lab.report.plotting`` from one or more sweep folders (a
study and the runs launched beside it) as its dropdowns (figure, source, weighting, latent kind) and
sliders (beta, reconstruction weight) change, offering only what the data has (a one-value dropdown
is hidden and named in the note line; a slider that cannot change the figure is disabled, saying
why). ``LaunchPanel`` expands a beta range × weightings × seeds (with a chosen aid and step budget)
into points, shows the config diff against its template, runs them through the sweeps' executor
loop (``zfree_lab.experiment.executor.run_points``) in a background thread into its own folder,
refreshes an explorer as each finishes, and can be stopped (``zfree_lab.report.launch_panel``, re-exported
here). Both keep their state in plain attributes
(``figure``, ``selected``, ``statuses``): tests set a widget's ``value``, read the attribute."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Sequence

import ipywidgets as W
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from zfree.core.io import read_jsonl
from zfree_lab.experiment.results import SweepResults, load_sweep
from zfree_lab.report import plotting as P
from zfree_lab.report.figstyle import FACETS, wrap_panels
from zfree_lab.report.launch_panel import WIDE, LaunchPanel, aid_choices  # noqa: F401 - the notebooks' import
from zfree_lab.report.report import figure_png, nearest, runs_at_beta

ALL = "all"  # the no-filter value


def load_sweeps(sweep_dirs: Sequence[Path | str]) -> SweepResults:
    """Several sweep folders as one ``SweepResults``: the runs of every folder that exists, with a
    ``source`` column (the first folder is ``study``, the others their path relative to it or
    their name); the reference and validation rows of the first folder that has them."""
    dirs, parts, names = [Path(d).resolve() for d in sweep_dirs], [], []
    for d in dirs:
        if d == dirs[0] or (d / "runs").exists():
            parts.append(load_sweep(d))
            names.append("study" if d == dirs[0] else str(d.relative_to(dirs[0]) if d.is_relative_to(dirs[0]) else d.name))
    runs = pd.concat([p.runs.assign(source=n) for p, n in zip(parts, names) if len(p.runs)], ignore_index=True) \
        if any(len(p.runs) for p in parts) else parts[0].runs
    ref = next((p for p in parts if p.reference is not None), parts[0])
    return SweepResults(dirs[0], runs, [e for p in parts for e in p.errors], ref.reference, ref.examples)


class SweepExplorer:
    """Dropdowns and sliders over sweep folders; ``widget`` is the box to display.

    Figures (``figure_kind``): phase (β × w diagram, the selected cell outlined), rate_distortion,
    effective_beta (per example, at the selected β), rho (per example, every β) and dynamics
    (training curves of the runs at the selected β and weight). ``source``, ``weighting`` and
    ``latent_kind`` filter the runs. ``sweep_dir``: one folder or a list (the first is the study).
    """

    FIGURES = ("phase", "rate_distortion", "effective_beta", "rho", "dynamics")
    #: which sliders each figure reads
    USES = {"phase": ("beta", "weight"), "rate_distortion": (), "effective_beta": ("beta",), "rho": (),
            "dynamics": ("beta", "weight")}
    FILTERS = (("source", "source"), ("weighting", "weighting"), ("latent_kind", "latent kind"))

    def __init__(self, sweep_dir: Path | str | Sequence[Path | str], figure: str = "rate_distortion"):
        self.sweep_dirs = [Path(sweep_dir)] if isinstance(sweep_dir, (str, Path)) else [Path(d) for d in sweep_dir]
        self.sweep_dir = self.sweep_dirs[0]
        self.results: SweepResults = load_sweeps(self.sweep_dirs)
        self.figure: plt.Figure | None = None
        self.selected = pd.DataFrame()
        self.figure_kind = W.Dropdown(options=self.FIGURES, value=figure, description="figure")
        self.filters = {col: W.Dropdown(options=[ALL], value=ALL, description=desc, **WIDE)
                        for col, desc in self.FILTERS}
        self.weighting, self.latent_kind, self.source = (self.filters[c] for c in ("weighting", "latent_kind", "source"))
        self.beta = W.SelectionSlider(options=[1.0], value=1.0, description="β", continuous_update=False,
                                      layout=W.Layout(width="340px"), **WIDE)
        self.weight = W.SelectionSlider(options=[1.0], value=1.0, description="w", continuous_update=False,
                                        layout=W.Layout(width="340px"), **WIDE)
        self.beta_note, self.weight_note, self.note, self.status = W.HTML(), W.HTML(), W.HTML(), W.HTML()
        self.out = W.Output()
        self._hold = False
        self._set_options()
        self.figure_kind.observe(lambda _: self._set_sliders() or self.redraw(), names="value")
        for dd in self.filters.values():
            dd.observe(lambda _: self._set_sliders() or self.redraw(), names="value")
        for sl in (self.beta, self.weight):
            sl.observe(lambda _: self.redraw(), names="value")
        self.widget = W.VBox([W.HBox([self.figure_kind, *self.filters.values()]),
                              W.HBox([self.beta, self.beta_note]), W.HBox([self.weight, self.weight_note]),
                              self.note, self.status, self.out]).add_class("zfree-explorer")
        self.redraw()

    def _set_options(self) -> None:
        """Dropdowns from the data: a column with one value hides its dropdown (named in ``note``)."""
        runs = self.results.runs
        self._hold = True
        try:
            only = []
            for col, dd in self.filters.items():
                values = sorted(runs[col].dropna().astype(str).unique()) if col in runs else []
                opts = [ALL, *values] if len(values) > 1 else [ALL]
                keep = dd.value if dd.value in opts else ALL
                dd.options, dd.value = opts, keep
                dd.layout.display = None if len(values) > 1 else "none"
                if len(values) == 1 and col != "source":
                    only.append(f"{col.replace('_', ' ')}: {html.escape(values[0])}")
            self.note.value = f"<i>every run has {', '.join(only)}</i>" if only else ""
        finally:
            self._hold = False
        self._set_sliders()

    def _set_sliders(self) -> None:
        """Slider values from the filtered runs; disabled with a note when the figure does not read
        the slider or moving it cannot change what is drawn."""
        runs = self.filtered()
        groups = [c for c in FACETS if c in runs]
        self._hold = True
        try:
            for name, sl, note, col in (("beta", self.beta, self.beta_note, "beta"),
                                        ("weight", self.weight, self.weight_note, "recon_weight")):
                opts = sorted(float(v) for v in runs[col].dropna().unique()) if len(runs) and col in runs else [1.0]
                keep = nearest(opts, sl.value)
                sl.options = [(f"{v:.3g}", v) for v in opts]
                sl.value = keep
                per_group = runs.groupby(groups)[col].nunique().max() if len(runs) and groups and col in runs else 1
                if name not in self.USES[self.figure_kind.value]:
                    why = "not read by this figure"
                elif len(opts) == 1:
                    why = f"one value in this selection ({opts[0]:.3g})"
                elif name == "beta" and self.figure_kind.value == "effective_beta" and per_group == 1:
                    why = "one β per weighting here: each weighting is drawn at its only β"
                else:
                    why = ""
                sl.disabled = bool(why)
                note.value = f"<span style='color:gray'>{why}</span>" if why else ""
        finally:
            self._hold = False

    def refresh(self) -> None:
        """Reload the sweep folders (new runs finished) and redraw."""
        self.open(self.sweep_dirs)

    def open(self, sweep_dir: Path | str | Sequence[Path | str]) -> None:
        """Show other sweep folders (one, or a list whose first is the study), as the constructor
        takes them; the filters keep a value the new runs have. Errors of ``load_sweep`` (e.g.
        NoStudyError for a missing folder) leave the explorer on its current folders."""
        dirs = [Path(sweep_dir)] if isinstance(sweep_dir, (str, Path)) else [Path(d) for d in sweep_dir]
        results = load_sweeps(dirs)
        self.sweep_dirs, self.sweep_dir, self.results = dirs, dirs[0], results
        self._set_options()
        self.redraw()

    def filtered(self) -> pd.DataFrame:
        """The study's CVAE runs (one row each) kept by every filter dropdown not set to "all"."""
        runs = self.results.runs
        for col, dd in self.filters.items():
            if dd.value != ALL and col in runs:
                runs = runs[runs[col].astype(str) == dd.value]
        return runs

    def redraw(self) -> None:
        """Draw the chosen figure of the filtered runs into the output (nothing while a batch of
        widget changes is held); safe from another thread (the launch panel's refresh)."""
        if self._hold:
            return
        # said at once (a widget's value goes to the page when set): the old figure stays up while this one draws
        self.status.value = f"<i>drawing the {self.figure_kind.value} figure…</i>"
        runs = self.filtered()
        self.figure, self.selected = (None, runs.iloc[:0]) if runs.empty else getattr(self, f"_{self.figure_kind.value}")(runs)
        n_err = len(self.results.errors)
        self.status.value = (f"{len(self.results.runs)} finished runs, {n_err} failed; showing {len(self.selected)}"
                             if len(self.results.runs) else "no finished runs yet")
        if self.figure is None:
            self.out.outputs = ()
            return
        wrap_panels(self.figure)
        # a PNG rendered here: shown under any backend (MPLBACKEND=Agg too); the figure is closed after,
        # its artists still readable. Set as the Output's outputs rather than captured with `with
        # self.out`: capture works only on the kernel's main thread, and the launch panel refreshes
        # the explorer from its own thread (the figure then stayed the old one)
        png = base64.b64encode(figure_png(self.figure)).decode("ascii")
        self.out.outputs = ({"output_type": "display_data", "metadata": {},
                             "data": {"image/png": png, "text/plain": "<zfree explorer figure>"}},)

    def _phase(self, runs):
        r = self.results
        return P.plot_phase_diagram(runs, c_base=(r.reference or {}).get("c_base"), beta_over_w=r.critical_beta_over_w(),
                                    critical_betas=r.critical_betas(), highlight=(self.beta.value, self.weight.value)), runs

    def _rate_distortion(self, runs):
        return P.plot_rate_distortion(runs, z_free=float(runs["zfree_distortion"].mean()),
                                      bayes_rate=float(runs["bayes_rate"].mean())), runs

    def _effective_beta(self, runs):
        sel = runs_at_beta(runs, self.beta.value)  # per weighting (and facet), the runs at the slider's beta
        pe = self.results.per_example
        return P.plot_effective_beta(pe[pe["run_id"].isin(sel["run_id"])]), sel

    def _rho(self, runs):
        pe = self.results.per_example
        return P.plot_rho_distributions(pe[pe["run_id"].isin(runs["run_id"])]), runs

    def _dynamics(self, runs):
        sel = runs[np.isclose(runs["beta"], self.beta.value) & np.isclose(runs["recon_weight"], self.weight.value)]
        sel = sel if len(sel) else runs_at_beta(runs, self.beta.value)
        return P.plot_training_curves({self.results.label(r): pd.DataFrame(read_jsonl(Path(r["run_dir"]) / "metrics.jsonl"))
                                       for _, r in sel.iterrows()}), sel
