"""The rate-distortion plane of a study's runs (Alemi et al. 2018, "Fixing a Broken ELBO", §3: rate
R = E KL(q(z|x,y) ‖ p(z|x)), distortion D = E -log p(y|x,z), both nats per sequence): one curve per
weighting across beta, each run joined to its own z-free control, the runs drawn in one pile labelled
once. Re-exported by ``zfree_lab.report.plotting``."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from zfree_lab.report.figstyle import FACET_MARKERS, color_of, finish_with_legend_below, keep_labels_apart
from zfree_lab.report.figstyle import literal
from zfree_lab.report.figstyle import groups as _groups
from zfree_lab.report.figstyle import paper as _paper

#: ℓ̄ (mean token loss) in mathtext: matplotlib draws the combining macron (U+0304) through the ℓ
LBAR = r"$\bar{\ell}$"


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
        lines = [_wrap_items(f"β={', '.join(f'{b:g}' for b in bs)}:", _name_groups(sorted(gs)), width)
                 for bs, gs in sorted(by_set.items())]
        out[home] = ("\n".join(lines), "k")
    return out


def _wrap_items(head: str, items: list[str], width: int, indent: str = "    ") -> str:
    """``head`` and ``items`` ("head item, item, ..."; "head item; item; ..." where an item holds a
    comma, e.g. "plain, hard_em_then_soft") in lines of at most ``width`` characters, broken only
    between items (a run's name and ``head`` are never split; one longer than ``width`` stands alone),
    the lines after the first indented by ``indent``."""
    between = "; " if any("," in item for item in items) else ", "
    lines = [head]
    for i, item in enumerate(items):
        sep = " " if i == 0 else between
        if len(lines[-1]) + len(sep) + len(item) > width and lines[-1].strip():
            lines[-1] += sep.rstrip()
            lines.append(indent + item)
        else:
            lines[-1] += sep + item
    return "\n".join(lines)


def _name_groups(labels: list[str]) -> list[str]:
    """Group labels (``figstyle.groups``: facets joined by ", ") as the items of one line, their shared
    trailing facets once, after the last: ["distribution", "example (hard_em_then_soft)"]."""
    words = [lb.split(", ") for lb in labels]
    n = 0
    while len(labels) > 1 and all(len(w) > n + 1 for w in words) and len({w[-1 - n] for w in words}) == 1:
        n += 1
    heads = [", ".join(w[:len(w) - n]) for w in words]
    return heads[:-1] + [heads[-1] + (f" ({', '.join(words[0][len(words[0]) - n:])})" if n else "")]


@_paper
def plot_rate_distortion(runs: pd.DataFrame, z_free: float | None = None, bayes_rate: float | None = None,
                         n_iso: int = 6, controls: pd.DataFrame | None = None) -> plt.Figure:
    """The rate-distortion plane (Alemi et al. 2018): rate R = mean KL(q‖p) and distortion
    D = mean |S|·ℓ̄, both nats per sequence; one curve per weighting (and facet) across beta.

    ``z_free``: the measured z-free point (R = 0, D = mean |S|·b of the base model, i.e.
    |S|·c_base per sequence). ``bayes_rate``: mean log(K/m) (docs/concepts/problem.md#benchmark), which
    places the analytic optimum (R = log(K/m), D = 0: z names the strategy, y is then determined) and the
    Bayes-optimal z-free point (0, log(K/m)) on one iso-ELBO line D + R = const (dashed): at
    beta = 1 nothing prefers using z. Dotted: more iso-ELBO lines (slope -1). ``controls``: each run's
    own z-free control (``zfree_lab.report.gains_report.control_links`` rows: run_id, control_run_id,
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
    fig, ax = plt.subplots(figsize=(6.2, 5.6))
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
    labels = _pile_labels(ax, points, tags, (1.02 * r_hi, d_hi - d_lo + 2 * pad))
    fig = finish_with_legend_below(fig, ax, "rate R = KL(q‖p) [nats / sequence]",
                                   f"distortion D = |S|·{LBAR} [nats / sequence]",
                                   "Rate-distortion plane (dotted: iso-ELBO D + R = const)")
    marks = [(x, y, 3.2) for x, y, *_ in points] + [(0.0, z_free, 6.5)] * (z_free is not None) + [
        (0.0, d, 6.0) for d in links["D_control"]] + ([(0.0, bayes_rate, 6.5), (bayes_rate, 0.0, 6.0)]
                                                     if bayes_rate else [])  # radii: ms 6, s 160, s 110-120
    keep_labels_apart(ax, labels, marks)  # one label per pile; none over another, a marker, the legend or the title
    return fig


def _pile_labels(ax, points, tags: list[tuple[float, str]], spans: tuple[float, float]) -> list:
    """``plot_rate_distortion``'s labels: one per pile of run points (``_label_clusters``; text in the
    group's color, over the iso lines) and one per pile of controls' Xs (``_control_tags``) at R = 0;
    ``spans``: the axes' (rate, distortion) extents. Returns the annotations (moved apart by the caller)."""
    box = {"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8}
    labels = [ax.annotate(literal(text), (x, y), fontsize=6.5, xytext=(4, 3), textcoords="offset points", zorder=6,
                          color=color, arrowprops={"arrowstyle": "-", "color": "gray", "lw": 0.5, "shrinkA": 0, "shrinkB": 3},
                          bbox=box) for (x, y), (text, color) in _label_clusters(points, spans).items()]
    return labels + [ax.annotate(tag, (0.0, d), fontsize=7, xytext=(4, 3), textcoords="offset points", zorder=6,
                                 arrowprops={"arrowstyle": "-", "color": "gray", "lw": 0.5, "shrinkA": 0, "shrinkB": 5},
                                 bbox=box) for d, tag in _control_tags(tags, spans[1]).items()]


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
