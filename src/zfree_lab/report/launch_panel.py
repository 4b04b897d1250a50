"""The launch panel of the explore notebook: a small sweep from a finished run's config, in the notebook.

``LaunchPanel`` expands a beta range × weightings × seeds (with a chosen aid and step budget) into
points, shows the config diff against its template, runs them through the sweeps' executor loop
(``zfree_lab.experiment.executor.run_points``) in a background thread into its own folder, refreshes a
``zfree_lab.report.widgets.SweepExplorer`` as each finishes, and can be stopped (``stop_workers``, the one
stop path of studies and sweeps). Re-exported by ``zfree_lab.report.widgets``."""

from __future__ import annotations

import html
import threading
from pathlib import Path
from typing import Any, Callable, get_args

import ipywidgets as W
import numpy as np
import pandas as pd

from zfree.config import Aid, TrainConfig
from zfree.core.weightings import WEIGHTING_NAMES, WEIGHTINGS
from zfree.objective.remedies import HARD_EM_RECIPE, SWITCH_ON_RECIPE
from zfree_lab.experiment.executor import Executor, local_executor, run_point, run_points, stop_workers
from zfree_lab.experiment.spec import Point, expand_grid

#: why a plan has no run: every weighting deselected (the grid's product is empty)
NO_WEIGHTING = "no weighting is selected; select at least one to launch"
#: wide widget descriptions (the explorer's too)
WIDE = {"style": {"description_width": "initial"}}
#: the progress bar's colour and label once a launch has ended, per state (running: no colour, "runs")
BAR_STATES = {"done": "success", "failed": "danger", "stopped": "warning"}
#: the statuses that count as finished on the progress bar (a run finished before is skipped, not rerun)
FINISHED = ("finished", "skipped")


def aid_choices() -> dict[str, dict[str, Any]]:
    """The panel's aid menu: every ``config.Aid`` value alone, plus the study's switch-on recipes
    (``zfree.objective.remedies.SWITCH_ON_RECIPE``, the default study's, and ``HARD_EM_RECIPE``; README
    "Making z switch on")."""
    return {**{a: {"aid": a} for a in get_args(Aid)}, "hard_em_then_soft: SWITCH_ON_RECIPE": dict(SWITCH_ON_RECIPE),
            "hard_em_then_soft: HARD_EM_RECIPE": dict(HARD_EM_RECIPE)}


def _clip(text: str, n: int) -> str:
    """``text`` cut to ``n`` characters, "…" saying so (the status line wraps: paths are kept whole)."""
    return text if len(text) <= n else text[:n - 1] + "…"


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


class LaunchPanel:
    """Launch a small sweep: β from 10^lo to 10^hi (``n_beta`` log-spaced values) × the chosen
    weightings × ``seeds`` seeds (``log_beta``: the initial (lo, hi), e.g. ``explore.launch_beta_range``), with the chosen aid (default none) and ``steps``, over the flat
    ``base`` config (the template), into ``sweep_dir/runs`` — a folder of its own (the explore
    notebook uses ``STUDY/launched``), so the study's runs and report stay as they were.

    ``plan`` shows, before launching, every field a launched run changes against the template.
    ``make_executor``: a callable returning an ``Executor`` (default: the local process pool with
    ``workers``). ``explorer`` (anything with a ``refresh()``: a ``zfree_lab.report.widgets.SweepExplorer``,
    or ``zfree_lab.report.explore.ExploreLab``, whose run table follows too; or None) is refreshed as each
    run finishes or fails. ``stop`` cancels the runs not
    started, ends the local pool's workers (a run cut short leaves a folder without summary.json,
    rerun by the next launch) and keeps the finished runs.

    The progress bar shows the finished share (``FINISHED``: a failed, stopped or cancelled run does
    not fill it) and, once the launch ends, its state: the bar's colour and label (``BAR_STATES``).
    """

    def __init__(self, base: dict[str, Any], sweep_dir: Path | str, explorer: Any = None,
                 make_executor: Callable[[], Executor] | None = None, workers: int = 2, steps: int | None = None,
                 run_fn: Callable[[Point, str, str], dict] = run_point, log_beta: tuple[float, float] = (-2.0, 0.0)):
        self.base, self.sweep_dir, self.explorer = dict(base), Path(sweep_dir), explorer
        self.make_executor, self.workers, self.run_fn = make_executor, workers, run_fn
        self.aids = aid_choices()
        self.log_beta = W.FloatRangeSlider(value=log_beta, min=min(-4.0, log_beta[0] - 1), max=max(1.0, log_beta[1] + 1),
                                           step=0.25, description="log10 β",
                                           readout=False, layout=W.Layout(width="320px"), **WIDE)
        self.beta_readout = W.HTML()
        self.n_beta = W.BoundedIntText(value=3, min=1, max=20, description="# β", layout=W.Layout(width="140px"))
        self.weightings = W.SelectMultiple(options=list(WEIGHTING_NAMES),
                                           value=("plain", "distribution"), description="weightings")
        self.epsilon = W.BoundedFloatText(value=0.05, min=1e-6, max=10.0, description="ε (example)", **WIDE)
        self.seeds = W.BoundedIntText(value=1, min=1, max=10, description="seeds", layout=W.Layout(width="140px"))
        self.steps = W.BoundedIntText(value=int(steps or base.get("steps", 250)), min=1, max=100000,
                                      description="steps", layout=W.Layout(width="180px"))
        self.aid = W.Dropdown(options=list(self.aids), value="none", description="aid", **WIDE)
        self.plan = W.HTML()
        self.button = W.Button(description="launch", button_style="primary")
        self.stop_button = W.Button(description="stop", button_style="danger", disabled=True)
        # the status line: plain text (``label.value`` reads as written; HTML-escaped, no quoting
        # needed) in an HTML widget of its own row, so a failure's reason and folder wrap, never cut
        self.progress, self.label = W.IntProgress(value=0, min=0, max=1, description="runs"), W.HTML()
        self.statuses: list[dict] = []
        self.thread: threading.Thread | None = None
        self._ex: Executor | None = None
        self._futures: list = []  # the running launch's futures (run_points' on_submit), cancelled by stop
        self._stopping = threading.Event()
        self._stop_note: str | None = None  # what stop cancelled (stop_workers), for the label
        self._launchable = False  # the plan has at least one valid run (describe): the launch button's state
        self.button.on_click(lambda _: self.launch())
        self.stop_button.on_click(lambda _: self.stop(timeout=0))  # never block the kernel
        for w in (self.log_beta, self.n_beta, self.weightings, self.epsilon, self.seeds, self.steps, self.aid):
            w.observe(lambda _: self.describe(), names="value")
        self.widget = W.VBox([W.HBox([self.log_beta, self.beta_readout, self.n_beta, self.seeds]),
                              W.HBox([self.weightings, W.VBox([self.epsilon, self.aid, self.steps])]),
                              self.plan, W.HBox([self.button, self.stop_button, self.progress]),
                              self.label.add_class("zfree-launch-status")]).add_class("zfree-launch")
        self.describe()

    def _say(self, text: str) -> None:
        """The status line: ``text`` as plain text (only &, <, > escaped, so it reads back as written)."""
        self.label.value = html.escape(text, quote=False)

    def set_template(self, base: dict[str, Any], sweep_dir: Path | str,
                     log_beta: tuple[float, float] | None = None) -> None:
        """Launch from another template into another folder (a study chosen in the explore
        notebook); ``log_beta`` re-centres the β range. The other choices (weightings, seeds, aid,
        steps) stay. RuntimeError, naming the folder, while a launch is running."""
        if self.thread is not None and self.thread.is_alive():
            raise RuntimeError(f"a launch is running into {self.sweep_dir / 'runs'}: stop it, or let it finish, first")
        self.base, self.sweep_dir = dict(base), Path(sweep_dir)
        if log_beta is not None:
            self.log_beta.min, self.log_beta.max = min(-4.0, log_beta[0] - 1), max(1.0, log_beta[1] + 1)
            self.log_beta.value = log_beta
        self.statuses = []
        self._bar("runs", 0)
        self._say("")
        self.describe()

    def betas(self) -> list[float]:
        """The launched β values: ``n_beta`` log-spaced over the slider's range; one β is the
        template's own (a run like the study's, not the range's lower end)."""
        if self.n_beta.value <= 1:
            return [float(self.base.get("beta", 10 ** self.log_beta.value[0]))]
        lo, hi = self.log_beta.value
        return [float(f"{b:.4g}") for b in np.logspace(lo, hi, self.n_beta.value)]

    def points(self) -> list[Point]:
        """The grid the widgets describe, validated (ValueError names a bad field)."""
        betas = self.betas()
        objective = [{"weighting": w, **({"epsilon": self.epsilon.value} if WEIGHTINGS[w].needs_epsilon else {})}
                     for w in self.weightings.value]
        base = {**self.base, **self.aids[self.aid.value], "steps": int(self.steps.value)}
        return expand_grid(base, {"objective": objective, "beta": betas, "seed": list(range(self.seeds.value))})

    def diff(self, points: list[Point]) -> pd.DataFrame:
        """Every field whose launched value differs from the template: field, template, launched
        (the sorted distinct values over the points). A field the template's config predates counts
        at its default (the run that wrote it trained so), so it is not listed as a change."""
        rows = []
        defaults = TrainConfig().to_flat()
        for k in sorted({k for p in points for k in p.params}):
            vals = sorted({_fmt(p.params[k]) for p in points})
            template = _fmt(self.base.get(k, defaults.get(k, "—")))
            if vals != [template]:
                rows.append({"field": k, "template": template, "launched": ", ".join(vals)})
        return pd.DataFrame(rows, columns=["field", "template", "launched"])

    def warnings(self, points: list[Point]) -> list[str]:
        """Plain-language consequences of the choices (e.g. a hard EM phase that outlasts the run)."""
        if not points:
            return []
        p = points[0].params
        out = []
        if p.get("aid") == "hard_em_then_soft" and p["hard_em_max_steps"] >= p["steps"]:
            out.append(f"hard_em_max_steps={p['hard_em_max_steps']} ≥ steps={p['steps']}: the hand-over to the soft "
                       "objective is forced only after the run ends, so unless the gate passes earlier the run "
                       "stays in the hard-EM phase (handover_step None)")
        return out

    def describe(self) -> str:
        """Fill ``plan`` (the run count, the target folder, the diff table, warnings); returns its HTML.
        The launch button is enabled only for a plan of at least one valid run (and not while one runs)."""
        self.beta_readout.value = "β = " + ", ".join(f"{b:.4g}" for b in self.betas()) + (
            " (the template's)" if self.n_beta.value <= 1 else "")
        try:
            points = self.points()
        except ValueError as e:
            points, self.plan.value = [], f"<b>invalid:</b> {html.escape(str(e))}"
        self._launchable = bool(points)
        self.button.disabled = not self._launchable or not self.stop_button.disabled  # stop is enabled while running
        if not points:
            if not self.weightings.value:
                self.plan.value = f"<b>0 runs:</b> {html.escape(NO_WEIGHTING)}"
            return self.plan.value
        d = self.diff(points)
        td = "<td style='padding:0 12px 0 0'>"
        rows = "".join(f"<tr>{td}{html.escape(r.field)}</td>{td}{html.escape(r.template)}</td>"
                       f"{td}<b>{html.escape(r.launched)}</b></td></tr>" for r in d.itertuples())
        warn = "".join(f"<div style='color:#b00'>⚠ {html.escape(w)}</div>" for w in self.warnings(points))
        self.plan.value = (f"<div>{len(points)} run(s) into <code>{html.escape(str(self.sweep_dir / 'runs'))}</code>; "
                           f"fields that differ from the template:</div>"
                           f"<table style='font-size:90%'><tr><th align=left>field</th><th align=left>template</th>"
                           f"<th align=left>launched</th></tr>{rows}</table>{warn}")
        return self.plan.value

    def _bar(self, state: str, finished: int, total: int | None = None) -> None:
        """The progress bar: ``finished`` of ``total`` runs, coloured and labelled by ``state`` ("runs"
        while running, else a key of ``BAR_STATES``)."""
        if total is not None:
            self.progress.max = max(1, total)
        self.progress.value = finished
        self.progress.bar_style = BAR_STATES.get(state, "")
        self.progress.description = state

    def _finished(self) -> int:
        return sum(s["status"] in FINISHED for s in self.statuses)

    def _on_done(self, status: dict) -> None:
        self.statuses.append(status)
        self.progress.value = self._finished()
        self._say(f"{len(self.statuses)}/{self.progress.max}: {status['run_id']} {status['status']}")
        if self.explorer is not None and status["status"] in ("finished", "failed"):  # failures count at once
            self.explorer.refresh()

    def launch(self, wait: bool = False) -> threading.Thread | None:
        """Start the sweep in a background thread (one at a time); ``wait`` joins it."""
        if self.thread is not None and self.thread.is_alive():
            self._say("a sweep is already running")
            return self.thread
        try:
            points = self.points()
        except ValueError as e:
            self._say(f"invalid: {e}")
            return None
        if not points:
            self._say(f"nothing to launch: 0 runs ({NO_WEIGHTING})")
            return None
        self.statuses = []
        self._bar("runs", 0, len(points))
        self._say(f"running: 0/{len(points)}")
        self.button.disabled, self.stop_button.disabled = True, False
        self._stopping.clear()
        self._stop_note = None
        self.thread = threading.Thread(target=self._work, args=(points,), daemon=True)
        self.thread.start()
        if wait:
            self.thread.join()
        return self.thread

    def _work(self, points: list[Point]) -> None:
        """The launch thread: the points through ``run_points`` (the sweeps' executor loop) on this
        panel's executor, cancellable by ``stop``; the label says how it ended."""
        self._ex = ex = self.make_executor() if self.make_executor else local_executor(self.workers)
        broken = ""
        try:
            run_points(points, self.sweep_dir / "runs", executor=ex, progress=False, on_done=self._on_done,
                       run_fn=self.run_fn, on_submit=lambda futs: setattr(self, "_futures", futs),
                       stopping=self._stopping)
        except Exception as e:  # noqa: BLE001 - e.g. the executor refused a job: say so, do not die silently
            broken = f"; {type(e).__name__}: {e}"[:300]
        finally:
            if not self._stopping.is_set():  # stop shut the pool down already: a second shutdown racing it
                try:                          # closed its result pipe twice (OSError: Bad file descriptor)
                    ex.shutdown(wait=True)    # and left the panel's buttons and label as they were
                except OSError:
                    pass
            self.button.disabled, self.stop_button.disabled = not self._launchable, True
            ok = self._finished()
            failed = [s for s in self.statuses if s["status"] == "failed"]
            state = "stopped" if self._stopping.is_set() else "failed" if broken or failed else "done"
            why = ""
            if failed:  # never "done" for a failure: how many, the first one's reason and where to look
                first = failed[0]
                reason = str(first.get("error", "")).strip().splitlines()[-1:] or ["no reason recorded"]
                why = (f"; {len(failed)} failed, first {first['run_id']}: {_clip(reason[0], 600)} "
                       f"(see {self.sweep_dir / 'runs' / first['run_id'] / 'error.json'})")
            done = "finished" if state == "stopped" else "ok"
            note = f"; {self._stop_note}" if state == "stopped" and self._stop_note else ""
            self._bar(state, ok)
            self._say(f"{state}: {ok}/{len(points)} {done}{why}{broken}{note}")

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel the runs not yet started and end the running workers (the local process pool's
        are terminated, their kernels exit with their parent; a SLURM executor's jobs are
        cancelled with scancel: ``stop_workers``); finished runs stay. Joins the thread."""
        if self.thread is None or not self.thread.is_alive():
            return
        self._stopping.set()
        self._say("stopping…")
        # the one stop path of studies and sweeps: the pool's workers (and their kernels) end first, the
        # points not started are cancelled after (cancelled before, CPython's pool manager thread died on
        # them and the launch thread waited in as_completed forever)
        self._stop_note = stop_workers(self._ex, self._futures)  # e.g. the SLURM jobs cancelled
        self.thread.join(timeout)
