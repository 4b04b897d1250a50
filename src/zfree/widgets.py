"""ipywidgets explorers over finished sweeps, and a panel that launches a small sweep.

``SweepExplorer`` redraws the figures of ``zfree.plotting`` from a sweep folder as its
dropdowns (figure, weighting, latent kind) and sliders (beta, reconstruction weight) change;
``LaunchPanel`` expands a beta range × weightings × seeds into points (``zfree.sweeps``), runs
them on an executor in a background thread and refreshes an explorer as each finishes, with a
progress bar. Both keep their state in plain attributes (``figure``, ``selected``, ``statuses``)
so tests drive them headlessly: set a widget's ``value``, read the attribute.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

import ipywidgets as W
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import display

from zfree import plotting as P
from zfree.results import SweepResults, load_sweep
from zfree.sweeps import Executor, Point, expand_grid, run_points

ALL = "all"


def _nearest(values, v):
    values = np.asarray(sorted(values), float)
    return float(values[np.argmin(np.abs(np.log(values) - np.log(v)))]) if len(values) else v


class SweepExplorer:
    """Dropdowns and sliders over one sweep folder; ``widget`` is the box to display.

    Figures (``figure_kind``): phase (β × w diagram, the selected cell outlined), rate_distortion,
    effective_beta and rho (per example, at the selected β), dynamics (training curves of the
    runs at the selected β and weight). ``weighting`` and ``latent_kind`` filter the runs.
    """

    FIGURES = ("phase", "rate_distortion", "effective_beta", "rho", "dynamics")

    def __init__(self, sweep_dir: Path | str, figure: str = "rate_distortion"):
        self.sweep_dir = Path(sweep_dir)
        self.results: SweepResults = load_sweep(self.sweep_dir)
        self.figure: plt.Figure | None = None
        self.selected = pd.DataFrame()
        self.figure_kind = W.Dropdown(options=self.FIGURES, value=figure, description="figure")
        self.weighting = W.Dropdown(options=[ALL], value=ALL, description="weighting")
        self.latent_kind = W.Dropdown(options=[ALL], value=ALL, description="latent kind")
        self.beta = W.SelectionSlider(options=[1.0], value=1.0, description="β", continuous_update=False)
        self.weight = W.SelectionSlider(options=[1.0], value=1.0, description="w", continuous_update=False)
        self.status = W.HTML()
        self.out = W.Output()
        self._hold = False
        self._set_options()
        for w in (self.figure_kind, self.weighting, self.latent_kind, self.beta, self.weight):
            w.observe(lambda _: self.redraw(), names="value")
        self.widget = W.VBox([W.HBox([self.figure_kind, self.weighting, self.latent_kind]),
                              W.HBox([self.beta, self.weight]), self.status, self.out])
        self.redraw()

    def _set_options(self) -> None:
        runs = self.results.runs
        self._hold = True
        try:
            for dd, col in ((self.weighting, "weighting"), (self.latent_kind, "latent_kind")):
                opts = [ALL, *sorted(runs[col].dropna().unique())] if col in runs else [ALL]
                keep = dd.value if dd.value in opts else ALL
                dd.options, dd.value = opts, keep
            for sl, col in ((self.beta, "beta"), (self.weight, "recon_weight")):
                opts = sorted(float(v) for v in runs[col].dropna().unique()) if len(runs) else [1.0]
                keep = _nearest(opts, sl.value)
                sl.options = [(f"{v:.3g}", v) for v in opts]
                sl.value = keep
        finally:
            self._hold = False

    def refresh(self) -> None:
        """Reload the sweep folder (new runs finished) and redraw."""
        self.results = load_sweep(self.sweep_dir)
        self._set_options()
        self.redraw()

    def filtered(self) -> pd.DataFrame:
        runs = self.results.runs
        for dd, col in ((self.weighting, "weighting"), (self.latent_kind, "latent_kind")):
            if dd.value != ALL and col in runs:
                runs = runs[runs[col] == dd.value]
        return runs

    def redraw(self) -> None:
        if self._hold:
            return
        runs = self.filtered()
        self.figure, self.selected = (None, runs.iloc[:0]) if runs.empty else getattr(self, f"_{self.figure_kind.value}")(runs)
        n_err = len(self.results.errors)
        self.status.value = (f"{len(self.results.runs)} finished runs, {n_err} failed; showing {len(self.selected)}"
                             if len(self.results.runs) else "no finished runs yet")
        self.out.clear_output(wait=True)
        if self.figure is not None:
            with self.out:
                display(self.figure)
            plt.close(self.figure)  # shown once, in the output area; its artists stay readable

    def _at_beta(self, runs: pd.DataFrame) -> pd.DataFrame:
        """Per weighting (and facet), the runs at the beta nearest the slider."""
        parts = [g[g["beta"] == _nearest(g["beta"].unique(), self.beta.value)]
                 for _, g in runs.groupby([c for c in P.FACETS if c in runs], sort=False)]
        return pd.concat(parts)

    def _phase(self, runs):
        r = self.results
        return P.plot_phase_diagram(runs, c_base=(r.reference or {}).get("c_base"), beta_over_w=r.critical_beta_over_w(),
                                    critical_betas=r.critical_betas(), highlight=(self.beta.value, self.weight.value)), runs

    def _rate_distortion(self, runs):
        return P.plot_rate_distortion(runs, z_free=float(runs["zfree_distortion"].mean()),
                                      bayes_rate=float(runs["bayes_rate"].mean())), runs

    def _per_example(self, runs):
        sel = self._at_beta(runs)
        pe = self.results.per_example
        return sel, pe[pe["run_id"].isin(sel["run_id"])]

    def _effective_beta(self, runs):
        sel, pe = self._per_example(runs)
        return P.plot_effective_beta(pe), sel

    def _rho(self, runs):
        pe = self.results.per_example
        return P.plot_rho_distributions(pe[pe["run_id"].isin(runs["run_id"])]), runs

    def _dynamics(self, runs):
        sel = runs[np.isclose(runs["beta"], self.beta.value) & np.isclose(runs["recon_weight"], self.weight.value)]
        sel = sel if len(sel) else self._at_beta(runs)
        return P.plot_training_curves({self.results.label(r): self.results.metrics(r["run_id"])
                                       for _, r in sel.iterrows()}), sel


class LaunchPanel:
    """Launch a small sweep: β from 10^lo to 10^hi (``n_beta`` log-spaced values) × the chosen
    weightings × ``seeds`` seeds over the flat ``base`` config, into ``sweep_dir/runs``.

    ``make_executor``: a callable returning an ``Executor`` (default: the local process pool
    with ``workers``). ``explorer`` is refreshed as each run finishes.
    """

    def __init__(self, base: dict[str, Any], sweep_dir: Path | str, explorer: SweepExplorer | None = None,
                 make_executor: Callable[[], Executor] | None = None, workers: int = 2):
        self.base, self.sweep_dir, self.explorer = dict(base), Path(sweep_dir), explorer
        self.make_executor, self.workers = make_executor, workers
        self.log_beta = W.FloatRangeSlider(value=(-2.0, 0.0), min=-4.0, max=1.0, step=0.25, description="log10 β")
        self.n_beta = W.BoundedIntText(value=3, min=1, max=20, description="# β")
        self.weightings = W.SelectMultiple(options=["plain", "distribution", "example", "token"],
                                           value=("plain", "distribution"), description="weightings")
        self.epsilon = W.BoundedFloatText(value=0.05, min=1e-6, max=10.0, description="ε (example)")
        self.seeds = W.BoundedIntText(value=1, min=1, max=10, description="seeds")
        self.button = W.Button(description="launch", button_style="primary")
        self.progress = W.IntProgress(value=0, min=0, max=1, description="runs")
        self.label = W.Label()
        self.statuses: list[dict] = []
        self.thread: threading.Thread | None = None
        self.button.on_click(lambda _: self.launch())
        self.widget = W.VBox([W.HBox([self.log_beta, self.n_beta, self.seeds]),
                              W.HBox([self.weightings, self.epsilon]), W.HBox([self.button, self.progress, self.label])])

    def points(self) -> list[Point]:
        """The grid the widgets describe, validated (ValueError names a bad field)."""
        lo, hi = self.log_beta.value
        betas = [float(f"{b:.4g}") for b in np.logspace(lo, hi, self.n_beta.value)]
        objective = [{"weighting": w, **({"epsilon": self.epsilon.value} if w == "example" else {})}
                     for w in self.weightings.value]
        return expand_grid(self.base, {"objective": objective, "beta": betas, "seed": list(range(self.seeds.value))})

    def _on_done(self, status: dict) -> None:
        self.statuses.append(status)
        self.progress.value += 1
        self.label.value = f"{status['run_id']}: {status['status']}"
        if self.explorer is not None:
            self.explorer.refresh()

    def launch(self, wait: bool = False) -> threading.Thread | None:
        """Start the sweep in a background thread (one at a time); ``wait`` joins it."""
        if self.thread is not None and self.thread.is_alive():
            self.label.value = "a sweep is already running"
            return self.thread
        try:
            points = self.points()
        except ValueError as e:
            self.label.value = f"invalid: {e}"
            return None
        self.statuses, self.progress.value, self.progress.max = [], 0, max(1, len(points))
        self.button.disabled = True

        def work():
            ex = self.make_executor() if self.make_executor else None
            try:
                run_points(points, self.sweep_dir / "runs", executor=ex, workers=self.workers, progress=False,
                           on_done=self._on_done)
            finally:
                if ex is not None:
                    ex.shutdown()
                self.button.disabled = False
                self.label.value = f"done: {sum(s['status'] != 'failed' for s in self.statuses)}/{len(points)} ok"

        self.thread = threading.Thread(target=work, daemon=True)
        self.thread.start()
        if wait:
            self.thread.join()
        return self.thread
