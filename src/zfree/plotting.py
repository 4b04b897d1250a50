"""Figures for the report and the notebooks. Each function takes tidy pandas data and returns a
matplotlib Figure (headless-safe; tests check the data drawn, not the pixels)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg") if matplotlib.get_backend().lower() in ("", "agg") else None
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

WEIGHTING_COLORS = {"plain": "tab:blue", "distribution": "tab:orange", "example": "tab:green", "token": "tab:purple"}


def _color(w: str) -> str:
    return WEIGHTING_COLORS.get(w, "tab:gray")


def plot_rate_and_rho_vs_beta(summary: pd.DataFrame, curves: pd.DataFrame | None = None) -> plt.Figure:
    """Measured rate (KL, nats per example) and rho_recon (ratio of means) against beta, one column
    per weighting; theory's predicted rate dashed, and the beta range where theory predicts that
    most examples use z (beta_eff < 1) shaded.

    ``summary``: one row per run with weighting, beta, kl_prior_loss,
    baseline_normalized_reconstruction_loss, oracle_rho. ``curves``: weighting, beta,
    predicted_use_fraction, predicted_rate (``zfree.theory.predict_curve``).
    """
    ws = list(dict.fromkeys(summary["weighting"]))
    fig, axes = plt.subplots(2, len(ws), figsize=(4.2 * len(ws), 6.4), squeeze=False, sharex=True)
    for j, w in enumerate(ws):
        s = summary[summary["weighting"] == w].sort_values("beta")
        ax_k, ax_r = axes[0, j], axes[1, j]
        ax_k.plot(s["beta"], s["kl_prior_loss"], "o-", color=_color(w), label="measured KL")
        ax_r.plot(s["beta"], s["baseline_normalized_reconstruction_loss"], "o-", color=_color(w),
                  label="ρ_recon = R_val / c_base (ratio of means)")
        if "oracle_rho" in s:
            ax_r.plot(s["beta"], s["oracle_rho"], "s:", color=_color(w), alpha=0.6, label="oracle ρ (best z per example)")
        if curves is not None and len(curves[curves["weighting"] == w]):
            c = curves[curves["weighting"] == w].sort_values("beta")
            ax_k.plot(c["beta"], c["predicted_rate"], "--", color="k", lw=1, label="predicted rate")
            use = c["predicted_use_fraction"].to_numpy() > 0.5
            for ax in (ax_k, ax_r):
                _shade(ax, c["beta"].to_numpy(), use)
        ax_k.set_title(f"{w}")
        ax_k.set_ylabel("rate KL(q‖p) [nats / example]")
        ax_r.set_ylabel("ρ_recon")
        ax_r.axhline(1.0, color="gray", lw=0.8)
        ax_r.set_xlabel("β")
        for ax in (ax_k, ax_r):
            ax.set_xscale("log")
            ax.legend(fontsize=7)
    fig.suptitle("Rate and ρ_recon against β (shaded: theory predicts most examples use z, β_eff < 1)")
    fig.tight_layout()
    return fig


def _shade(ax, x: np.ndarray, mask: np.ndarray) -> None:
    """Shade the x-intervals where ``mask`` holds (log-spaced x: edges at geometric midpoints)."""
    if not mask.any():
        return
    edges = np.sqrt(x[1:] * x[:-1])
    lo_edges = np.concatenate([[x[0]], edges])
    hi_edges = np.concatenate([edges, [x[-1]]])
    for lo, hi, m in zip(lo_edges, hi_edges, mask):
        if m:
            ax.axvspan(lo, hi, color="gold", alpha=0.15, lw=0)


def plot_loss_fractions(summary: pd.DataFrame) -> plt.Figure:
    """loss_contrib/fraction_abs/<term> of the final evaluation, one stacked bar per run."""
    cols = [c for c in summary.columns if c.startswith("loss_contrib/fraction_abs/")]
    s = summary.sort_values(["weighting", "beta"])
    labels = [f"{w}\nβ={b:g}" for w, b in zip(s["weighting"], s["beta"])]
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(s)), 3.6))
    bottom = np.zeros(len(s))
    for c in cols:
        v = s[c].fillna(0).to_numpy()
        ax.bar(labels, v, bottom=bottom, label=c.split("/")[-1])
        bottom += v
    ax.set_ylabel("|contribution| / Σ|contributions|")
    ax.set_title("Share of the objective per term (final evaluation)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_training_curves(metrics: dict[str, pd.DataFrame]) -> plt.Figure:
    """Per run (label -> metrics.jsonl as a DataFrame): KL, rho_recon, reconstruction share of the
    objective and alignment NMI over steps (the "collapse moment" plot)."""
    keys = [("loss/val/kl_prior_loss", "rate KL [nats / example]"),
            ("loss/val/baseline_normalized_reconstruction_loss", "ρ_recon (ratio of means)"),
            ("loss_contrib/fraction_abs/reconstruction_loss", "reconstruction share |contrib|"),
            ("structure/alignment_nmi", "alignment NMI (argmax z vs strategy)")]
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.4))
    for label, df in metrics.items():
        for ax, (k, name) in zip(axes, keys):
            if k in df:
                ax.plot(df["step"], df[k], marker=".", label=label)
                ax.set_title(name, fontsize=9)
                ax.set_xlabel("step")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_predicted_vs_measured(summary: pd.DataFrame) -> plt.Figure:
    """Fraction of examples predicted to use z (beta_eff < 1) against the fraction measured to use
    it (per-example KL >= half of log(K/m)), one point per run."""
    fig, ax = plt.subplots(figsize=(4.6, 4.2))
    for w, s in summary.groupby("weighting", sort=False):
        ax.scatter(s["predicted_use_fraction"], s["measured_use_fraction"], color=_color(w), label=w)
        for _, r in s.iterrows():
            ax.annotate(f"β={r['beta']:g}", (r["predicted_use_fraction"], r["measured_use_fraction"]), fontsize=7)
    ax.plot([0, 1], [0, 1], color="gray", lw=0.8)
    ax.set_xlim(-0.05, 1.05)
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("predicted fraction of examples using z")
    ax.set_ylabel("measured fraction using z")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
