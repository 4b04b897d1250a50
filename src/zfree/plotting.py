"""Figures for the report and the notebooks. Each function takes tidy pandas data and returns a
matplotlib Figure (headless-safe; tests check the data drawn, not the pixels)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg") if matplotlib.get_backend().lower() in ("", "agg") else None
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from zfree.results import FACETS  # noqa: E402 - defined once in zfree.results (issue 12)
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
        ax_k, ax_r = axes[0, j], axes[1, j]
        for label, color, ls, s in _groups(summary[summary["weighting"] == w]):
            s = s.groupby("beta", as_index=False).mean(numeric_only=True).sort_values("beta")
            tag = label.removeprefix(w).strip()
            ax_k.plot(s["beta"], s["kl_prior_loss"], ls, marker="o", color=color, label=f"measured KL {tag}".strip())
            ax_r.plot(s["beta"], s["baseline_normalized_reconstruction_loss"], ls, marker="o", color=color,
                      label=f"ρ_recon = R_val / c_base (ratio of means) {tag}".strip())
            if "oracle_rho" in s:
                ax_r.plot(s["beta"], s["oracle_rho"], ls, marker="s", color=color, alpha=0.5,
                          label=f"oracle ρ (best z per example) {tag}".strip())
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
    facets = [f for f in FACETS if f in summary and (f == "weighting" or summary[f].nunique() > 1)]
    s = summary.sort_values([*facets, "beta"])
    labels = [" ".join(str(r[f]) for f in facets) + f"\nβ={r['beta']:g}" + (f" s{r['seed']}" if "seed" in s and
              s["seed"].nunique() > 1 else "") for _, r in s.iterrows()]
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


def plot_training_curves(metrics: dict[str, pd.DataFrame], collapse_kl: float = 0.05) -> plt.Figure:
    """Per run (label -> metrics.jsonl as a DataFrame): the share of the objective of every
    ``loss_contrib/fraction_abs/<term>`` (one line style per term), KL, rho_recon and alignment
    NMI over steps: the "collapse moment" plot. A dotted vertical line marks, per run, the first
    evaluation after step 0 whose KL is below ``collapse_kl`` nats (the collapse criterion of the
    main job's acceptance)."""
    keys = [("loss/val/kl_prior_loss", "rate KL [nats / example]"),
            ("loss/val/baseline_normalized_reconstruction_loss", "ρ_recon = R_val / c_base (ratio of means)"),
            ("structure/alignment_nmi", "alignment NMI (argmax z vs strategy)")]
    fig, axes = plt.subplots(1, 1 + len(keys), figsize=(4.2 * (1 + len(keys)), 3.6))
    styles = ["-", "--", ":", "-."]
    for i, (label, df) in enumerate(metrics.items()):
        color = f"C{i % 10}"
        terms = [c for c in df.columns if c.startswith("loss_contrib/fraction_abs/")]
        for j, t in enumerate(terms):
            axes[0].plot(df["step"], df[t], styles[j % 4], color=color, marker=".",
                         label=f"{label}: {t.rsplit('/', 1)[-1]}")
        for ax, (k, name) in zip(axes[1:], keys):
            if k in df:
                ax.plot(df["step"], df[k], marker=".", color=color, label=label)
        if "loss/val/kl_prior_loss" in df:
            late = df[(df["step"] > 0) & (df["loss/val/kl_prior_loss"] < collapse_kl)]
            if len(late):
                axes[1].axvline(late["step"].iloc[0], color=color, ls=":", lw=1)
    axes[0].set_title("share of the objective |contrib| / Σ|contrib|", fontsize=9)
    for ax, (k, name) in zip(axes[1:], keys):
        ax.set_title(name, fontsize=9)
    axes[1].axhline(collapse_kl, color="gray", lw=0.6, ls="--")
    for ax in axes:
        ax.set_xlabel("step")
    axes[0].legend(fontsize=6)
    axes[1].legend(fontsize=7)
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


# --- the figures of the notebook suite -------------------------------------------------------

LINESTYLES = ["-", "--", ":", "-."]


def _groups(df: pd.DataFrame):
    """(label, color, linestyle, rows) per combination of the facets present in ``df``; the
    color names the weighting, the line style the other facets (latent kind, aid)."""
    facets = [f for f in FACETS if f in df and (f == "weighting" or df[f].nunique() > 1)]
    others = list(dict.fromkeys(tuple(r) for r in df[facets[1:]].itertuples(index=False))) if facets[1:] else [()]
    for key, rows in df.groupby(facets, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        yield " ".join(map(str, key)), _color(key[0]), LINESTYLES[others.index(tuple(key[1:])) % 4], rows


PHASE_METRICS = (("kl_prior_loss", "rate KL [nats / example]", "viridis"),
                 ("baseline_normalized_reconstruction_loss", "ρ_recon = R_val / c_base (ratio of means)", "magma_r"),
                 ("alignment_nmi", "alignment NMI", "viridis"),
                 ("task_correctness", "task correctness", "viridis"))


def plot_phase_diagram(runs: pd.DataFrame, c_base: float | None = None, beta_over_w: float | None = None,
                       critical_betas: dict[str, float] | None = None, metrics=PHASE_METRICS,
                       highlight: tuple[float, float] | None = None) -> plt.Figure:
    """The beta × w phase diagram: one panel per metric, one square per run at (beta,
    w = ``recon_weight``, the mean reconstruction weight), colored by the metric (mean over
    seeds and facets that share a cell).

    Overlays: the row w = 1/c_base (``distribution``) marked on the w axis; the predicted
    boundary beta = ``beta_over_w`` · w of theory (beta_eff = beta·|S|/w < 1 for half of the
    examples; solid black) — itself a line of constant beta/w; thin dotted lines of constant
    beta/w through the grid (along them a scale-invariant optimizer such as Adam trains
    identically, DESIGN §1); and ``critical_betas`` (weighting -> predicted beta*) as a black ×
    on each weighting's row (the ``example`` row is not a scalar weight, so its beta* is off
    the line). ``highlight``: a (beta, w) cell outlined in red (the widgets' selection).
    """
    metrics = [m for m in metrics if m[0] in runs and runs[m[0]].notna().any()]
    n = max(1, len(metrics))
    ncol = min(2, n)
    fig, axes = plt.subplots((n + 1) // 2 if n > 1 else 1, ncol, figsize=(5.4 * ncol, 4.2 * ((n + 1) // 2)),
                             squeeze=False)
    cells = runs.groupby(["beta", "recon_weight"], as_index=False)[[m[0] for m in metrics]].mean()
    shown = [*runs["beta"], *(critical_betas or {}).values()]
    b_lo, b_hi = min(shown) / 2, max(shown) * 2
    w_lo, w_hi = runs["recon_weight"].min() / 2, runs["recon_weight"].max() * 2
    for ax, (key, name, cmap) in zip(axes.flat, metrics):
        sc = ax.scatter(cells["beta"], cells["recon_weight"], c=cells[key], cmap=cmap, marker="s", s=260,
                        edgecolors="k", linewidths=0.4, zorder=3)
        fig.colorbar(sc, ax=ax, label=name)
        ws = np.geomspace(w_lo, w_hi, 50)
        for ratio in np.geomspace(b_lo / w_hi, b_hi / w_lo, 9):  # lines of constant beta / w
            ax.plot(ratio * ws, ws, ":", color="gray", lw=0.6, zorder=1)
        if beta_over_w:
            ax.plot(beta_over_w * ws, ws, "-", color="k", lw=1.4, zorder=2, label="predicted boundary β·|S|/w = 1")
        for w, b in (critical_betas or {}).items():
            rows = runs[runs["weighting"] == w]
            if len(rows):
                ax.scatter([b], [rows["recon_weight"].mean()], marker="x", color="k", s=60, zorder=4)
        if c_base:
            ax.axhline(1 / c_base, color="tab:orange", lw=0.8, ls="--", zorder=1)
            ax.annotate("1/c_base", (b_lo, 1 / c_base), fontsize=7, color="tab:orange", va="bottom")
        if highlight is not None:
            ax.scatter([highlight[0]], [highlight[1]], marker="s", s=420, facecolors="none", edgecolors="red",
                       linewidths=1.5, zorder=5)
        for w, rows in runs.groupby("weighting", sort=False):
            ax.annotate(w, (b_hi, rows["recon_weight"].mean()), fontsize=7, color=_color(w), ha="right", va="bottom")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(b_lo, b_hi)
        ax.set_ylim(w_lo, w_hi)
        ax.set_xlabel("β")
        ax.set_ylabel("reconstruction weight w")
        ax.set_title(name, fontsize=9)
    for ax in list(axes.flat)[len(metrics):]:
        ax.set_visible(False)
    if beta_over_w:
        axes.flat[0].legend(fontsize=7, loc="lower right")
    fig.suptitle("Phase diagram β × w (dotted: constant β/w, identical training under Adam)")
    fig.tight_layout()
    return fig


def plot_rate_distortion(runs: pd.DataFrame, z_free: float | None = None, bayes_rate: float | None = None,
                         n_iso: int = 6) -> plt.Figure:
    """The rate-distortion plane (Alemi et al. 2018): rate R = mean KL(q‖p) and distortion
    D = mean |S|·ℓ̄, both nats per sequence; one curve per weighting (and facet) across beta.

    ``z_free``: the measured z-free point (R = 0, D = mean |S|·b of the base model, i.e.
    |S|·c_base per sequence). ``bayes_rate``: mean log(K/m) (DESIGN §2), which places the
    analytic optimum (R = log(K/m), D = 0: z names the strategy, y is then determined) and the
    Bayes-optimal z-free point (0, log(K/m)) on one iso-ELBO line D + R = const (dashed): at
    beta = 1 nothing prefers using z. Dotted: more iso-ELBO lines (slope -1).
    """
    fig, ax = plt.subplots(figsize=(6.2, 4.8))
    for label, color, ls, rows in _groups(runs):
        rows = rows.groupby("beta", as_index=False)[["rate", "distortion"]].mean().sort_values("beta")
        ax.plot(rows["rate"], rows["distortion"], ls, marker="o", color=color, label=label)
        for _, r in rows.iterrows():
            ax.annotate(f"β={r['beta']:g}", (r["rate"], r["distortion"]), fontsize=6, xytext=(3, 3),
                        textcoords="offset points")
    pts_r = [*runs["rate"], 0.0] + ([bayes_rate] if bayes_rate else [])
    pts_d = [*runs["distortion"]] + ([z_free] if z_free is not None else []) + ([0.0, bayes_rate] if bayes_rate else [])
    r_hi = max(pts_r) * 1.15 + 1e-3
    d_lo, d_hi = min(pts_d), max(pts_d)
    pad = 0.1 * (d_hi - d_lo) + 1e-3
    for c in np.linspace(d_lo, d_hi + r_hi, n_iso):
        ax.plot([0, r_hi], [c, c - r_hi], color="gray", lw=0.6, ls=":", zorder=0)
    if z_free is not None:
        ax.scatter([0.0], [z_free], marker="*", s=160, color="k", zorder=4, label="z-free (R = 0, D = mean |S|·b)")
    if bayes_rate:
        ax.plot([0, bayes_rate], [bayes_rate, 0], color="k", lw=0.8, ls="--", zorder=0,
                label="iso-ELBO through the Bayes-optimal points")
        ax.scatter([0.0], [bayes_rate], marker="*", s=160, facecolors="none", edgecolors="k", zorder=4,
                   label="Bayes-optimal z-free (0, log K/m)")
        ax.scatter([bayes_rate], [0.0], marker="P", s=120, color="tab:red", zorder=4,
                   label="analytic optimum (log K/m, 0): z names the strategy")
    ax.set_xlim(-0.02 * r_hi, r_hi)
    ax.set_ylim(d_lo - pad, d_hi + pad)
    ax.set_xlabel("rate R = KL(q‖p) [nats / sequence]")
    ax.set_ylabel("distortion D = |S|·ℓ̄ [nats / sequence]")
    ax.set_title("Rate-distortion plane (dotted: iso-ELBO D + R = const)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_effective_beta(per_example: pd.DataFrame) -> plt.Figure:
    """Per-example beta_eff = beta·|S|/w (DESIGN §1; seeds 000, 002) per weighting: against b
    (nats per token), against |S|, and per-example KL (nats per sequence) against beta_eff —
    which examples use z. The line beta_eff = 1 is drawn in every panel (theory: z is worth
    using iff beta_eff < 1). ``per_example``: rows of the runs' per_example tables tagged with
    weighting (and facets), one beta per weighting."""
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    for label, color, _, rows in _groups(per_example):
        axes[0].scatter(rows["b"], rows["beta_eff"], s=8, alpha=0.6, color=color, label=label)
        axes[1].scatter(rows["n_tokens"], rows["beta_eff"], s=8, alpha=0.6, color=color, label=label)
        axes[2].scatter(rows["beta_eff"], rows["kl"], s=8, alpha=0.6, color=color, label=label)
    for ax in axes[:2]:
        ax.axhline(1.0, color="k", lw=1, ls="--", label="β_eff = 1")
        ax.set_yscale("log")
        ax.set_ylabel("β_eff = β·|S| / w")
    axes[2].axvline(1.0, color="k", lw=1, ls="--", label="β_eff = 1")
    axes[2].set_xscale("log")
    axes[0].set_xlabel("b (z-free NLL, nats / token)")
    axes[1].set_xlabel("|S| (supervised tokens)")
    axes[2].set_xlabel("β_eff")
    axes[2].set_ylabel("per-example KL [nats / sequence]")
    axes[2].set_title("which examples use z", fontsize=9)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_rho_distributions(per_example: pd.DataFrame) -> plt.Figure:
    """Per-example rho_i = ℓ̄_i / b_i distributions (box per beta), one panel per weighting (and
    facet), with both summaries named: the mean of ratios mean_i rho_i (open circle) and the
    ratio of means rho_recon = mean ℓ̄ / mean b over the same rows (red diamond; seed 000's
    R_val / c_base). They differ when short or easy examples (small b) have large ratios."""
    groups = list(_groups(per_example))
    fig, axes = plt.subplots(1, len(groups), figsize=(4.4 * len(groups), 4.0), squeeze=False, sharey=True)
    for ax, (label, color, _, rows) in zip(axes[0], groups):
        betas = sorted(rows["beta"].unique())
        data = [rows.loc[rows["beta"] == b, "rho_i"].to_numpy() for b in betas]
        bp = ax.boxplot(data, positions=range(len(betas)), widths=0.5, showfliers=False, patch_artist=True)
        for box in bp["boxes"]:
            box.set_facecolor(color)
            box.set_alpha(0.35)
        mean_of_ratios = [float(np.mean(d)) for d in data]
        ratio_of_means = [float(rows.loc[rows["beta"] == b, "lbar"].mean() / rows.loc[rows["beta"] == b, "b"].mean())
                          for b in betas]
        ax.plot(range(len(betas)), mean_of_ratios, "o", mfc="none", color="k", label="mean of ratios  mean ρ_i")
        ax.plot(range(len(betas)), ratio_of_means, "D", color="tab:red", ms=5,
                label="ratio of means  ρ_recon = mean ℓ̄ / mean b")
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xticks(range(len(betas)), [f"{b:g}" for b in betas])
        ax.set_xlabel("β")
        ax.set_title(label, fontsize=9)
    axes[0, 0].set_ylabel("ρ_i = ℓ̄_i / b_i (per example)")
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_phase_boundary(runs: pd.DataFrame, curves: pd.DataFrame | None, boundary: pd.DataFrame) -> plt.Figure:
    """Measured rate against beta per weighting (one panel each, aided and unaided runs as separate
    lines) with the predicted rate (dashed) and both half-plateau betas marked: measured (solid
    vertical) and predicted (dashed vertical), the ±25% band around the prediction shaded.

    ``runs``: weighting, beta, kl_prior_loss (+ aid). ``curves``: ``SweepResults.theory_curves``.
    ``boundary``: ``SweepResults.phase_boundary`` (weighting, aid, beta_half_measured,
    beta_half_predicted, ratio)."""
    ws = list(dict.fromkeys(boundary["weighting"])) or list(dict.fromkeys(runs["weighting"]))
    fig, axes = plt.subplots(1, max(len(ws), 1), figsize=(4.4 * max(len(ws), 1), 3.6), squeeze=False)
    for ax, w in zip(axes[0], ws):
        for label, color, ls, s in _groups(runs[runs["weighting"] == w]):
            s = s.groupby("beta", as_index=False)["kl_prior_loss"].mean().sort_values("beta")
            ax.plot(s["beta"], s["kl_prior_loss"], ls, marker="o", color=color, label=f"measured {label}")
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
                ax.axvline(r["beta_half_measured"], color=_color(w), lw=1.2,
                           label=f"measured β½ {r['beta_half_measured']:.3g} ({r['aid']}; "
                                 f"{r['ratio']:.2f}× predicted)" if np.isfinite(r["ratio"]) else "measured β½")
        ax.set_xscale("log")
        ax.set_xlabel("β")
        ax.set_ylabel("rate KL(q‖p) [nats / example]")
        ax.set_title(w)
        ax.legend(fontsize=6, loc="upper right")
    fig.suptitle("Phase boundary: where the rate falls to half its plateau (band: predicted ±25%)")
    fig.tight_layout()
    return fig


def plot_use_by_length(use: pd.DataFrame) -> plt.Figure:
    """The staircase of a ragged-length weighting: per |S|, the measured fraction of rows using z
    (solid) against the predicted fraction (dashed), one color per beta. ``use``:
    ``SweepResults.use_by_length`` (n_tokens, measured_use, predicted_use, beta, aid)."""
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    betas = sorted(use["beta"].unique())
    cmap = plt.get_cmap("viridis", max(len(betas), 2))
    for i, beta in enumerate(betas):
        for aid, g in use[use["beta"] == beta].groupby("aid", sort=False):
            g = g.sort_values("n_tokens")
            ax.plot(g["n_tokens"], g["measured_use"], "-", marker="o", color=cmap(i), label=f"β={beta:g} {aid} measured")
            ax.plot(g["n_tokens"], g["predicted_use"], "--", color=cmap(i), alpha=0.7, label=f"β={beta:g} predicted")
    ax.set_xlabel("|S| (y tokens + end token)")
    ax.set_ylabel("fraction of rows using z")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title("Use per length (theory: short examples switch on first, β* = 1/(|S| c_base))")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    return fig
