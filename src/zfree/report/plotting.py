"""Figures of the notebook suite: training curves, the phase diagram and rate-distortion plane of a
sweep, per-example beta_eff and rho distributions. Each function takes tidy pandas data and returns
a matplotlib Figure (headless-safe; tests check the data drawn, not the pixels). The study report's
figures against beta are in ``zfree.report.plotting_study``, the aided runs' in ``plotting_aids``."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg") if matplotlib.get_backend().lower() in ("", "agg") else None
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from zfree.report.figstyle import FACET_MARKERS, FACETS, color_of, finish_with_legend_right, keep_labels_apart  # noqa: E402
from zfree.report.figstyle import literal  # noqa: E402
from zfree.report.figstyle import groups as _groups  # noqa: E402
from zfree.report.figstyle import legend_below as _legend_below  # noqa: E402
from zfree.report.figstyle import log_axis as _log_axis  # noqa: E402
from zfree.report.figstyle import paper as _paper  # noqa: E402
from zfree.report.figstyle import rho_limits as _rho_limits  # noqa: E402

#: ℓ̄ (mean token loss) in mathtext: matplotlib draws the combining macron (U+0304) through the ℓ
LBAR, LBAR_I = r"$\bar{\ell}$", r"$\bar{\ell}_i$"


@_paper
def plot_training_curves(metrics: dict[str, pd.DataFrame], collapse_kl: float = 0.05) -> plt.Figure:
    """Per run (label -> metrics.jsonl as a DataFrame): the share of the objective of every
    ``loss_contrib/fraction_abs/<term>`` (one line style per term), KL, rho_recon and alignment
    NMI over steps: the "collapse moment" plot. A dotted vertical line marks, per run, the first
    evaluation after step 0 whose KL is below ``collapse_kl`` nats (the collapse criterion of the
    main job's acceptance)."""
    keys = [("loss/val/kl_prior_loss", "rate KL [nats / example]"),
            ("loss/val/baseline_normalized_reconstruction_loss", "ρ_recon = R_val / c_base (ratio of means)"),
            ("structure/alignment_nmi", "alignment NMI (argmax z vs strategy)")]
    fig, axes = plt.subplots(2, 2, figsize=(10, 6.4))  # 2 × 2: readable at the report's width
    axes = axes.flatten()
    styles = ["-", "--", ":", "-."]
    for i, (label, df) in enumerate(metrics.items()):
        color = f"C{i % 10}"
        terms = [c for c in df.columns if c.startswith("loss_contrib/fraction_abs/")]
        for j, t in enumerate(terms):
            axes[0].plot(df["step"], df[t], styles[j % 4], color=color, marker=".",
                         label=literal(f"{label}: {t.rsplit('/', 1)[-1]}"))
        for ax, (k, name) in zip(axes[1:], keys):
            if k in df:
                ax.plot(df["step"], df[k], marker=".", color=color, label=literal(label))
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
    runs = [Line2D([], [], color=f"C{i % 10}", marker=".", label=literal(label)) for i, label in enumerate(metrics)]
    terms = list(dict.fromkeys(c.rsplit("/", 1)[-1] for df in metrics.values() for c in df.columns
                               if c.startswith("loss_contrib/fraction_abs/")))
    styles_h = [Line2D([], [], color="k", ls=styles[j % 4], label=literal(f"{t} (top left)")) for j, t in enumerate(terms)]
    styles_h += [Line2D([], [], color="gray", lw=0.6, ls="--", label=f"KL = {collapse_kl:g}: collapsed below (KL panel)"),
                 Line2D([], [], color="k", lw=1, ls=":", label="a run's first evaluation below it (KL panel)")]
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
    identically, DESIGN §1); and ``critical_betas`` (weighting -> predicted beta*) as a black ×
    on each weighting's row (the ``example`` row is not a scalar weight, so its beta* is off
    the line). ``highlight``: a (beta, w) cell outlined in red (the widgets' selection).
    ``variant``: named in the title (one diagram per aid / latent kind: ``figstyle.variants``).
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
        ax.plot(beta_over_w * ws, ws, "-", color="k", lw=1.4, zorder=2, label="predicted boundary β·|S|/w = 1")
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


def _label_clusters(points, spans: tuple[float, float], tol: float = 0.03,
                    width: int = 44) -> dict[tuple[float, float], tuple[str, str]]:
    """Points (rate, distortion, beta, group, color) drawn in one pile, each within ``tol`` of the
    axes' ``spans`` (rate, distortion) of another of the pile (their markers touch; chained, so the
    piles do not depend on the order of ``points``), share one label: (x, y) of the pile's point
    nearest its middle -> (text, color). One group there: "β=0.3, 1" in the group's color; several:
    a line per set of betas naming the groups drawn at just those betas ("β=0.3, 1: distribution,
    example (hard_em_then_soft)"), in black, as their markers hide each other; a line longer than
    ``width`` characters wraps between names (``_wrap_items``)."""
    span_r, span_d = (max(1e-12, float(v)) for v in spans)
    pile = list(range(len(points)))  # union-find: the pile of each point

    def root(i: int) -> int:
        while pile[i] != i:
            i = pile[i]
        return i

    for i, (x, y, *_) in enumerate(points):
        for j, (u, v, *_) in enumerate(points[:i]):
            if abs(u - x) / span_r < tol and abs(v - y) / span_d < tol:
                pile[root(i)] = root(j)
    piles: dict[int, list] = {}
    for i, p in enumerate(points):
        piles.setdefault(root(i), []).append(p)
    colors = {g: c for *_, g, c in points}
    out = {}
    for members in piles.values():
        mid_r, mid_d = np.mean([p[0] for p in members]), np.mean([p[1] for p in members])
        home = min(members, key=lambda p: ((p[0] - mid_r) / span_r) ** 2 + ((p[1] - mid_d) / span_d) ** 2)[:2]
        betas: dict[str, set] = {}
        for _, _, b, g, _ in members:
            betas.setdefault(g, set()).add(b)
        if len(betas) == 1:
            (g, bs), = betas.items()
            out[home] = ("β=" + ", ".join(f"{b:g}" for b in sorted(bs)), colors[g])
            continue
        by_set: dict[tuple, list[str]] = {}
        for g, bs in betas.items():
            by_set.setdefault(tuple(sorted(bs)), []).append(g)
        lines = [_wrap_items(f"β={', '.join(f'{b:g}' for b in bs)}:", _name_groups(sorted(gs)).split(", "), width)
                 for bs, gs in sorted(by_set.items())]
        out[home] = ("\n".join(lines), "k")
    return out


def _wrap_items(head: str, items: list[str], width: int, indent: str = "    ") -> str:
    """``head`` and ``items`` ("head item, item, ...") in lines of at most ``width`` characters,
    broken only between items (a run's name, e.g. "plain hard_em_then_soft", and ``head`` are never
    split; one longer than ``width`` stands alone), the lines after the first indented by ``indent``."""
    lines = [head]
    for i, item in enumerate(items):
        sep = " " if i == 0 else ", "
        if len(lines[-1]) + len(sep) + len(item) > width and lines[-1].strip():
            lines[-1] += sep.rstrip()
            lines.append(indent + item)
        else:
            lines[-1] += sep + item
    return "\n".join(lines)


def _name_groups(labels: list[str]) -> str:
    """Group labels in one line, their shared trailing facets once: "distribution, example (hard_em_then_soft)"."""
    words = [lb.split(" ") for lb in labels]
    n = 0
    while len(labels) > 1 and all(len(w) > n + 1 for w in words) and len({w[-1 - n] for w in words}) == 1:
        n += 1
    heads = ", ".join(" ".join(w[:len(w) - n]) for w in words)
    return heads + (f" ({' '.join(words[0][len(words[0]) - n:])})" if n else "")


@_paper
def plot_rate_distortion(runs: pd.DataFrame, z_free: float | None = None, bayes_rate: float | None = None,
                         n_iso: int = 6, controls: pd.DataFrame | None = None) -> plt.Figure:
    """The rate-distortion plane (Alemi et al. 2018): rate R = mean KL(q‖p) and distortion
    D = mean |S|·ℓ̄, both nats per sequence; one curve per weighting (and facet) across beta.

    ``z_free``: the measured z-free point (R = 0, D = mean |S|·b of the base model, i.e.
    |S|·c_base per sequence). ``bayes_rate``: mean log(K/m) (DESIGN §2), which places the
    analytic optimum (R = log(K/m), D = 0: z names the strategy, y is then determined) and the
    Bayes-optimal z-free point (0, log(K/m)) on one iso-ELBO line D + R = const (dashed): at
    beta = 1 nothing prefers using z. Dotted: more iso-ELBO lines (slope -1). ``controls``: each run's
    own z-free control (``zfree.report.gains_report.control_links`` rows: run_id, control_run_id,
    D_control, rate, distortion, label): every distinct control is drawn at (0, D_control) (same
    training, no latent), named C1, C2, ... where there are several, and joined to each of its runs by
    a thin line, so a run is read against its own control, never against a mean of controls. A NaN
    ``z_free``/``bayes_rate`` (real data has no Bayes loss) counts as absent: nothing is drawn or listed
    for it and the axes span only what is drawn. The runs drawn in one pile (e.g. every collapsed run
    at R ≈ 0) share one label naming their betas and groups (``_label_clusters``); each label sits
    apart from the others, the markers, the legend and the title, a moved one joined to its pile by a
    thin line (``figstyle.keep_labels_apart``).
    """
    z_free, bayes_rate = (None if v is None or not np.isfinite(v) else float(v) for v in (z_free, bayes_rate))
    links = (controls.dropna(subset=["D_control"]) if controls is not None else pd.DataFrame(columns=["D_control"]))
    fig, ax = plt.subplots(figsize=(6.2, 4.8))
    points = []
    for label, color, ls, rows in _groups(runs):  # the runs over the reference points (zorder 4): both stay seen
        rows = rows.groupby("beta", as_index=False)[["rate", "distortion"]].mean().sort_values("beta")
        ax.plot(rows["rate"], rows["distortion"], ls, marker=FACET_MARKERS[ls], color=color, label=literal(label),
                zorder=5)
        points += [(r["rate"], r["distortion"], r["beta"], label, color) for _, r in rows.iterrows()]
    pts_r = [*runs["rate"], 0.0] + ([bayes_rate] if bayes_rate else [])
    pts_d = [*runs["distortion"].dropna(), *links["D_control"]] + ([z_free] if z_free is not None else []) + (
        [0.0, bayes_rate] if bayes_rate else [])
    r_hi = max(pts_r) * 1.15 + 1e-3
    d_lo, d_hi = min(pts_d), max(pts_d)
    pad = 0.1 * (d_hi - d_lo) + 1e-3
    for c in np.linspace(d_lo, d_hi + r_hi, n_iso):
        ax.plot([0, r_hi], [c, c - r_hi], color="gray", lw=0.6, ls=":", zorder=0)
    if z_free is not None:
        ax.scatter([0.0], [z_free], marker="*", s=160, color="k", zorder=4, label="z-free (R = 0, D = mean |S|·b)")
    tags = _draw_controls(ax, links)
    if bayes_rate:
        ax.plot([0, bayes_rate], [bayes_rate, 0], color="k", lw=0.8, ls="--", zorder=0,
                label="iso-ELBO through the Bayes-optimal points")
        ax.scatter([0.0], [bayes_rate], marker="*", s=160, facecolors="none", edgecolors="k", zorder=4,
                   label="Bayes-optimal z-free (0, log K/m)")
        ax.scatter([bayes_rate], [0.0], marker="P", s=120, color="tab:red", zorder=4,
                   label="analytic optimum (log K/m, 0): z names the strategy")
    ax.set_xlim(-0.02 * r_hi, r_hi)
    ax.set_ylim(d_lo - pad, d_hi + pad)
    labels = [ax.annotate(literal(text), (x, y), fontsize=6.5, xytext=(4, 3), textcoords="offset points", zorder=6,
                          color=color, arrowprops={"arrowstyle": "-", "color": "gray", "lw": 0.5, "shrinkA": 0, "shrinkB": 3},
                          bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8})  # over iso lines
              for (x, y), (text, color) in _label_clusters(points, (1.02 * r_hi, d_hi - d_lo + 2 * pad)).items()]
    labels += [ax.annotate(tag, (0.0, d), fontsize=7, xytext=(4, 3), textcoords="offset points", zorder=6,
                           arrowprops={"arrowstyle": "-", "color": "gray", "lw": 0.5, "shrinkA": 0, "shrinkB": 5},
                           bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8})
               for d, tag in _control_tags(tags, d_hi - d_lo + 2 * pad).items()]  # the controls' piles: one tag each
    fig = finish_with_legend_right(fig, ax, "rate R = KL(q‖p) [nats / sequence]",
                                   f"distortion D = |S|·{LBAR} [nats / sequence]",
                                   "Rate-distortion plane (dotted: iso-ELBO D + R = const)")
    marks = [(x, y, 3.2) for x, y, *_ in points] + [(0.0, z_free, 6.5)] * (z_free is not None) + [
        (0.0, d, 6.0) for d in links["D_control"]] + ([(0.0, bayes_rate, 6.5), (bayes_rate, 0.0, 6.0)]
                                                     if bayes_rate else [])  # radii: ms 6, s 160, s 110-120
    keep_labels_apart(ax, labels, marks)  # one label per pile; none over another, a marker, the legend or the title
    return fig


def _draw_controls(ax, links: pd.DataFrame, max_named: int = 3) -> list[tuple[float, str]]:
    """``plot_rate_distortion``'s controls: one X per distinct control at (0, D_control), named C1,
    C2, ... (by D) where there are several, each joined to its runs (the run's weighting color) by a
    thin dashed line; one legend entry per control naming up to ``max_named`` of its runs. Returns
    (D_control, tag) of the named ones, by D (tagged on the figure by ``_control_tags``)."""
    if links.empty:
        return []
    tags = []
    order = links.groupby("control_run_id", sort=False)["D_control"].first().sort_values()
    for i, (cid, d) in enumerate(order.items(), 1):
        own = links[links["control_run_id"] == cid]
        for _, r in own.iterrows():
            ax.plot([0.0, r["rate"]], [d, r["distortion"]], ls=(0, (4, 2)), lw=0.7, alpha=0.6,
                    color=color_of(str(r.get("weighting"))), zorder=1, gid=f"control-link {cid} {r['run_id']}")
        names = [literal(n) for n in dict.fromkeys(own["label"])]  # seeds of one recipe share a name
        named = ",\n  ".join(names[:max_named]) + (f" +{len(names) - max_named}" if len(names) > max_named else "")
        tag = f"C{i}" if len(order) > 1 else ""
        ax.scatter([0.0], [d], marker="X", s=110, color="tab:gray", edgecolors="k", linewidths=0.4, zorder=4,
                   label="z-free control" + (f" {tag}" if tag else "") + f" (R = 0, same training) of:\n  {named}")
        if tag:
            tags.append((float(d), tag))
    return tags


def _control_tags(tags: list[tuple[float, str]], span_d: float, tol: float = 0.03) -> dict[float, str]:
    """The controls' tags (``_draw_controls``: (D, "C<i>") by D) of the Xs drawn in one pile at R = 0
    (each within ``tol`` of ``span_d`` of the next) as one tag: D of the pile's middle X -> "C1–C4"
    (consecutive), "C1, C2" (two) or "C5" (alone)."""
    piles: list[list[tuple[float, str]]] = []
    for d, tag in tags:
        if piles and abs(d - piles[-1][-1][0]) / max(1e-12, span_d) < tol:
            piles[-1].append((d, tag))
        else:
            piles.append([(d, tag)])
    return {pile[len(pile) // 2][0]: (f"{pile[0][1]}–{pile[-1][1]}" if len(pile) > 2 else ", ".join(t for _, t in pile))
            for pile in piles}


@_paper
def plot_effective_beta(per_example: pd.DataFrame, eta: float | None = None) -> plt.Figure:
    """Per-example beta_eff = beta·|S|/w (DESIGN §1; seeds 000, 002) per weighting: against b
    (nats per token), against |S|, and per-example KL (nats per sequence) against beta_eff —
    which examples use z. The line beta_eff = 1 is drawn in every panel (theory: z is worth
    using iff beta_eff < 1). ``per_example``: rows of the runs' per_example tables tagged with
    weighting (and facets), one beta per weighting. ``eta``: the measured exchange rate of the best
    label (``zfree.experiment.gains``), drawn as a second threshold β_eff = η (z pays where β_eff < η)."""
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
