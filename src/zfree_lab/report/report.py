"""The report's logic, out of the notebooks: showing a figure whatever the matplotlib backend,
the per-run verdict (predicted against measured latent use), the tables that fit a page, the
runs at the beta nearest a value, and the aided runs' hand-over gate traces and confusion tables.

Every notebook of the report is a parameters cell, a load cell and calls into this module and
``zfree_lab.report.plotting``; the functions take the tidy tables of ``zfree_lab.experiment.results`` (``SweepResults.runs``,
``.per_example``) and return DataFrames or strings, so they are tested on hand-made rows.
"""

from __future__ import annotations

import io
import string
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from zfree.core.io import read_json, read_table
from zfree.evaluate.latent_stats import confusion
from zfree_lab.run.run_config import USE_THRESHOLD
from zfree_lab.experiment.results import FACETS
from zfree_lab.report.figstyle import facet_name
from zfree_lab.report.plotting import rho_summaries

# USE_THRESHOLD (zfree_lab.run.run_folder, where a run's summary sets latent_used and
# predicted_latent_used): a run "uses z" when more than this fraction of its rows does

#: below this measured fraction a run that theory says should use z is called collapsed; between
#: it and USE_THRESHOLD, only partly used (the default preset's aided runs at 500 steps: 25-63%)
COLLAPSED_BELOW = 0.1


#: every ASCII punctuation character as a numeric character reference: markdown cannot build
#: emphasis, code, links, headings, lists, tables, math or raw HTML out of text escaped with it;
#: control characters and lone surrogates as U+FFFD (a ``str.translate`` table)
_MD_ESCAPES = {**{ord(c): f"&#{ord(c)};" for c in string.punctuation},
               **dict.fromkeys([*range(32), *range(0x7F, 0xA0), *range(0xD800, 0xE000)], "\ufffd")}


def md_text(text) -> str:
    """``text`` (any string from data, specs, run names or errors) as markdown that renders as that
    text and nothing else: ASCII punctuation as character references (``<`` -> ``&#60;``, ``*`` ->
    ``&#42;``), so no element, attribute, heading or emphasis comes from it; runs of whitespace,
    line breaks included, as one space (a line break would end a list item or start a heading);
    control characters and lone surrogates, which HTML cannot carry, as U+FFFD."""
    return " ".join(str(text).split()).translate(_MD_ESCAPES)


def md_code(text) -> str:
    """``text`` as inline code in markdown (what a backtick span shows), escaped as ``md_text``: a
    backtick in the text cannot end the span."""
    return f"<code>{md_text(text)}</code>"


def show(fig, dpi: int = 110) -> None:
    """Display ``fig`` (a matplotlib Figure) as a PNG in the notebook and close it.

    The PNG is rendered here (``savefig``, tight bounding box, so legends placed outside the axes
    are kept) and handed to IPython as ``image/png``: the figure reaches the notebook and
    report.html under any backend, including ``MPLBACKEND=Agg``, where the inline backend that
    would otherwise show it is not active. Closing it keeps the inline backend from showing it a
    second time. Outside IPython (a script) the PNG goes nowhere and the figure is still closed.
    """
    from IPython.display import Image, display  # lazy: ~0.25 s, only where a figure is shown

    display(Image(data=figure_png(fig, dpi), format="png"))


def figure_png(fig, dpi: int = 110) -> bytes:
    """``fig`` (a matplotlib Figure) as PNG bytes (tight bounding box), the figure closed."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def nearest(values, v: float) -> float:
    """The element of ``values`` nearest ``v`` on a log scale (``v`` itself when empty)."""
    values = np.asarray(sorted(values), float)
    return float(values[np.argmin(np.abs(np.log(values) - np.log(v)))]) if len(values) else v


def runs_at_beta(runs: pd.DataFrame, beta: float) -> pd.DataFrame:
    """Per combination of the facets present (weighting, latent kind, aid), the runs at the beta
    nearest ``beta`` on a log scale (every seed there). ``runs``: ``SweepResults.runs``."""
    if runs.empty:
        return runs
    facets = [c for c in FACETS if c in runs]
    parts = [g[g["beta"] == nearest(g["beta"].unique(), beta)] for _, g in runs.groupby(facets, sort=False)]
    return pd.concat(parts)


def run_label(row, runs: pd.DataFrame | None = None) -> str:
    """``weighting[, latent_kind][, aid][, remedy], β=…[, seed …]``, the names joined by ", " and read
    as words as the figures' legends name facets (``figstyle.groups``, ``facet_name``), e.g.
    "distribution, hard_em_then_soft, β=0.3, seed 1" (the fields joined by spaces read as one
    phrase: "distribution hard_em_then_soft β=0.3 s1"). Every facet that is not its default
    (``aid = none``, ``latent_kind = discrete``, ``remedy = none``) is named, whether or not ``runs``
    varies it, so a run reads the same in every table and figure (an aided run never loses its aid
    in a table of aided runs only); then the injection route and ``latent_capacity`` when not their
    defaults ("memory route", "shared_delta"; not in the figures' legends); the seed where ``runs`` has several."""
    parts = [facet_name("weighting", row["weighting"])]
    for f in ("latent_kind", "aid", "remedy"):
        if f in row and str(row[f]) not in ("none", "discrete", "nan", "None"):
            parts.append(facet_name(f, row[f]))
    if str(row.get("injection", "embedding")) not in ("embedding", "nan", "None"):  # how z enters (routes)
        parts.append(f"{row['injection']} route")
    if str(row.get("latent_capacity", "per_value")) == "shared_delta":
        parts.append("shared_delta")
    parts.append(f"β={row['beta']:g}")
    if runs is not None and "seed" in runs and runs["seed"].nunique() > 1:
        parts.append(f"seed {int(row['seed'])}")
    return ", ".join(parts)


def use_side(fraction, threshold: float = USE_THRESHOLD) -> str:
    """"use" when ``fraction`` (of a run's rows) exceeds ``threshold``, else "no use"; "unknown" when
    it is NaN."""
    return "unknown" if pd.isna(fraction) else ("use" if fraction > threshold else "no use")


def percent(fraction) -> str:
    """``fraction`` as a whole percentage ("25%"); "–" when it is NaN."""
    return "–" if pd.isna(fraction) else f"{100 * fraction:.0f}%"


def run_verdicts(summary: pd.DataFrame, threshold: float = USE_THRESHOLD) -> pd.DataFrame:
    """One verdict per run: does z get used where theory says it pays?

    ``summary``: summary.csv rows with weighting, beta, predicted_use_fraction (fraction of rows
    with beta_eff = beta·|S|/w < 1) and measured_use_fraction (fraction with per-example KL of at
    least half its Bayes rate); aid, latent_kind, seed optional. A run is predicted (measured) to
    use z when its fraction exceeds ``threshold``; a run predicted to use z that does not is
    "collapsed" below ``COLLAPSED_BELOW`` of its rows, else "only partly used". Returns columns run, predicted use, measured
    use (the fractions), predicted, measured ("use"/"no use"/"unknown" where a fraction is NaN),
    agree (bool, NaN when unknown) and verdict, in the summary's order.
    Raises KeyError naming a missing column.
    """
    for c in ("weighting", "beta", "predicted_use_fraction", "measured_use_fraction"):
        if c not in summary:
            raise KeyError(f"run_verdicts: summary has no column {c!r}")
    rows = []
    for _, r in summary.iterrows():
        p, m = use_side(r["predicted_use_fraction"], threshold), use_side(r["measured_use_fraction"], threshold)
        agree = np.nan if "unknown" in (p, m) else p == m
        collapsed = m == "no use" and r["measured_use_fraction"] < COLLAPSED_BELOW
        verdict = {("use", "use"): "agree: z used, as predicted",
                   ("no use", "no use"): "agree: z unused, as predicted",
                   ("use", "no use"): "DISAGREE: collapsed where theory predicts use" if collapsed else
                                      "DISAGREE: only partly used where theory predicts use",
                   ("no use", "use"): "DISAGREE: z used where theory predicts no use"}.get((p, m), "unknown")
        rows.append({"run": run_label(r, summary), "predicted use": r["predicted_use_fraction"],
                     "measured use": r["measured_use_fraction"], "predicted": p, "measured": m, "agree": agree,
                     "verdict": verdict})
    return pd.DataFrame(rows, columns=["run", "predicted use", "measured use", "predicted", "measured", "agree",
                                       "verdict"])


def verdict_markdown(verdicts: pd.DataFrame) -> str:
    """The report's opening lines: a count of agreeing runs, then one line per run
    (``run_verdicts`` rows): fractions as percentages and the verdict."""
    if verdicts.empty:
        return "**No finished runs.**"
    known = verdicts["agree"].dropna()
    head = f"**{int(known.sum())} of {len(verdicts)} runs agree with theory**" + (
        f" ({len(verdicts) - len(known)} without a prediction or a measurement)." if len(known) < len(verdicts) else ".")
    lines = [f"- {md_code(r['run'])}: predicted use {percent(r['predicted use'])} of rows, "
             f"measured {percent(r['measured use'])}"
             f" — {r['verdict']}" for _, r in verdicts.iterrows()]
    return "\n".join([head, "", *lines])


#: the study table of the report, split so each part fits a page: summary.csv column -> header
#: the rate (KL), the mutual information I(x, y; z) under q and the codes used stand together: a rate
#: paid on one code carries nothing (a hard-EM run showed rate 1.22 nats with one code used, MI 0.026)
USE_COLUMNS = {"beta_eff_median": "median β_eff", "predicted_use_fraction": "predicted use",
               "measured_use_fraction": "measured use", "kl_prior_loss": "KL [nats]",
               "mutual_information": "MI [nats]", "codes_used": "codes used",
               "baseline_normalized_reconstruction_loss": "ρ_recon", "oracle_rho": "oracle ρ"}
QUALITY_COLUMNS = {"q_max_mean": "mean max q", "alignment_nmi": "NMI",
                   "alignment_nmi_unambiguous": "NMI (m=1)", "task_correctness": "task correct",
                   "base_task_correctness": "base task correct", "steps": "steps", "wall_s": "wall [s]"}


def run_table(summary: pd.DataFrame, columns: dict[str, str], digits: int = 3) -> pd.DataFrame:
    """``summary``'s ``columns`` (those present, renamed to their short headers) indexed by the
    run's label (``run_label``), floats rounded to ``digits`` decimals: a table that fits a page."""
    t = summary[[c for c in columns if c in summary]].rename(columns=columns)
    t.index = pd.Index([run_label(r, summary) for _, r in summary.iterrows()], name="run")
    return _numeric(t).round(digits)


def _numeric(t: pd.DataFrame) -> pd.DataFrame:
    """``t`` with each object column that holds only numbers and JSON nulls made numeric (so a
    table shows one missing-value marker, NaN, not "None" beside "NaN", and rounds)."""
    t = t.copy()
    for c in t.columns:
        if t[c].dtype == object:
            num = pd.to_numeric(t[c], errors="coerce")
            if num.notna().sum() == t[c].notna().sum():
                t[c] = num
    return t


def rho_table(per_example: pd.DataFrame) -> pd.DataFrame:
    """Per facet and beta: rho_recon as a ratio of means (mean ℓ̄ / mean b) and the mean of the
    per-example ratios rho_i (``plotting.rho_summaries``, the numbers the ρ figure draws)."""
    keys = [c for c in FACETS if c in per_example] + ["beta"]
    return rho_summaries(per_example, keys).set_index(keys).round(4)


# --- the aided runs (switch_on) ----------------------------------------------------------------

AIDED_COLUMNS = {"aid": "aid", "weighting": "weighting", "beta": "β", "n_latent": "K",
                 "posterior_features": "posterior", "lr_new": "lr new", "seed": "seed",
                 "predicted_use_fraction": "predicted use", "measured_use_fraction": "measured use",
                 "kl_prior_loss": "KL [nats]", "mutual_information": "MI [nats]", "codes_used": "codes used",
                 "bayes_rate": "analytic I(z;y|x)",
                 "alignment_nmi_unambiguous": "NMI (m=1)", "hungarian_accuracy_unambiguous": "matched acc (m=1)",
                 "baseline_normalized_reconstruction_loss": "ρ_recon", "oracle_rho": "oracle ρ",
                 "task_correctness": "task correct",
                 "base_task_correctness": "base task correct", "gate_first_pass_step": "switch-on step",
                 "handover_step": "hand-over step", "steps": "steps", "wall_s": "wall [s]"}
#: the aided table split in two so each part fits a page: the recipe and the outcome
AIDED_SPLIT = (("aid", "weighting", "β", "K", "posterior", "lr new", "seed", "switch-on step", "hand-over step",
                "steps", "wall [s]"),
               ("predicted use", "measured use", "KL [nats]", "MI [nats]", "codes used", "analytic I(z;y|x)",
                "NMI (m=1)", "matched acc (m=1)", "ρ_recon", "oracle ρ", "task correct", "base task correct"))


def aided_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs with an aid (``aid`` not none; none when the column is missing)."""
    return runs[runs["aid"].fillna("none") != "none"] if "aid" in runs else runs.iloc[:0]


#: recipe settings shown as set, never rounded (a real-data β*/3 of 0.002199, a latent rate of 1e-4)
AIDED_EXACT = ("β", "lr new")
#: columns that count (steps, latent values, seeds): whole numbers, NaN where unknown (a gate never passed)
AIDED_COUNTS = ("K", "seed", "switch-on step", "hand-over step", "steps")


def _whole(v):
    """``v`` as an int where it is a whole number, else as it is (NaN stays NaN)."""
    return int(v) if isinstance(v, (int, float, np.integer, np.floating)) and np.isfinite(v) and float(v).is_integer() else v


def aided_tables(aided: pd.DataFrame, digits: int = 3) -> list[pd.DataFrame]:
    """The aided runs' table (``AIDED_COLUMNS``) as the two halves of ``AIDED_SPLIT`` (recipe,
    outcome), both indexed by the short run id, rounded to ``digits`` decimals but for the settings
    of ``AIDED_EXACT`` (shown as set) and the counts of ``AIDED_COUNTS`` (whole numbers)."""
    t = _numeric(aided[[c for c in AIDED_COLUMNS if c in aided]].rename(columns=AIDED_COLUMNS))
    exact = [c for c in AIDED_EXACT if c in t]
    t = t.round(digits).assign(**{c: t[c] for c in exact})
    for c in AIDED_COUNTS:
        if c in t and pd.api.types.is_numeric_dtype(t[c]):
            t[c] = pd.Series([_whole(v) for v in t[c]], index=t.index, dtype=object)
    t.index = pd.Index([str(r)[-8:] for r in aided["run_id"]], name="run")
    return [t[[c for c in part if c in t]] for part in AIDED_SPLIT]


#: the switch-on targets for an aided run where theory predicts use: column name -> (the
#: columns it reads, its test of a run row); a target is judged wherever its own columns are known
SWITCH_ON_TARGETS = {
    "NMI (m=1) ≥ 0.9": (("alignment_nmi_unambiguous",), lambda r: r["alignment_nmi_unambiguous"] >= 0.9),
    "ρ_recon ≤ 0.3": (("baseline_normalized_reconstruction_loss",),
                      lambda r: r["baseline_normalized_reconstruction_loss"] <= 0.3),
    "KL within 20% of I(z;y|x)": (("kl_prior_loss", "bayes_rate"),
                                  lambda r: abs(r["kl_prior_loss"] / r["bayes_rate"] - 1) <= 0.2),
    "task correct ≥ base − 0.01": (("task_correctness", "base_task_correctness"),
                                   lambda r: r["task_correctness"] >= r["base_task_correctness"] - 0.01)}
#: judged only where the runs carry a z-free control's gain (``zfree_lab.experiment.gains``)
GAIN_TARGET = ("z gain > 0 (95% interval)", (("z_gain_lo",), lambda r: r["z_gain_lo"] > 0))


def switch_on_targets(aided: pd.DataFrame, threshold: float = USE_THRESHOLD, synthetic: bool = True) -> pd.DataFrame:
    """Per aided run (``aided_runs`` rows of ``SweepResults.runs``): where theory predicts use
    (predicted_use_fraction > ``threshold``), each of ``SWITCH_ON_TARGETS`` met or not (True/False,
    NaN only where a number that target reads is missing, e.g. NMI without strategy labels, while
    rho is still judged); where it predicts no use, whether z ended unused (measured_use_fraction
    <= ``threshold``). Columns: run, predicted, the targets, "z unused", all met. Targets of issue
    15: NMI (m = 1) >= 0.9, rho_recon <= 0.3, KL within 20% of the analytic I(z; y | x)
    (``bayes_rate``, docs/concepts/problem.md#benchmark) and task correctness within 1 point of the base
    model's; plus, where ``aided`` has ``z_gain_lo`` (a control's gain), ``GAIN_TARGET``.
    ``synthetic=False`` (real data: targets are judged on z's rate and gain, never on rho against the
    step-0 base): use measured and ``GAIN_TARGET``, the verdict's rule (``zfree_lab.report.gains_report``).
    Raises KeyError naming a missing column."""
    need = ("weighting", "beta", "predicted_use_fraction", "measured_use_fraction", "alignment_nmi_unambiguous",
            "baseline_normalized_reconstruction_loss", "kl_prior_loss", "bayes_rate", "task_correctness",
            "base_task_correctness")
    for c in need:
        if c not in aided:
            raise KeyError(f"switch_on_targets: runs have no column {c!r}")
    measured = {"use measured": (("measured_use_fraction",), lambda r: r["measured_use_fraction"] > threshold)}
    targets = {**(SWITCH_ON_TARGETS if synthetic else measured), **(dict([GAIN_TARGET]) if "z_gain_lo" in aided else {})}
    rows = []
    for _, r in aided.iterrows():
        use = r["predicted_use_fraction"] > threshold
        row = {"run": run_label(r, aided), "predicted": "use" if use else "no use"}
        for name, (cols, test) in targets.items():  # NaN where this target's own numbers are missing
            row[name] = bool(test(r)) if use and not any(pd.isna(r[c]) for c in cols) else np.nan
        row["z unused"] = np.nan if use else bool(r["measured_use_fraction"] <= threshold)
        checks = [row[n] for n in targets] if use else [row["z unused"]]
        row["all met"] = np.nan if any(pd.isna(c) for c in checks) else all(checks)
        rows.append(row)
    return pd.DataFrame(rows, columns=["run", "predicted", *targets, "z unused", "all met"])


def checkmarks(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` (e.g. ``switch_on_targets``) with True/False shown as ✓/✗ and NaN as – (for display)."""
    def mark(v):
        if isinstance(v, (bool, np.bool_)):
            return "✓" if v else "✗"
        return "–" if v is None or (isinstance(v, float) and np.isnan(v)) else v

    return table.apply(lambda c: c.map(mark))


def gate_traces(aided: pd.DataFrame, runs: pd.DataFrame | None = None) -> pd.DataFrame:
    """The hand-over gate of every aided run, from its summary.json ``aid/gate`` list: columns
    label, run_id, step, ratio = best-z objective / collapsed objective (below 1 the soft
    objective prefers z). Runs without a gate record are left out. ``aided`` needs run_dir."""
    parts = []
    for _, r in aided.iterrows():
        gate = read_json(Path(r["run_dir"]) / "summary.json").get("aid/gate") or []
        if gate:
            g = pd.DataFrame(gate)
            label = (f"{run_label(r, runs)} K={r.get('n_latent')} {r.get('posterior_features')} "
                     f"({str(r['run_id'])[-8:]})")
            parts.append(pd.DataFrame({"label": label, "run_id": r["run_id"], "step": g["step"],
                                       "ratio": g["best_objective"] / g["collapsed_objective"]}))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["label", "run_id", "step", "ratio"])


def confusion_tables(aided: pd.DataFrame, runs: pd.DataFrame | None = None) -> list[tuple[str, pd.DataFrame]]:
    """(title as markdown, table) per aided run whose per_example.parquet names every row's strategy: counts of
    the posterior's argmax latent value against the strategy on the rows where one strategy fits
    (m = 1; ``zfree.evaluate.latent_stats.confusion``)."""
    out = []
    for _, r in aided.iterrows():
        pe = read_table(Path(r["run_dir"]) / "per_example.parquet")
        if "n_consistent" in pe and pe["strategy"].notna().all():
            out.append((f"{md_text(run_label(r, runs))} ({md_code(r['run_id'])})", confusion(pe)))
    return out


def reference_markdown(ref: dict | None) -> str:
    """One line on the study's reference (``load_sweep``): c_base (nats per token), against the analytic
    Bayes-optimal c_base where the benchmark has one; a prefix route's is named so; its ``note`` shown."""
    if ref is None:
        return "**No reference found** (no base/reference nor the runs' base_dir)."
    head = ("**Reference (prefix route: the base reading the soft token s_0, scored in each run folder).**"
            if ref.get("route") == "prefix" else "**Reference (entangled run).**" if ref.get("c_base_analytic")
            else "**Reference.**")
    ana = ref.get("c_base_analytic")
    return (f"{head} c_base = {ref['c_base']:.4f} nats/token" + (f" on {ref['n_rows']} validation rows; analytic "
            f"(Bayes-optimal) c_base = {ana:.4f}; ratio {ref['c_base'] / ana:.3f}" if ana else "") + "."
            + (f" Note: {md_text(ref['note'])}." if ref.get("note") else ""))


def errors_markdown(errors: list[dict], width: int = 300, finished: int | None = None) -> str:
    """The failed runs (error.json records: run_id, error) as a markdown list, each error cut to ``width``
    characters, as text (``md_text``: a traceback's ``----`` is no heading); none: one line, ``finished`` counted."""
    if not errors:
        return "No run failed" + (f" ({finished} finished)." if finished is not None else ".")
    return "\n".join(f"- {md_code(e.get('run_id'))}: {md_text(str(e.get('error'))[:width])}" for e in errors)


def training_metrics(sweep, run_ids: str = "", max_runs: int = 8) -> dict[str, pd.DataFrame]:
    """label -> metrics.jsonl (as a DataFrame) for the runs named in ``run_ids`` (comma-separated)
    or else the first ``max_runs`` runs; ``sweep``: a ``zfree_lab.experiment.results.SweepResults``.
    Raises KeyError naming an unknown run id."""
    chosen = [r.strip() for r in run_ids.split(",") if r.strip()] or list(sweep.runs["run_id"][:max_runs])
    known = set(sweep.runs["run_id"])
    for r in chosen:
        if r not in known:
            raise KeyError(f"run_ids: {r!r} is not a finished run of {sweep.sweep_dir}")
    rows = sweep.runs.set_index("run_id").loc[chosen].reset_index()
    return {f"{run_label(r, sweep.runs)} ({r['run_id'][-8:]})": sweep.metrics(r["run_id"]) for _, r in rows.iterrows()}


BOUNDARY_COLUMNS = {"n_betas": "β values", "plateau_rate": "plateau rate", "predicted_plateau_rate": "predicted plateau",
                    "beta_half_measured": "β½ measured", "beta_half_predicted": "β½ predicted",
                    "ratio": "measured / predicted", "within": "within ±25%", "note": "note"}


def boundary_table(boundary: pd.DataFrame, digits: int = 3) -> pd.DataFrame:
    """``SweepResults.phase_boundary`` with short headers (``BOUNDARY_COLUMNS``), indexed by its
    facets (weighting, latent kind, aid), floats rounded to ``digits`` decimals."""
    keys = [c for c in FACETS if c in boundary]
    t = boundary.set_index(keys)
    return t[[c for c in BOUNDARY_COLUMNS if c in t]].rename(columns=BOUNDARY_COLUMNS).round(digits)
