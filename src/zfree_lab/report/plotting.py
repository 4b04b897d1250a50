"""Figures of the notebook suite: training curves, the phase diagram and rate-distortion plane of a
sweep, per-example beta_eff and rho distributions. Each function takes tidy pandas data and returns
a matplotlib Figure (headless-safe; tests check the data drawn, not the pixels). The study report's
figures against beta are in ``zfree_lab.report.plotting_study``, the aided runs' in ``plotting_aids``; the
rate-distortion plane in ``zfree_lab.report.rate_distortion`` (re-exported here)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from zfree.objective.theory import excess_nll, use_threshold
from zfree_lab.report.figstyle import FACET_MARKERS, FACETS, LINESTYLES
from zfree_lab.report.figstyle import literal
from zfree_lab.report.figstyle import groups as _groups
from zfree_lab.report.figstyle import legend_below as _legend_below
from zfree_lab.report.figstyle import log_axis as _log_axis
from zfree_lab.report.figstyle import paper as _paper
from zfree_lab.report.figstyle import rho_limits as _rho_limits
from zfree_lab.report.rate_distortion import LBAR, plot_rate_distortion  # noqa: F401 - the notebooks' import

#: ℓ̄_i (a row's mean token loss) in mathtext, as ``LBAR``
LBAR_I = r"$\bar{\ell}_i$"


#: one marker per run of ``plot_training_curves`` (open and line markers: one drawn over another stays visible)
RUN_MARKERS = [".", "x", "+", "1", "2", "3", "4", "|"]


@_paper
def plot_training_curves(metrics: dict[str, pd.DataFrame], collapse_kl: float = 0.05) -> plt.Figure:
    """Per run (label -> metrics.jsonl as a DataFrame): the share of the objective of every
    ``loss_contrib/fraction_abs/<term>`` (one line style per term), KL, rho_recon and alignment
    NMI over steps: the "collapse moment" plot. A dotted vertical line marks, per run, the first
    evaluation after step 0 whose KL is below ``collapse_kl`` nats (the collapse criterion of the
    main job's acceptance). Each run has its colour and its marker (``RUN_MARKERS``): runs whose curves
    coincide (plain and distribution weighting at a relabelled β do, under Adam) stay both visible."""
    keys = [("loss/val/kl_prior_loss", "rate KL [nats / example]"),
            ("loss/val/baseline_normalized_reconstruction_loss", "ρ_recon = R_val / c_base (ratio of means)"),
            ("structure/alignment_nmi", "alignment NMI (argmax z vs strategy)")]
    fig, axes = plt.subplots(2, 2, figsize=(10, 6.4))  # 2 × 2: readable at the report's width
    axes = axes.flatten()
    for i, (label, df) in enumerate(metrics.items()):
        color, marker = f"C{i % 10}", RUN_MARKERS[i % len(RUN_MARKERS)]
        terms = [c for c in df.columns if c.startswith("loss_contrib/fraction_abs/")]
        for j, t in enumerate(terms):
            axes[0].plot(df["step"], df[t], LINESTYLES[j % 4], color=color, marker=marker,
                         label=literal(f"{label}: {t.rsplit('/', 1)[-1]}"))
        for ax, (k, name) in zip(axes[1:], keys):
            if k in df:
                ax.plot(df["step"], df[k], marker=marker, color=color, label=literal(label))
        if "loss/val/kl_prior_loss" in df:
            late = df[(df["step"] > 0) & (df["loss/val/kl_prior_loss"] < collapse_kl)]
            if len(late):
                axes[1].axvline(late["step"].iloc[0], color=color, ls=":", lw=1)
    axes[0].set_title("share of the objective |contrib| / Σ|contrib|", fontsize=9)
    for ax, (k, name) in zip(axes[1:], keys):
        ax.set_title(name, fontsize=9)
    axes[1].axhline(collapse_kl, color="gray", lw=0.6, ls="--")
    _rho_limits(axes[2])
    axes[0].set_ylim(-0.02, 1.02)  # shares and NMI live on [0, 1]: one scale in every report
    axes[3].set_ylim(-0.02, 1.02)
    if not any(k in df and df[k].notna().any() for df in metrics.values() for k in ("structure/alignment_nmi",)):
        axes[3].set_visible(False)  # no strategy labels: no empty panel (the notebook says why in one line)
    for ax in axes:
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole: no "step 2.5"
    fig.tight_layout()
    # two legends below the panels, outside the data: runs by color, terms (and the KL panel's marks) by line style
    runs = [Line2D([], [], color=f"C{i % 10}", marker=RUN_MARKERS[i % len(RUN_MARKERS)], label=literal(label))
            for i, label in enumerate(metrics)]
    terms = list(dict.fromkeys(c.rsplit("/", 1)[-1] for df in metrics.values() for c in df.columns
                               if c.startswith("loss_contrib/fraction_abs/")))
    styles_h = [Line2D([], [], color="k", ls=LINESTYLES[j % 4], label=literal(f"{t} (top left)")) for j, t in enumerate(terms)]
    styles_h += [Line2D([], [], color="gray", lw=0.6, ls="--", label=f"KL = {collapse_kl:g}: collapsed below (KL panel)"),
                 Line2D([], [], color="k", lw=1, ls=":", label="a run's first evaluation after step 0 below it (KL panel)")]
    first = fig.legend(handles=runs, loc="upper right", bbox_to_anchor=(0.62, 0.0), ncol=2, fontsize=7,
                       frameon=False, title="run (color)", title_fontsize=7)
    fig.legend(handles=styles_h, loc="upper left", bbox_to_anchor=(0.64, 0.0), ncol=1, fontsize=7, frameon=False,
               title="line style", title_fontsize=7)
    fig.add_artist(first)
    return fig


# --- the figures of the notebook suite -------------------------------------------------------

PHASE_METRICS = (("kl_prior_loss", "rate KL [nats / example]", "viridis"),
                 ("baseline_normalized_reconstruction_loss", "ρ_recon = R_val / c_base (ratio of means)", "magma_r"),
                 ("alignment_nmi", "alignment NMI", "viridis"),
                 ("task_correctness", "task correctness", "viridis"))
#: color range per metric: (vmin, vmax), None = the data's; the rate and rho from 0 to at least
#: 1 (a collapsed run's 1e-4 nats stays dark instead of spanning the colorbar), the fractions on
#: [0, 1], so one color means one value in every report
PHASE_RANGES = {"kl_prior_loss": (0.0, 1.0), "baseline_normalized_reconstruction_loss": (0.0, 1.0),
                "alignment_nmi": (0.0, 1.0), "task_correctness": (0.0, 1.0)}


@_paper
def plot_phase_diagram(runs: pd.DataFrame, c_base: float | None = None, beta_over_w: float | None = None,
                       critical_betas: dict[str, float] | None = None, metrics=PHASE_METRICS,
                       highlight: tuple[float, float] | None = None, variant: str = "") -> plt.Figure:
    """The beta × w phase diagram: one panel per metric, one square per run at (beta,
    w = ``recon_weight``, the mean reconstruction weight), colored by the metric (mean over
    seeds and facets that share a cell).

    Overlays: the row w = 1/c_base (``distribution``) marked on the w axis; the predicted
    boundary beta = ``beta_over_w`` · w of theory (beta_eff = beta·|S|/w < 1 for half of the
    examples; solid black) — itself a line of constant beta/w; thin dotted lines of constant
    beta/w through the grid (along them a scale-invariant optimizer such as Adam trains
    identically, docs/concepts/weightings.md); and ``critical_betas`` (weighting -> predicted beta*) as
    a black × on each weighting's row (the ``example`` row is not a scalar weight, so its beta* is off
    the line). ``highlight``: a (beta, w) cell outlined in red (the widgets' selection).
    ``variant``: named in the title (one diagram per aid / latent kind: ``figstyle.variants``).
    """
    metrics = [m for m in metrics if m[0] in runs and runs[m[0]].notna().any()]
    n = max(1, len(metrics))
    ncol = min(2, n)
    fig, axes = plt.subplots((n + 1) // 2, ncol, figsize=(5.4 * ncol, 4.2 * ((n + 1) // 2)),
                             squeeze=False)
    cells = runs.groupby(["beta", "recon_weight"], as_index=False)[[m[0] for m in metrics]].mean()
    shown = [*runs["beta"], *(critical_betas or {}).values()]
    b_lo, b_hi = min(shown) / 2, max(shown) * 2
    w_lo, w_hi = runs["recon_weight"].min() / 2, runs["recon_weight"].max() * 2
    for i, (ax, (key, name, cmap)) in enumerate(zip(axes.flat, metrics)):
        vmin, vmax = PHASE_RANGES.get(key, (None, None))
        top = float(cells[key].max()) if cells[key].notna().any() else 1.0
        vmax = max(vmax, top) if vmax is not None else (top if vmin is None else max(top, vmin + 1e-3))
        sc = ax.scatter(cells["beta"], cells["recon_weight"], c=cells[key], cmap=cmap, marker="s", s=150,
                        edgecolors="k", linewidths=0.4, zorder=3, vmin=vmin, vmax=vmax)
        fig.colorbar(sc, ax=ax, label=name)
        _phase_overlays(ax, runs, (b_lo, b_hi, w_lo, w_hi), c_base, beta_over_w, critical_betas, highlight)
        ax.set_xlim(b_lo, b_hi)
        ax.set_ylim(w_lo, w_hi)
        _log_axis(ax, "x", runs["beta"])
        _log_axis(ax, "y")
        # the rows named on the w axis, weightings on (nearly) one row under one tick (their names
        # would otherwise print over each other)
        rows = _row_labels(runs)
        ax.set_yticks([y for y, _ in rows], [literal(" / ".join(n)) + "\n" + _w_range(runs, n) for _, n in rows],
                      fontsize=7)
        if i % ncol:  # the row names once per figure row: the right panel's would meet the left colorbar
            ax.tick_params(axis="y", labelleft=False)
        ax.set_xlabel("β")
        ax.set_ylabel("" if i % ncol else "reconstruction weight w")
        ax.set_title(name, fontsize=9)
    for ax in list(axes.flat)[len(metrics):]:
        ax.set_visible(False)
    fig.suptitle("Phase diagram β × w" + (f": {literal(variant)}" if variant else "")
                 + " (dotted: constant β/w, identical training under Adam)")
    fig.tight_layout()
    _legend_below(fig, axes.flat[0], ncol=3)
    return fig


def _phase_overlays(ax, runs: pd.DataFrame, box: tuple[float, float, float, float], c_base, beta_over_w,
                    critical_betas, highlight) -> None:
    """``plot_phase_diagram``'s overlays on one panel (``box``: beta and w limits), as its docstring lists."""
    b_lo, b_hi, w_lo, w_hi = box
    ws = np.geomspace(w_lo, w_hi, 50)
    for ratio in np.geomspace(b_lo / w_hi, b_hi / w_lo, 9):  # lines of constant beta / w
        ax.plot(ratio * ws, ws, ":", color="gray", lw=0.6, zorder=1)
    if beta_over_w:
        ax.plot(beta_over_w * ws, ws, "-", color="k", lw=1.4, zorder=2, label="predicted boundary β = (β*/w)·w (half of the rows use z)")
    for w, b in (critical_betas or {}).items():
        rows = runs[runs["weighting"] == w]
        if len(rows):
            ax.scatter([b], [rows["recon_weight"].mean()], marker="x", color="k", s=60, zorder=4,
                       label="predicted β* of the weighting (half of the rows use z)")
    if c_base:
        ax.axhline(1 / c_base, color="tab:orange", lw=0.8, ls="--", zorder=1, label="w = 1/c_base")
    if highlight is not None:
        ax.scatter([highlight[0]], [highlight[1]], marker="s", s=420, facecolors="none", edgecolors="red",
                   linewidths=1.5, zorder=5)


def _w_range(runs: pd.DataFrame, names: list[str]) -> str:
    ws = runs.loc[runs["weighting"].isin(names), "recon_weight"]
    lo, hi = ws.min(), ws.max()
    return f"w = {lo:.3g}" if np.isclose(lo, hi, rtol=1e-3) else f"w = {lo:.3g}–{hi:.3g}"


def _row_labels(runs: pd.DataFrame, factor: float = 1.25) -> list[tuple[float, list[str]]]:
    """(w, weightings) per row of the phase diagram: weightings whose mean w lie within
    ``factor`` of each other (e.g. distribution and token with a distribution outer weight) are
    merged into one label, so their names do not print over each other."""
    ws = sorted(((float(g["recon_weight"].mean()), w) for w, g in runs.groupby("weighting", sort=False)))
    out: list[tuple[float, list[str]]] = []
    for y, w in ws:
        if out and y / out[-1][0] < factor:
            out[-1][1].append(w)
        else:
            out.append((y, [w]))
    return out


@_paper
def plot_effective_beta(per_example: pd.DataFrame, eta: float | None = None) -> plt.Figure:
    """Per-example beta_eff = beta·|S|/w (docs/concepts/theory.md) per weighting: against b
    (nats per token), against |S|, and per-example KL (nats per sequence) against beta_eff —
    which examples use z. The line beta_eff = 1 is drawn in every panel (theory: z is worth
    using iff beta_eff < 1 for a Bayes-optimal base), and, where the rows' Bayes NLL is known and the base
    falls short of it, the median use threshold 1 + |S|·excess / Bayes NLL that the predicted use counts. ``per_example``: rows of the runs' per_example tables tagged with
    weighting (and facets), one beta per weighting. ``eta``: the measured exchange rate of the best
    label (``zfree_lab.experiment.gains``), drawn as a second threshold β_eff = η (z pays where β_eff < η)."""
    fig, axes = plt.subplots(1, 3, figsize=(12.5, 3.8))
    for label, color, ls, rows in _groups(per_example):
        # facets apart from the weighting by marker, filled for the first and open for the others: runs
        # at one beta and weighting share every beta_eff, and an open marker shows over a filled one
        style = (dict(s=8, alpha=0.6, color=color) if ls == "-" else
                 dict(s=22, alpha=0.9, facecolors="none", edgecolors=color, linewidths=0.8))
        style.update(marker=FACET_MARKERS[ls], label=literal(label))
        axes[0].scatter(rows["b"], rows["beta_eff"], **style)
        axes[1].scatter(rows["n_tokens"], rows["beta_eff"], **style)
        axes[2].scatter(rows["beta_eff"], rows["kl"], **style)
    for ax in axes[:2]:
        ax.axhline(1.0, color="k", lw=1, ls="--", label="β_eff = 1")
        _log_axis(ax, "y")
        ax.set_ylabel("β_eff = β·|S| / w")
    axes[2].axvline(1.0, color="k", lw=1, ls="--", label="β_eff = 1")
    lifted = _median_use_threshold(per_example)
    if lifted is not None:  # a base short of Bayes-optimal: the rule the predicted use counts
        for ax in axes[:2]:
            ax.axhline(lifted, color="tab:gray", lw=1, ls="-.", label=f"use threshold, median {lifted:.3g} (base's excess)")
        axes[2].axvline(lifted, color="tab:gray", lw=1, ls="-.", label=f"use threshold, median {lifted:.3g} (base's excess)")
    if eta:
        for ax in axes[:2]:
            ax.axhline(eta, color="tab:red", lw=1, ls=":", label=f"β_eff = η = {eta:.3g} (measured)")
        axes[2].axvline(eta, color="tab:red", lw=1, ls=":", label=f"β_eff = η = {eta:.3g} (measured)")
    _log_axis(axes[2], "x")
    axes[0].set_xlabel("b (z-free NLL, nats / token)")
    axes[1].set_xlabel("|S| (supervised tokens)")
    axes[1].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[2].set_xlabel("β_eff")
    axes[2].set_ylabel("per-example KL [nats / sequence]")
    axes[2].set_title("which examples use z", fontsize=9)
    if _share_beta_eff(per_example):
        axes[0].set_title("runs at one β and weighting share every β_eff: one marker over the other", fontsize=8,
                          loc="left")
    fig.tight_layout()
    _legend_below(fig, axes, ncol=5)
    return fig


def _median_use_threshold(per_example: pd.DataFrame) -> float | None:
    """The median over rows of the β_eff below which z pays (``zfree.objective.theory.use_threshold``:
    1 + |S|·excess / Bayes NLL) where every row's Bayes NLL is known and the median lies above 1, else None."""
    if not {"bayes_nll", "b", "n_tokens"} <= set(per_example) or per_example.empty:
        return None
    bayes = per_example["bayes_nll"].to_numpy(float)
    if not np.isfinite(bayes).all():
        return None
    thr = use_threshold(bayes, excess_nll(per_example["n_tokens"], per_example["b"], bayes))[bayes > 0]
    return float(np.median(thr)) if thr.size and np.median(thr) > 1 + 1e-9 else None


def _share_beta_eff(per_example: pd.DataFrame) -> bool:
    """True when two groups of ``plot_effective_beta`` (facet combinations) have a weighting and a
    beta in common: their beta_eff = beta·|S|/w are the same per row, so their points coincide."""
    facets = [f for f in FACETS[1:] if f in per_example and per_example[f].nunique() > 1]
    if not facets or per_example.empty:
        return False
    return bool((per_example.groupby(["weighting", "beta"])[facets].nunique() > 1).any(axis=None))


@_paper
def plot_rho_distributions(per_example: pd.DataFrame) -> plt.Figure:
    """Per-example rho_i = ℓ̄_i / b_i distributions (box per beta), one panel per weighting (and
    facet), with both summaries named: the mean of ratios mean_i rho_i (open circle) and the
    ratio of means rho_recon = mean ℓ̄ / mean b over the same rows (red diamond; seed 000's
    R_val / c_base). They differ when short or easy examples (small b) have large ratios."""
    groups = list(_groups(per_example))
    ncol = min(4, len(groups))  # facets wrap onto rows of four panels
    nrow = -(-len(groups) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.2 * ncol, 3.2 * nrow), squeeze=False, sharey=True)
    for ax in axes.flat[len(groups):]:
        ax.set_visible(False)
    for ax, (label, color, _, rows) in zip(axes.flat, groups):
        betas = sorted(rows["beta"].unique())
        data = [rows.loc[rows["beta"] == b, "rho_i"].to_numpy() for b in betas]
        bp = ax.boxplot(data, positions=range(len(betas)), widths=0.5, showfliers=False, patch_artist=True)
        for box in bp["boxes"]:
            box.set_facecolor(color)
            box.set_alpha(0.35)
        summ = rho_summaries(rows, ["beta"]).set_index("beta").loc[betas]
        ax.plot(range(len(betas)), summ["mean_of_ratios"], "o", mfc="none", color="k", label="mean of ratios  mean ρ_i")
        ax.plot(range(len(betas)), summ["ratio_of_means"], "D", color="tab:red", ms=5,
                label=f"ratio of means  ρ_recon = mean {LBAR} / mean b")
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xticks(range(len(betas)), [f"{b:g}" for b in betas])
        ax.set_xlabel("β")
        ax.set_title(literal(label), fontsize=9)
    for ax in axes[:, 0]:
        ax.set_ylabel(f"ρ_i = {LBAR_I} / b_i (per example)")
    fig.tight_layout()
    _legend_below(fig, axes[0, 0], ncol=2)
    return fig


def rho_summaries(per_example: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Per group of ``by``: ratio_of_means = mean ℓ̄ / mean b (rho_recon, seed 000's R_val / c_base)
    and mean_of_ratios = mean_i rho_i, both over the same rows (dimensionless)."""
    g = per_example.groupby(by)
    return pd.DataFrame({"ratio_of_means": g["lbar"].mean() / g["b"].mean(),
                         "mean_of_ratios": g["rho_i"].mean()}).reset_index()
