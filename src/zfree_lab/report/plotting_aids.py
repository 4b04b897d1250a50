"""The figures of the switch-on (aids) section: the phase boundary, the staircase of use per
length and the hand-over gate. Each takes tidy pandas data and returns a matplotlib Figure."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from zfree_lab.report.figstyle import color_of, facet_name, finish_with_legend_right, groups, literal, log_axis, paper


@paper
def plot_phase_boundary(runs: pd.DataFrame, curves: pd.DataFrame | None, boundary: pd.DataFrame) -> plt.Figure:
    """Measured rate against beta per weighting (one panel each, aided and unaided runs as separate
    lines) with the predicted rate (dashed) and both half-plateau betas marked: measured (solid
    vertical) and predicted (dashed vertical), the ±25% band around the prediction shaded.

    ``runs``: weighting, beta, kl_prior_loss (+ aid). ``curves``: ``SweepResults.theory_curves``.
    ``boundary``: ``SweepResults.phase_boundary`` (weighting, aid, beta_half_measured,
    beta_half_predicted, ratio)."""
    ws = list(dict.fromkeys(boundary["weighting"])) or list(dict.fromkeys(runs["weighting"]))
    fig, axes = plt.subplots(1, max(len(ws), 1), figsize=(3.3 * max(len(ws), 1), 3.4), squeeze=False)
    for ax, w in zip(axes[0], ws):
        for label, color, ls, s in groups(runs[runs["weighting"] == w]):
            s = s.groupby("beta", as_index=False)["kl_prior_loss"].mean().sort_values("beta")
            ax.plot(s["beta"], s["kl_prior_loss"], ls, marker="o", color=color, label=f"measured {literal(label)}")
        if curves is not None and (curves["weighting"] == w).any():
            c = curves[curves["weighting"] == w].sort_values("beta")
            lo, hi = runs.loc[runs["weighting"] == w, "beta"].agg(["min", "max"])
            c = c[(c["beta"] >= lo / 3) & (c["beta"] <= hi * 3)]
            ax.plot(c["beta"], c["predicted_rate"], "--", color="k", lw=1, label="predicted rate")
        for _, r in boundary[boundary["weighting"] == w].iterrows():
            if np.isfinite(r["beta_half_predicted"]):
                bp = r["beta_half_predicted"]
                ax.axvline(bp, color="k", ls="--", lw=0.8)
                ax.axvspan(bp * 0.75, bp * 1.25, color="gray", alpha=0.12, lw=0)
            if np.isfinite(r["beta_half_measured"]):
                ax.axvline(r["beta_half_measured"], color=color_of(w), lw=1.2,
                           label=f"measured β½ {r['beta_half_measured']:.3g} ({literal(facet_name('aid', r['aid']))}; "
                                 f"{r['ratio']:.2f}× predicted)" if np.isfinite(r["ratio"]) else "measured β½")
        log_axis(ax, "x", runs.loc[runs["weighting"] == w, "beta"])
        ax.set_xlabel("β")
        ax.set_ylabel("rate KL(q‖p) [nats / example]")
        ax.set_title(literal(w))
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
    fig.suptitle("Phase boundary: where the rate falls to half its plateau (band: predicted ±25%)")
    fig.tight_layout()
    return fig


@paper
def plot_use_by_length(use: pd.DataFrame) -> plt.Figure:
    """The staircase of a ragged-length weighting: per |S|, the measured fraction of rows using z
    (solid) against the predicted fraction (dashed), one color per beta. ``use``:
    ``SweepResults.use_by_length`` (n_tokens, measured_use, predicted_use, beta, aid)."""
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    betas = sorted(use["beta"].unique())
    cmap = plt.get_cmap("viridis", max(len(betas), 2))
    for i, beta in enumerate(betas):
        for j, (aid, g) in enumerate(use[use["beta"] == beta].groupby("aid", sort=False)):
            g = g.sort_values("n_tokens")
            ax.plot(g["n_tokens"], g["measured_use"], "-", marker="osD^v"[j % 5], color=cmap(i),
                    label=f"β={beta:g} {'no aid' if aid == 'none' else literal(aid)}, measured")
            if j == 0:  # the prediction depends on beta and |S| only: one line per beta, not per aid
                ax.plot(g["n_tokens"], g["predicted_use"], "--", color=cmap(i), alpha=0.7, label=f"β={beta:g} predicted")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(-0.05, 1.05)
    return finish_with_legend_right(fig, ax, "|S| (y tokens + end token)", "fraction of rows using z",
                                    "Use per length (theory: short examples switch on first, β* = 1/(|S| c_base))",
                                    title_size=10)


@paper
def plot_handover_gate(traces: pd.DataFrame) -> plt.Figure:
    """The hard phase's hand-over gate per aided run: best-z objective / collapsed objective
    (mean w·min_k nll + β·log K against mean w·b) over the steps; below 1 the soft objective
    prefers z. ``traces``: ``zfree_lab.report.report.gate_traces`` (label, step, ratio)."""
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for label, g in traces.groupby("label", sort=False):
        ax.plot(g["step"], g["ratio"], marker=".", label=literal(label))
    ax.axhline(1.0, color="gray", lw=0.8)
    r = traces["ratio"].to_numpy(float)
    r = r[np.isfinite(r) & (r > 0)]
    if len(r) and r.max() / r.min() > 4:  # a run far from passing (plain at beta = 1) would flatten the others
        log_axis(ax, "y")
    return finish_with_legend_right(fig, ax, "step (hard phase)", "best-z objective / collapsed objective",
                                    "hand-over gate: below 1 the soft objective prefers z", title_size=10)


@paper
def plot_train_distortion(curves: dict[str, pd.DataFrame], key: str = "loss/train/reconstruction_loss") -> plt.Figure:
    """The distortion on the training batches over steps, per run (label -> its curve.jsonl rows as a
    DataFrame: ``step`` and ``key``, nats per token, window means of ``zfree_lab.run.curve.CURVE_EVERY``
    steps): where a run's D flattens. Runs whose label starts with "control" are drawn dashed (the
    z-free controls), label oracles and their null oracles ("null…") dotted; steps ticked as whole numbers; a
    curve of fewer than 3 windows is drawn with markers (a line of one point draws nothing), and where no
    run has 2 windows the axes say so. Returns the Figure (an empty axes with a note without curves)."""
    fig, ax = plt.subplots(figsize=(7.0, 3.6))
    longest = 0
    for label, df in curves.items():
        if key not in df or df.empty:
            continue
        ls = "--" if label.startswith("control") else ":" if label.startswith(("oracle", "null")) else "-"
        ax.plot(df["step"], df[key], ls=ls, lw=1.2, label=literal(label), marker="o" if len(df) < 3 else None, ms=4)
        longest = max(longest, len(df))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps: 10, 11, 12, not 10.25
    ax.set_xlabel("step")
    ax.set_ylabel("D on training batches (nats/token)")
    ax.set_title("Training distortion (window means): has D flattened?")
    if ax.lines:
        ax.legend(fontsize=7, loc="upper right", frameon=False)
    else:
        ax.text(0.5, 0.5, "no run wrote curve.jsonl", ha="center", va="center", transform=ax.transAxes)
    if longest == 1:  # too few steps for a curve: say so rather than leave the reader looking for lines
        ax.text(0.5, 0.5, "each run wrote one window mean (fewer steps than two windows): no curve to read yet",
                ha="center", va="center", fontsize=8, color="0.35", transform=ax.transAxes)
    fig.tight_layout()
    return fig
