"""The study report's figures against beta: rate and rho_recon per weighting, the loss fractions,
and the measured against the predicted latent use. Each function takes tidy pandas data (the study's
summary table) and returns a matplotlib Figure (headless-safe; tests check the data drawn)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg") if matplotlib.get_backend().lower() in ("", "agg") else None
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from zfree.report.figstyle import FACET_MARKERS, FACETS  # noqa: E402
from zfree.report.figstyle import color_of as _color  # noqa: E402
from zfree.report.figstyle import groups as _groups  # noqa: E402
from zfree.report.figstyle import log_axis as _log_axis  # noqa: E402
from zfree.report.figstyle import paper as _paper  # noqa: E402
from zfree.report.figstyle import rho_limits as _rho_limits  # noqa: E402
from zfree.report.figstyle import shade  # noqa: E402


@_paper
def plot_rate_and_rho_vs_beta(summary: pd.DataFrame, curves: pd.DataFrame | None = None) -> plt.Figure:
    """Measured rate (KL, nats per example) and rho_recon (ratio of means) against beta, one column
    per weighting; theory's predicted rate dashed, and the beta range where theory predicts that
    most examples use z (beta_eff < 1) shaded.

    ``summary``: one row per run with weighting, beta, kl_prior_loss,
    baseline_normalized_reconstruction_loss, oracle_rho. ``curves``: weighting, beta,
    predicted_use_fraction, predicted_rate (``zfree.objective.theory.predict_curve``).
    """
    ws = list(dict.fromkeys(summary["weighting"]))
    fig, axes = plt.subplots(2, len(ws), figsize=(3.3 * len(ws), 5.6), squeeze=False, sharex=True)
    for j, w in enumerate(ws):
        ax_k, ax_r = axes[0, j], axes[1, j]
        for label, color, ls, s in _groups(summary[summary["weighting"] == w]):
            s = s.groupby("beta", as_index=False).mean(numeric_only=True).sort_values("beta")
            tag = label.removeprefix(w).strip()
            mk = FACET_MARKERS[ls]  # a run of one beta draws no line: the marker names the facet too
            ax_k.plot(s["beta"], s["kl_prior_loss"], ls, marker=mk, color=color, label=f"measured KL {tag}".strip())
            ax_r.plot(s["beta"], s["baseline_normalized_reconstruction_loss"], ls, marker=mk, color=color,
                      label=f"ρ_recon = R_val / c_base (ratio of means) {tag}".strip())
            if "oracle_rho" in s:
                ax_r.plot(s["beta"], s["oracle_rho"], ls, marker="s", color=color, alpha=0.5,
                          label=f"oracle ρ (best z per example) {tag}".strip())
        if curves is not None and len(curves[curves["weighting"] == w]):
            c = curves[curves["weighting"] == w].sort_values("beta")
            ax_k.plot(c["beta"], c["predicted_rate"], "-", color="k", lw=2.5, alpha=0.3, label="predicted rate")
            use = c["predicted_use_fraction"].to_numpy() > 0.5
            for ax in (ax_k, ax_r):
                shade(ax, c["beta"].to_numpy(), use)
        ax_k.set_title(f"{w}")
        ax_k.set_ylabel("rate KL(q‖p) [nats / example]")
        ax_r.set_ylabel("ρ_recon")
        ax_r.axhline(1.0, color="gray", lw=0.8)
        _rho_limits(ax_r)
        ax_r.set_xlabel("β")
        for ax in (ax_k, ax_r):
            _log_axis(ax, "x", summary["beta"])  # x is shared: one tick set for every column
    # one rate scale from 0 for every weighting (nats / example are comparable), so a collapsed
    # run's 1e-4 nats does not fill its panel as if z were used
    rates = [*summary["kl_prior_loss"].dropna()]
    if curves is not None:
        rates += [*curves["predicted_rate"].dropna()]
    top = 1.08 * max([1e-2, *rates])
    for ax in axes[0]:
        ax.set_ylim(-0.03 * top, top)
    fig.suptitle("Rate and ρ_recon against β (shaded: theory predicts most examples use z, β_eff < 1)")
    fig.tight_layout()
    # the legend names what the panel titles and colors do not: the quantity (marker) and the
    # facet (line style), in black; color = weighting is in each panel's title
    handles = [Line2D([], [], color="k", marker="o", ls="none", label="measured KL (top) / ρ_recon = R_val / c_base"),
               Line2D([], [], color="k", marker="s", ls="none", alpha=0.5, label="oracle ρ (best z per example)")]
    if curves is not None:
        handles.append(Line2D([], [], color="k", lw=2.5, alpha=0.3, label="predicted rate"))
    tags = {}
    for label, _, ls, _ in _groups(summary):
        tags.setdefault(" ".join(label.split(" ")[1:]), ls)
    handles += [Line2D([], [], color="k", ls=ls, marker=FACET_MARKERS[ls], label=tag) for tag, ls in tags.items() if tag]
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(len(handles), 4),
               fontsize=8, frameon=False)
    return fig


@_paper
def plot_loss_fractions(summary: pd.DataFrame) -> plt.Figure:
    """loss_contrib/fraction_abs/<term> of the final evaluation, one stacked bar per run."""
    cols = [c for c in summary.columns if c.startswith("loss_contrib/fraction_abs/")]
    facets = [f for f in FACETS if f in summary and (f == "weighting" or summary[f].nunique() > 1)]
    s = summary.sort_values([*facets, "beta"])
    labels = [" ".join(str(r[f]) for f in facets) + f" β={r['beta']:g}" + (f" s{r['seed']}" if "seed" in s and
              s["seed"].nunique() > 1 else "") for _, r in s.iterrows()]
    # one horizontal bar per run: the run labels read along the y axis however many runs there are
    fig, ax = plt.subplots(figsize=(7.5, 1.2 + 0.32 * len(s)))
    left = np.zeros(len(s))
    for c in cols:
        v = s[c].fillna(0).to_numpy()
        ax.barh(labels, v, left=left, label=c.split("/")[-1])
        left += v
    ax.set_ylim(len(s) - 0.5, -0.5)  # first run on top, no empty margin
    ax.set_xlabel("|contribution| / Σ|contributions|")
    ax.set_title("Share of the objective per term (final evaluation)", fontsize=10)
    if cols:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig


@_paper
def plot_predicted_vs_measured(summary: pd.DataFrame) -> plt.Figure:
    """Fraction of examples predicted to use z (beta_eff < 1) against the fraction measured to use
    it (per-example KL >= half of log(K/m)), one point per run: color = weighting, marker = the
    other facets (latent kind, aid), size = beta (legend). No text at the points: with dozens of
    runs on a few positions (0 and 1) the labels would print over each other."""
    fig, ax = plt.subplots(figsize=(5.0, 4.4))
    betas = sorted(summary["beta"].unique())
    size = {b: 18 + 70 * i / max(len(betas) - 1, 1) for i, b in enumerate(betas)}
    markers = ["o", "s", "^", "D", "v", "P"]
    facets = [f for f in FACETS[1:] if f in summary and summary[f].nunique() > 1]
    keys = list(dict.fromkeys(tuple(r) for r in summary[facets].itertuples(index=False))) if facets else [()]
    for _, r in summary.iterrows():
        k = tuple(r[f] for f in facets)
        ax.scatter(r["predicted_use_fraction"], r["measured_use_fraction"], s=size[r["beta"]], color=_color(r["weighting"]),
                   marker=markers[keys.index(k) % len(markers)], alpha=0.75, edgecolors="k", linewidths=0.3)
    ax.plot([0, 1], [0, 1], color="gray", lw=0.8)
    ax.set_xlim(-0.05, 1.05)
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("predicted fraction of examples using z")
    ax.set_ylabel("measured fraction using z")
    handles = [Line2D([], [], ls="none", marker="o", color=_color(w), label=w) for w in dict.fromkeys(summary["weighting"])]
    handles += [Line2D([], [], ls="none", marker=markers[i % len(markers)], color="gray", label=" ".join(map(str, k)))
                for i, k in enumerate(keys) if k]
    handles += [Line2D([], [], ls="none", marker="o", color="gray", markersize=np.sqrt(size[b]), label=f"β={b:g}")
                for b in betas]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig
