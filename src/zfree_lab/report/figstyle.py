"""The look of zfree's figures, shared by ``zfree_lab.report.plotting`` and ``zfree_lab.report.plotting_aids``: paper
rcParams, log axes with readable major ticks only, legends outside the data, one color per
weighting and one line style per other facet, and every name from data drawn as the characters it is
(``literal``: no mathtext)."""

from __future__ import annotations

import functools

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter

from zfree.core.weightings import WEIGHTINGS  # noqa: E402
from zfree.objective.remedies import COMPOSED_STYLES, REMEDY_ENTRIES, remedy_style  # noqa: F401 (remedy_style re-exported)
from zfree_lab.experiment.results import FACETS  # noqa: E402 - defined once in zfree_lab.experiment.results
WEIGHTING_COLORS = {name: w.color for name, w in WEIGHTINGS.items()}  # the registry's (zfree.core.weightings)
#: one (color, marker) per remedy in every figure that compares remedies: the registry's
#: (``zfree.objective.remedies.REMEDY_ENTRIES``, each entry's style, and its composed ``COMPOSED_STYLES``)
REMEDY_STYLES = {**{name: (r.color, r.marker) for name, r in REMEDY_ENTRIES.items()}, **COMPOSED_STYLES}
#: the fill of a remedy's marker per weighting (the color and marker already name the remedy)
WEIGHTING_FILLS = {name: w.fill for name, w in WEIGHTINGS.items()}


#: the look every figure is drawn in: no "+1" offset or "1e-6" multiplier on linear axes (values
#: read as they are), slightly smaller tick labels, no top/right spines
PAPER_RC = {"axes.formatter.useoffset": False, "axes.formatter.limits": (-4, 5), "axes.spines.top": False,
            "axes.spines.right": False, "xtick.labelsize": 8, "ytick.labelsize": 8, "axes.titlesize": 10,
            "axes.labelsize": 9, "legend.fontsize": 7}


#: line style of a facet (``LINESTYLES``) -> its marker where a run of one beta draws no line
FACET_MARKERS = {"-": "o", "--": "^", ":": "v", "-.": "D"}

def paper(fn):
    """Draw ``fn``'s figure under ``PAPER_RC`` (the caller's rcParams are left as they were)."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with plt.rc_context(PAPER_RC):
            return fn(*args, **kwargs)

    return wrapped


def literal(s) -> str:
    r"""``s`` (any object, as ``str``) escaped so matplotlib draws it as the characters it is: every
    ``$`` becomes ``\$``. Why: a run, spec, label, oracle or remedy name, a label value or a word
    from the user's text reaches a figure as a tick label, legend entry, title or annotation, and
    matplotlib reads a string with an even number of unescaped ``$`` as mathtext: "$x_$" stopped the
    report with a ParseSyntaxException, "$\frac{a}{b}$" was typeset as a fraction. The rule is
    matplotlib's (``matplotlib.text.Text._preprocess_math`` with ``matplotlib.cbook.is_math_text``): a
    string is mathtext iff its count of ``$`` minus its count of ``\$`` is even and above 0, and a
    string that is not has each ``\$`` drawn as ``$``. Escaping every ``$`` makes that difference 0
    and brings back exactly ``s`` (a ``\$`` already in ``s`` becomes ``\\$``, drawn as ``\$``).
    Not for a Text with ``parse_math=False`` (it would show the backslashes). zfree's own strings
    (``LBAR``, log-axis ticks' ``$\mathdefault{10^{-3}}$``) keep their mathtext: only a string from
    data goes through here, so no global ``text.parse_math``."""
    return str(s).replace("$", r"\$")


def color_of(w: str) -> str:
    """The color of weighting ``w`` (gray for one not in ``WEIGHTING_COLORS``)."""
    return WEIGHTING_COLORS.get(w, "tab:gray")




def thin_log_ticks(vals, min_gap_decades: float = 0.1, share: float = 1 / 6) -> list[float]:
    """The sorted positive ``vals`` thinned so neighbouring labels on a log axis do not overprint:
    a value is kept when it lies at least max(``min_gap_decades``, ``share`` of the values' span in
    decades) above the last kept one (e.g. betas 0.0043, 0.0045, 0.0111 -> 0.0043, 0.0111)."""
    vals = np.sort(np.asarray(vals, float))
    if len(vals) == 0:
        return []
    lv = np.log10(vals)
    gap = max(min_gap_decades, share * (lv[-1] - lv[0]))
    keep = [0]
    for i in range(1, len(vals)):
        if lv[i] - lv[keep[-1]] >= gap - 1e-12:
            keep.append(i)
    return [float(vals[i]) for i in keep]


def decade_ticks(ticks: list[float], lims, min_gap_decades: float = 0.3) -> list[float]:
    """``ticks`` (the data's few values) and, where fewer than 3 of them label an axis shown over more
    than a decade (``lims``, e.g. one beta run under a theory curve over five decades: one tick "0.3"),
    every power of ten within ``lims`` at least ``min_gap_decades`` from each of them, sorted."""
    lo, hi = sorted(float(v) for v in lims)
    if len(ticks) >= 3 or not (lo > 0 and np.isfinite(hi)) or np.log10(hi / lo) <= 1:
        return list(ticks)
    decades = 10.0 ** np.arange(np.ceil(np.log10(lo) - 1e-9), np.floor(np.log10(hi) + 1e-9) + 1)
    lt = np.log10(np.asarray(ticks, float))
    extra = [float(d) for d in decades if not len(lt) or np.min(np.abs(lt - np.log10(d))) >= min_gap_decades - 1e-12]
    return sorted([*ticks, *extra])


def log_axis(ax, axis: str = "x", values=None) -> None:
    """Log scale with readable major ticks only: at ``values`` (the data's few distinct values,
    e.g. the betas a sweep ran, thinned where neighbours would overprint: ``thin_log_ticks``, with the
    powers of ten in view where fewer than 3 of them would label more than a decade: ``decade_ticks``;
    call it once the axis holds everything it draws) when there are at most 8, else at 1-2-5 per decade (one a decade
    beyond 1.5 decades, 1-1.5-2-3-5-7 within one decade, where 1-2-5 left data from 2.5 to 4.5
    with the one label 2 below it); plain-number labels ("0.03", not "3×10⁻²"), no minor labels."""
    getattr(ax, f"set_{axis}scale")("log")
    a = ax.xaxis if axis == "x" else ax.yaxis
    vals = np.unique(np.round(np.asarray([] if values is None else values, float), 12))
    vals = vals[np.isfinite(vals) & (vals > 0)]
    if 0 < len(vals) <= 8:
        a.set_major_locator(FixedLocator(decade_ticks(thin_log_ticks(vals), getattr(ax, f"get_{axis}lim")())))
    else:
        lo, hi = (vals.min(), vals.max()) if len(vals) else getattr(ax, f"get_{axis}lim")()
        span = hi / max(lo, 1e-300)
        subs = (1.0,) if span > 10 ** 1.5 else (1.0, 2.0, 5.0) if span > 10 else (1.0, 1.5, 2.0, 3.0, 5.0, 7.0)
        a.set_major_locator(LogLocator(base=10, subs=subs))
    a.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    a.set_minor_formatter(NullFormatter())


def legend_below(fig, axes, ncol: int = 3, fontsize: int = 7) -> None:
    """One legend for ``axes`` (labels deduplicated) below the figure, outside the data."""
    seen = {}
    for ax in np.ravel(axes):
        for h, lab in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(lab, h)
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=ncol,
                   fontsize=fontsize, frameon=False)


def finish_with_legend_right(fig, ax, xlabel: str, ylabel: str, title: str, title_size: float = 9):
    """Label ``ax``, title it, put its legend right of the axes (outside the data), lay ``fig`` out
    and return it: the last lines of the one-panel figures."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=title_size)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig




def finish_with_legend_below(fig, ax, xlabel: str, ylabel: str, title: str, ncol: int = 2, title_size: float = 9):
    """``finish_with_legend_right`` with the legend under the axes in ``ncol`` columns: for a figure whose
    legend entries are long sentences, which beside the axes would take more width than the data."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=title_size)
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=ncol,
                  frameon=False)
    fig.tight_layout()
    return fig


def rho_limits(ax) -> None:
    """A rho axis from 0 to at least 1.1: 1 (z explains nothing) always in view, and a change of
    1e-4 is drawn as the nothing it is, not stretched over the axis."""
    lo, hi = ax.get_ylim()
    ax.set_ylim(min(0.0, lo), max(1.1, hi))


def shade(ax, x: np.ndarray, mask: np.ndarray) -> None:
    """Shade the x-intervals where ``mask`` holds (log-spaced x: edges at geometric midpoints)."""
    if not mask.any():
        return
    edges = np.concatenate([[x[0]], np.sqrt(x[1:] * x[:-1]), [x[-1]]])
    for lo, hi, m in zip(edges[:-1], edges[1:], mask):
        if m:
            ax.axvspan(lo, hi, color="gold", alpha=0.15, lw=0)


LINESTYLES = ["-", "--", ":", "-."]


def variants(df: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(label, rows) per combination of the facets other than the weighting (latent kind, aid)
    that vary in ``df``, e.g. ``aid=hard_em_then_soft``; one ("", df) when none varies. A figure
    that averages the runs sharing a cell (the phase diagram) is drawn once per variant, so an
    aided run and an unaided one at the same (beta, w) are not averaged into one square."""
    facets = [f for f in FACETS[1:] if f in df and df[f].nunique() > 1]
    if not facets:
        return [("", df)]
    return [(", ".join(f"{f}={k}" for f, k in zip(facets, key)), rows)
            for key, rows in df.groupby(facets, sort=False)]  # grouped by a list: every key is a tuple


def facet_name(facet: str, value) -> str:
    """How a facet's value reads in a figure: the aid "none" as "no aid" (a legend entry
    "distribution none" read as if the weighting were none), every other value as it is."""
    return "no aid" if facet == "aid" and str(value) == "none" else str(value)


def groups(df: pd.DataFrame):
    """(label, color, linestyle, rows) per combination of the facets present in ``df``; the
    color names the weighting, the line style the other facets (latent kind, aid). The label names
    the facets ``df`` varies and, after them, any other facet not at its default (an aid every run
    of ``df`` shares), so an aided run is never labelled as a plain one; the names are joined by
    ", " and read as words (``facet_name``): "distribution, no aid" beside "distribution,
    hard_em_then_soft", and "distribution" alone where no run has an aid."""
    facets = [f for f in FACETS if f in df and (f == "weighting" or df[f].nunique() > 1)]
    shared = [str(df[f].iloc[0]) for f in FACETS[1:] if f in df and f not in facets and len(df)
              and str(df[f].iloc[0]) not in ("none", "discrete", "nan", "None")]
    others = list(dict.fromkeys(tuple(r) for r in df[facets[1:]].itertuples(index=False))) if facets[1:] else [()]
    for key, rows in df.groupby(facets, sort=False):  # grouped by a list: every key is a tuple
        names = [facet_name(f, k) for f, k in zip(facets, key)]
        yield (", ".join([*names, *shared]), color_of(key[0]), LINESTYLES[others.index(key[1:]) % 4], rows)


def label_box(t, renderer):
    """The display box (pixels) of annotation ``t``'s text at its current place, without its line."""
    from matplotlib.text import Text

    t.update_positions(renderer)  # an annotation places its text when drawn: before, the box is stale
    return Text.get_window_extent(t, renderer)


def keep_labels_apart(ax, texts, marks=(), pad_px: float = 1.0, step_pt: float = 2.0) -> None:
    """Place annotations (``ax.annotate`` with ``textcoords="offset points"``, left-aligned) so that
    none is printed over another label, a marker or the legend, nor over the title or past the
    axes' bottom or left edge (right of the axes is allowed, up to the figure's edge, where the
    legend leaves room): each, in turn from the lowest point up, takes the free place nearest its
    own (its ``xyann``; a step of ``step_pt`` points up, down or right costs 1, the point's left
    side 6), up to the axes' height away vertically and half its width to the right; a label that
    cannot be placed free goes where it overlaps least. A moved label keeps a thin gray line to its
    point (its ``arrow_patch``, hidden while within 5 points of its place). ``marks``: (x, y, radius
    in points) of the markers, in data coordinates; ``pad_px``: the gap kept around each label, in
    pixels. Call it once the figure is laid out (pixel positions come from its renderer)."""
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    px = fig.dpi / 72
    placed = [[x - r * px, y - r * px, x + r * px, y + r * px]
              for (x, y), r in ((ax.transData.transform((mx, my)), r) for mx, my, r in marks)]
    legend = ax.get_legend()
    if legend is not None:
        placed.append(list(legend.get_window_extent(renderer).extents))
    frame = ax.get_window_extent(renderer)
    lo_x, lo_y, hi_x, hi_y = frame.x0, frame.y0, fig.bbox.x1, frame.y1
    ks = np.arange(-int(frame.height / (step_pt * px)) - 1, int(frame.height / (step_pt * px)) + 2)
    rights = np.arange(0, int(frame.width / (2 * step_pt * px)) + 1)
    for t in sorted(texts, key=lambda t: tuple(ax.transData.transform(t.xy))[::-1]):
        x0, y0 = t.xyann
        bb = label_box(t, renderer).padded(pad_px)
        left = -2 * x0 - bb.width / px  # the text's right edge as far left of the point as its left edge was right
        # the places tried (offsets in points) and what each costs: steps away from its own place
        dx = np.concatenate([np.repeat(rights * step_pt, len(ks)), np.full(len(ks), left)])
        dy = np.concatenate([np.tile(ks * step_pt, len(rights)), ks * step_pt])
        rank = np.abs(dy) / step_pt + np.where(dx >= 0, dx / step_pt, 6.0)
        boxes = np.stack([bb.x0 + dx * px, bb.y0 + dy * px, bb.x1 + dx * px, bb.y1 + dy * px], axis=1)
        b, p = boxes[:, None, :], np.asarray(placed, float).reshape(1, -1, 4)  # every try against every placed box
        w = np.clip(np.minimum(b[..., 2], p[..., 2]) - np.maximum(b[..., 0], p[..., 0]), 0, None)
        h = np.clip(np.minimum(b[..., 3], p[..., 3]) - np.maximum(b[..., 1], p[..., 1]), 0, None)
        outside = (bb.width * np.clip(np.maximum(lo_y - boxes[:, 1], boxes[:, 3] - hi_y), 0, None)
                   + bb.height * np.clip(np.maximum(lo_x - boxes[:, 0], boxes[:, 2] - hi_x), 0, None))
        best = np.lexsort((rank, (w * h).sum(axis=1) + outside))[0]  # least overlap, then nearest
        t.xyann = (float(x0 + dx[best]), float(y0 + dy[best]))
        if t.arrow_patch is not None:
            t.arrow_patch.set_visible(bool(np.hypot(dx[best], dy[best]) > 5))
        placed.append(list(label_box(t, renderer).padded(pad_px).extents))


def wrap_panels(fig: plt.Figure, ncols: int = 4, panel: tuple[float, float] = (4.4, 3.8)) -> plt.Figure:
    """Re-lay a figure whose axes stand in one row into rows of at most ``ncols`` panels, each
    ``panel`` inches (width, height); a figure of ``ncols`` panels or fewer is returned as is."""
    axes = [ax for ax in fig.axes if ax.get_subplotspec() is not None]
    if len(axes) <= ncols or len(axes) != len(fig.axes) or any(ax.get_subplotspec().get_gridspec().nrows != 1
                                                               for ax in axes):
        return fig  # few panels, colorbars or several rows already: laid out by its plotting function
    nrows = -(-len(axes) // ncols)
    gs = fig.add_gridspec(nrows, ncols)
    for i, ax in enumerate(axes):
        ax.set_subplotspec(gs[i // ncols, i % ncols])
        if i % ncols == 0:
            ax.tick_params(labelleft=True)  # shared y: the first panel of each row keeps its labels
    fig.set_size_inches(panel[0] * ncols, panel[1] * nrows)
    fig.tight_layout()
    return fig
