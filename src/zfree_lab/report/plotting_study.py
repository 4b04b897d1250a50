"""The study report's figures against beta: rate and rho_recon per weighting, the loss fractions,
the measured against the predicted latent use, z's gain against its rate, the remedies
leaderboard, and a many-valued label's confusion with the latent values. Each function takes tidy
pandas data (the study's summary table) and returns a matplotlib Figure (headless-safe; tests check
the data drawn)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from zfree_lab.report.figstyle import FACET_MARKERS, FACETS, WEIGHTING_FILLS, literal, remedy_style
from zfree_lab.report.figstyle import groups as _groups
from zfree_lab.report.figstyle import log_axis as _log_axis
from zfree_lab.report.figstyle import paper as _paper
from zfree_lab.report.figstyle import rho_limits as _rho_limits
from zfree_lab.report.figstyle import shade
from zfree_lab.report.report import run_label


#: what the rate figure's shading is: theory's rule with the base model's excess over the Bayes loss
#: (docs/concepts/theory.md); a base short of Bayes-optimal lets z pay above β_eff = 1
SHADED = "shaded: theory predicts most examples use z, β_eff < 1 + |S|·excess / Bayes NLL"


@_paper
def plot_rate_and_rho_vs_beta(summary: pd.DataFrame, curves: pd.DataFrame | None = None) -> plt.Figure:
    """Measured rate (KL, nats per example) and rho_recon (ratio of means) against beta, one column
    per weighting; theory's predicted rate dashed, and the beta range where theory predicts that
    most examples use z (beta_eff < 1 + |S|·excess / bayes_nll) shaded, where ``curves`` are given
    (the title says "shaded" only then).

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
            tag = literal(label.removeprefix(w).strip(" ,"))
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
        ax_k.set_title(literal(w))
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
    fig.suptitle("Rate and ρ_recon against β" + (f" ({SHADED})" if curves is not None else ""))
    fig.tight_layout()
    _rate_rho_legend(fig, summary, with_curves=curves is not None)
    return fig


def _rate_rho_legend(fig: plt.Figure, summary: pd.DataFrame, with_curves: bool) -> None:
    """The legend below ``plot_rate_and_rho_vs_beta``'s panels. It names what the panel titles and
    colors do not: the quantity (marker) and the facet (line style), in black; color = weighting
    is in each panel's title."""
    handles = [Line2D([], [], color="k", marker="o", ls="none", label="measured KL (top) / ρ_recon = R_val / c_base"),
               Line2D([], [], color="k", marker="s", ls="none", alpha=0.5, label="oracle ρ (best z per example)")]
    if with_curves:
        handles.append(Line2D([], [], color="k", lw=2.5, alpha=0.3, label="predicted rate"))
    tags = {}
    for label, _, ls, _ in _groups(summary):
        tags.setdefault(label.partition(", ")[2], ls)
    handles += [Line2D([], [], color="k", ls=ls, marker=FACET_MARKERS[ls], label=literal(tag))
                for tag, ls in tags.items() if tag]
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(len(handles), 4),
               fontsize=8, frameon=False)


#: the marker of each objective term in the share figure
TERM_MARKERS = ("o", "s", "^", "D", "v", "P")


@_paper
def plot_loss_fractions(summary: pd.DataFrame) -> plt.Figure:
    """loss_contrib/fraction_abs/<term> of the final evaluation: per run (one row), one marker per
    term at its share on a log axis, the share written beside it. A log axis, because on real text
    the reconstruction takes 99.9 % and the rate 0.05 %: stacked bars on [0, 1] read "100 %
    reconstruction" for every run and hide the terms that differ."""
    cols = [c for c in summary.columns if c.startswith("loss_contrib/fraction_abs/")]
    facets = [f for f in FACETS if f in summary and (f == "weighting" or summary[f].nunique() > 1)]
    s = summary.sort_values([*facets, "beta"])
    labels = [literal(run_label(r, s)) for _, r in s.iterrows()]  # the run's name in every table of the report
    fig, ax = plt.subplots(figsize=(7.5, 1.2 + 0.32 * len(s)))
    y = np.arange(len(s))
    vals = s[cols].to_numpy(float) if cols else np.zeros((len(s), 0))
    pos = vals[np.isfinite(vals) & (vals > 0)]
    lo = max(float(pos.min()) / 3, 1e-8) if pos.size else 1e-4
    for j, c in enumerate(cols):
        v = vals[:, j]
        ok = np.isfinite(v) & (v > 0)
        ax.scatter(v[ok], y[ok], marker=TERM_MARKERS[j % len(TERM_MARKERS)], color=f"C{j}", zorder=3,
                   label=literal(c.split("/")[-1]))
        for vi, yi in zip(v[ok], y[ok]):
            ax.annotate(f"{100 * vi:.3g}%", (vi, yi), fontsize=6, xytext=(0, 5), textcoords="offset points",
                        ha="center")
    ax.set_xscale("log")
    ax.set_xlim(lo, 1.6)
    ax.set_yticks(y, labels)
    ax.set_ylim(len(s) - 0.5, -0.7)  # first run on top
    ax.grid(axis="y", color="0.9", lw=0.6)
    ax.set_xlabel("|contribution| / Σ|contributions| (log)")
    ax.set_title("Share of the objective per term (final evaluation)", fontsize=10)
    if cols:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig


def _same_spot(points: list[tuple[float, float]], tol: float = 0.03) -> dict[tuple[float, float], int]:
    """Points within ``tol`` of each other (both axes on [0, 1]) -> (first point's position, count)."""
    out: dict[tuple[float, float], int] = {}
    for x, y in points:
        home = next((k for k in out if abs(k[0] - x) < tol and abs(k[1] - y) < tol), (x, y))
        out[home] = out.get(home, 0) + 1
    return out


@_paper
def plot_predicted_vs_measured(summary: pd.DataFrame, measured: str = "measured_use_fraction",
                               ylabel: str = "measured fraction using z") -> plt.Figure:
    """Fraction of examples predicted to use z (theory at eta = 1, counting the base's excess where known) against the fraction measured to use
    it (``measured``), one point per run: color = weighting, marker = the other facets (latent kind,
    aid), the same code as every figure (``figstyle.groups``), size = beta (legend). Runs on one
    spot are counted there ("×8"): on real text every run sits at (1, 0)."""
    fig, ax = plt.subplots(figsize=(5.0, 4.4))
    betas = sorted(summary["beta"].unique())
    size = {b: 18 + 70 * i / max(len(betas) - 1, 1) for i, b in enumerate(betas)}
    handles, pts = [], []
    for label, color, ls, rows in _groups(summary):
        for _, r in rows.iterrows():
            ax.scatter(r["predicted_use_fraction"], r[measured], s=size[r["beta"]], color=color,
                       marker=FACET_MARKERS[ls], alpha=0.75, edgecolors="k", linewidths=0.3)
            pts.append((float(r["predicted_use_fraction"]), float(r[measured])))
        handles.append(Line2D([], [], ls="none", marker=FACET_MARKERS[ls], color=color, label=literal(label)))
    for (x, y), n in _same_spot([p for p in pts if np.isfinite(p).all()]).items():
        if n > 1:
            ax.annotate(f"×{n}", (x, y), fontsize=8, xytext=(7, -10 if y > 0.5 else 7), textcoords="offset points")
    ax.plot([0, 1], [0, 1], color="gray", lw=0.8)
    ax.set_xlim(-0.05, 1.05)
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("predicted fraction of examples using z (theory, η = 1)")
    ax.set_ylabel(ylabel)
    handles += [Line2D([], [], ls="none", marker="o", color="gray", markersize=np.sqrt(size[b]), label=f"β={b:g}")
                for b in betas]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig


@_paper
def plot_gains(runs: pd.DataFrame, oracles: pd.DataFrame, eta: float | None = None) -> plt.Figure:
    """Left: each run's z gain D_control − D_run (nats per example, 95 % bootstrap interval as a
    bar) against its rate (mean KL, nats per example); color = weighting, marker = the other facets,
    as in every figure (``figstyle.groups``). Lines: gain 0, gain = rate (η = 1: the gain pays for
    the rate at β = 1) and, given ``eta``, gain = η·rate. Right: the label oracles' ΔR against
    H(label | x), both with their intervals, the label named at each point, and ΔR = H (η = 1).

    ``runs``: ``SweepResults.runs`` merged with ``gains.csv`` (z_gain, z_gain_lo, z_gain_hi, rate);
    ``oracles``: ``available_gain.csv`` rows (``zfree_lab.experiment.gains.oracle_table``)."""
    fig, (ax, ax_o) = plt.subplots(1, 2, figsize=(10.5, 4.2))
    for label, color, ls, s in _groups(runs.dropna(subset=["z_gain"])):
        err = np.vstack([s["z_gain"] - s["z_gain_lo"], s["z_gain_hi"] - s["z_gain"]]).clip(min=0)
        ax.errorbar(s["rate"], s["z_gain"], yerr=err, ls="none", marker=FACET_MARKERS[ls], color=color, capsize=3,
                    label=literal(label))
    r_hi = max([1e-3, *runs.get("rate", pd.Series(dtype=float)).dropna()]) * 1.15
    xs = np.array([0.0, r_hi])
    ax.axhline(0.0, color="gray", lw=0.8)
    ax.plot(xs, xs, color="k", lw=0.8, ls="--", label="gain = rate (η = 1)")
    if eta:
        ax.plot(xs, eta * xs, color="tab:red", lw=0.8, ls=":", label=f"gain = η·rate (η = {eta:.3g})")
    ax.set_xlim(-0.02 * r_hi, r_hi)
    ax.set_xlabel("rate KL(q‖p) [nats / example]")
    ax.set_ylabel("z gain D_control − D_run [nats / example]")
    ax.set_title("What each run's z bought (bars: 95% interval over rows)", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.0, -0.15), frameon=False, ncol=2)
    from zfree_lab.report.oracle_names import oracle_names

    for name, (_, o) in zip(oracle_names(oracles), oracles.iterrows()):
        ax_o.errorbar([o["H"]], [o["delta_R"]], xerr=[[max(o["H"] - o["H_lo"], 0)], [max(o["H_hi"] - o["H"], 0)]],
                      yerr=[[max(o["delta_R"] - o["delta_R_lo"], 0)], [max(o["delta_R_hi"] - o["delta_R"], 0)]],
                      ls="none", marker="*", ms=10, color="tab:red" if o["distinguishable"] else "gray", capsize=3)
        ax_o.annotate(name, (o["H"], o["delta_R"]), fontsize=7, xytext=(4, 4), textcoords="offset points",
                      parse_math=False)  # a label name from data is text: "$x_$" is no mathtext
    h_hi = max([1e-3, *oracles.get("H_hi", pd.Series(dtype=float)).dropna()]) * 1.15
    ax_o.plot([0, h_hi], [0, h_hi], color="k", lw=0.8, ls="--")
    ax_o.axhline(0.0, color="gray", lw=0.8)
    ax_o.set_xlim(0, h_hi)
    ax_o.set_xlabel("H(label | x) [nats / example]")
    ax_o.set_ylabel("ΔR = D_control − D_oracle [nats / example]")
    ax_o.set_title("Label oracles (red: interval above 0; dashed: η = 1)" if len(oracles) else
                   "no label oracle in this study", fontsize=9)
    fig.tight_layout()
    return fig


def _bar(mid: float, lo: float, hi: float) -> np.ndarray:
    """(2, 1) error-bar lengths below and above ``mid``; 0 where the interval is missing (one seed)."""
    return np.nan_to_num(np.array([[mid - lo], [hi - mid]], float), nan=0.0).clip(min=0)


@_paper
def plot_leaderboard(board: pd.DataFrame) -> plt.Figure:
    """The remedies leaderboard (``zfree_lab.experiment.leaderboard.leaderboard`` rows): each cell's mean
    z gain D_control − D_run (y, nats per example) against its mean rate KL(q‖p) (x, nats per
    example), both with their 95 % percentile-bootstrap interval over seeds as bars (none with one
    seed); one point per remedy × weighting (× β), color and marker per remedy
    (``figstyle.REMEDY_STYLES``, the same in every figure), marker fill per weighting
    (``WEIGHTING_FILLS``); one column per side of the predicted boundary (inside / outside), one row
    per data set where the board names several; a line at gain 0 (no gain over the z-free control)."""
    sides = [s for s in ("inside", "outside", "unknown") if (board["side"] == s).any()] or ["inside"]
    sets = list(dict.fromkeys(board["dataset"])) if "dataset" in board else [None]
    fig, axes = plt.subplots(len(sets), len(sides), figsize=(4.4 * len(sides), 3.6 * len(sets)), squeeze=False,
                             sharey="row")
    for i, ds in enumerate(sets):
        rows = board if ds is None else board[board["dataset"] == ds]
        for j, side in enumerate(sides):
            ax, s = axes[i, j], rows[(rows["side"] == side) & rows["z_gain"].notna()]
            for _, r in s.iterrows():
                color, marker = remedy_style(r["remedy"])
                ax.errorbar([r["rate"]], [r["z_gain"]], yerr=_bar(r["z_gain"], r["z_gain_lo"], r["z_gain_hi"]),
                            xerr=_bar(r["rate"], r["rate_lo"], r["rate_hi"]), ls="none",
                            marker=marker, ms=8 if marker == "*" else 6, color=color,
                            fillstyle=WEIGHTING_FILLS.get(str(r["weighting"]), "full"), capsize=2.5, lw=0.9)
            ax.axhline(0.0, color="gray", lw=0.8)
            where = f"{side} the predicted boundary" if side != "unknown" else "no predicted boundary"
            ax.set_title(("" if ds is None else f"{literal(ds)}: ") + where, fontsize=9)
            ax.set_xlabel("rate KL(q‖p) [nats / example]")
            if j == 0:
                ax.set_ylabel("z gain D_control − D_run [nats / example]")
            if s.empty:
                ax.text(0.5, 0.5, "no z gain (no z-free control)", transform=ax.transAxes, ha="center", fontsize=8)
    handles = [Line2D([], [], ls="none", marker=remedy_style(m)[1], color=remedy_style(m)[0], label=literal(m))
               for m in dict.fromkeys(board["remedy"])]
    handles += [Line2D([], [], ls="none", marker="o", color="k", fillstyle=WEIGHTING_FILLS.get(str(w), "full"),
                       label=f"weighting {literal(w)}") for w in dict.fromkeys(board["weighting"])]
    fig.suptitle("Remedies: z's gain against its rate (bars: 95% interval over seeds)", fontsize=10)
    fig.tight_layout()
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(len(handles), 5),
               fontsize=7, frameon=False)
    return fig


@_paper
def plot_label_confusion(table: pd.DataFrame, max_chars: int = 40) -> plt.Figure:
    """A confusion of latent values against a label's values (``zfree.evaluate.latent_stats.label_confusion``:
    rows latent value, columns label value, counts) as a heatmap, for a label with more values than a
    table can show: one row per label value (its name from data, drawn literally, cut to ``max_chars``),
    one column per latent value; color = the share of that label value's rows in each latent value
    (each row sums to 1, so a rare value reads as well as a common one), the count written in each
    cell where the grid is small enough to read it."""
    t = table.T  # (label values, latent values)
    counts = t.to_numpy(float)
    share = counts / np.clip(counts.sum(axis=1, keepdims=True), 1, None)
    n_val, n_lat = share.shape
    fig, ax = plt.subplots(figsize=(min(3.5 + 0.45 * n_lat, 12.0), 1.4 + 0.2 * n_val))
    im = ax.imshow(share, aspect="auto", cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest")
    ax.set_xticks(range(n_lat), [literal(c) for c in t.columns])
    names = [str(v) if len(str(v)) <= max_chars else str(v)[: max_chars - 1] + "…" for v in t.index]
    ax.set_yticks(range(n_val), names, fontsize=7)
    for lab in ax.get_yticklabels():
        lab.set_parse_math(False)  # a label value from data is text: "$x_$" is no mathtext
    if n_val * n_lat <= 600:
        for i in range(n_val):
            for j in range(n_lat):
                if counts[i, j]:
                    ax.text(j, i, f"{counts[i, j]:.0f}", ha="center", va="center", fontsize=6,
                            color="white" if share[i, j] > 0.6 else "black")
    ax.set_xlabel(f"{literal(table.index.name or 'latent value')} (posterior argmax)")
    ax.set_ylabel(str(t.index.name or "label value"))
    ax.yaxis.label.set_parse_math(False)
    fig.colorbar(im, ax=ax, label="share of the label value's rows", fraction=0.04, pad=0.02)
    ax.set_title(f"{n_val} label values × {n_lat} latent values (counts in the cells)", fontsize=9)
    fig.tight_layout()
    return fig
