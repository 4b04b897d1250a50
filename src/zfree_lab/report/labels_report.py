"""The labels section of a real-data report: per-label alignment, Hungarian and probe
accuracies beside the majority-class baseline they must beat, the study's notes, the multi-reference evidence (``multiref.csv``) and the samples each
latent value writes, at full length.

Functions take ``zfree_lab.experiment.results.collect_runs`` rows (with ``run_dir``) and return
DataFrames or escaped markdown (``md_text``); tested on hand-made run folders.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from zfree_lab.report.report import md_code, md_text, run_table

LABEL_METRICS = ("alignment_nmi", "hungarian_accuracy", "probe_accuracy")
#: below this many evaluated rows (or with one value) a label metric is flagged in the table
MIN_ROWS = 50


def majority_baselines(run_dir: Path | str) -> dict[str, tuple[float, int, int]]:
    """label -> (share of its most common value, rows carrying it, distinct values) over the rows a
    run evaluated (``label/<key>`` columns of its per_example.parquet): the accuracy a constant
    guess gets, which a probe or a Hungarian matching must beat to mean anything. Empty when the
    run has no per-example table or no label column."""
    f = Path(run_dir) / "per_example.parquet"
    if not f.exists():
        return {}
    pe = pd.read_parquet(f)
    out = {}
    for c in (c for c in pe.columns if c.startswith("label/")):
        v = pe[c].dropna()
        if len(v):
            out[c.split("/", 1)[1]] = (float(v.value_counts(normalize=True).iloc[0]), len(v), int(v.nunique()))
    return out


def label_metric_of(column: str) -> tuple[str, str] | None:
    """``(metric, label key)`` of a per-label column ``structure/<metric>/<label key>`` whose metric is
    one of ``LABEL_METRICS``, else None. Parsed structurally: a label key may hold any character JSON
    allows, slashes included (``a/b``, ``../../x``); the metric names hold none."""
    head, _, rest = column.partition("/")
    metric, sep, key = rest.partition("/")
    return (metric, key) if head == "structure" and sep and key and metric in LABEL_METRICS else None


def label_table(summary: pd.DataFrame, digits: int = 3, min_rows: int = MIN_ROWS) -> pd.DataFrame:
    """Per run (``run_label``), every ``structure/<metric>/<label>`` column of ``summary`` as
    ``<label> <metric>`` (grouped by label) next to rho_recon, the rate ("KL [nats]", per sequence, as the report's run tables name it) and measured/predicted
    use; with ``run_dir``, each label's majority-class share (``<label> majority``, the baseline of
    the accuracies) and a ``warning`` column naming labels on fewer than ``min_rows`` rows or one value."""
    base = {"loss/val/baseline_normalized_reconstruction_loss": "ρ_recon", "loss/val/kl_prior_loss": "KL [nats]",
            "latent/measured_use_fraction": "measured use", "latent/predicted_use_fraction": "predicted use"}
    parsed = {c: label_metric_of(c) for c in summary.columns}
    lab = {c: f"{p[1]} {p[0].replace('_', ' ')}" for c, p in parsed.items() if p is not None}
    t = run_table(summary, {**base, **dict(sorted(lab.items(), key=lambda kv: kv[1]))}, digits)  # grouped by label
    if "run_dir" not in summary:
        return t
    maj = [majority_baselines(d) for d in summary["run_dir"]]
    for key in sorted({k for m in maj for k in m}):
        col = [round(m[key][0], digits) if key in m else float("nan") for m in maj]
        at = [i for i, c in enumerate(t.columns) if c.startswith(f"{key} ")]  # after the label's own metrics
        t.insert(at[-1] + 1 if at else len(t.columns), f"{key} majority", col)
    warn = ["; ".join(f"{k}: {n} rows" if n < min_rows else f"{k}: one value" for k, (_, n, nv) in sorted(m.items())
                      if n < min_rows or nv < 2) for m in maj]
    if any(warn):
        t["warning"] = warn
    return t


def notes_markdown(notes: list[str]) -> str:
    """The study's visible notes (labels absent, no task correctness, shared x) as a markdown list,
    each note shown as text (``md_text``: ``structure/<metric>/<label>`` is no HTML tag)."""
    return "**Notes**\n\n" + "\n".join(f"- {md_text(n)}" for n in notes) if notes else "**Notes**: none."


def samples_table(run_dir, max_chars: int | None = None) -> pd.DataFrame:
    """A run's ``samples.parquet`` as a table: per validation x (index: x, latent value) the greedy and
    the sampled y side by side, at full length (``max_chars``: cut there, with "…"); empty when the
    run wrote none. On unconditional data (every x empty) the index is the latent value alone: an x
    column of empty cells says nothing. Show it with ``samples_view`` (left-aligned, line breaks kept,
    never cut at pandas' 50 characters)."""
    p = Path(run_dir) / "samples.parquet"
    if not p.exists():
        return pd.DataFrame(columns=["greedy", "sampled"])
    s = pd.read_parquet(p)
    if max_chars is not None:
        cut = lambda t: t if len(t) <= max_chars else t[: max_chars - 1] + "…"  # noqa: E731
        s = s.assign(x=s["x"].map(cut), greedy=s["greedy"].map(cut), sampled=s["sampled"].map(cut))
    index = ["latent"] if s["x"].fillna("").astype(str).str.strip().eq("").all() else ["x", "latent"]
    return s.set_index(index)[["greedy", "sampled"]]


#: how ``samples_view`` draws a cell of text: from the left, its line breaks kept (pandas' own HTML wrote a
#: newline as the two characters "\n"), long lines wrapped
TEXT_CELL = {"text-align": "left", "white-space": "pre-wrap", "vertical-align": "top"}


def samples_view(table: pd.DataFrame):
    """``table`` (``samples_table``) as the report shows it: a ``pandas`` Styler whose cells read as
    text (``TEXT_CELL``: left-aligned, a newline drawn as a line break) at full length, every value
    from data escaped as HTML (a sample's "<b>" is the characters it is)."""
    return (table.style.format(escape="html").format_index(escape="html", axis=0)
            .set_properties(**TEXT_CELL)
            .set_table_styles([{"selector": "th", "props": [("text-align", "left"), ("vertical-align", "top")]}]))


#: multiref.csv columns shown, when present (written by ``zfree_lab.experiment.multiref_table``), -> header
MULTIREF_COLUMNS = {"run_id": "run", "pairwise_bleu": "pairwise BLEU among z values", "refs_covered": "references covered",
                    "n_mrs": "MRs", "k": "outputs per MR", "control_id": "control",
                    "control_pairwise_bleu": "control pairwise BLEU", "control_refs_covered": "control references covered",
                    "control_n_mrs": "control MRs"}
#: a confusion with more label values than this is drawn as a heatmap (``plot_label_confusion``),
#: not a table: 44 values ran off the page and pandas cut them to "…"
MAX_TABLE_VALUES = 12


def confusion_is_wide(table: pd.DataFrame, max_values: int = MAX_TABLE_VALUES) -> bool:
    """True when a latent value × label value confusion (``label_confusion``) has more than
    ``max_values`` label values (its columns): draw it, do not tabulate it."""
    return table.shape[1] > max_values


def dashes(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` for display with every missing value (NaN, None) shown as "–" (the other values as
    they are); a note beside the table says what "–" means."""
    return table.astype(object).where(table.notna(), "–")


def multiref_note(table: pd.DataFrame) -> str:
    """Why a row of ``multiref_table`` has no control values ("–"): no control linked, the control drew
    fewer samples per MR (``MULTIREF_SAMPLES``) than the run has outputs (a label oracle with many
    values), or the control's outputs are missing. "" when every row has them."""
    from zfree.evaluate.multiref import MULTIREF_SAMPLES  # lazy: the metric's module, only for its constant

    col = "control pairwise BLEU"
    if col not in table:
        return ""
    why = []
    for _, r in table[table[col].isna()].iterrows():
        k, ctrl = r.get("outputs per MR"), r.get("control")
        if ctrl is None or pd.isna(ctrl):
            reason = "no z-free control is linked to it"
        elif not pd.isna(k) and k > MULTIREF_SAMPLES:
            reason = (f"its control draws {MULTIREF_SAMPLES} samples per MR, fewer than its {int(k)} outputs per MR, "
                      "so they are not compared")
        else:
            reason = "its control's outputs are missing (not finished or not decoded)"
        why.append(f"{md_code(r.get('run'))}: {reason}")
    return ("*– in the control columns: " + "; ".join(why) + ".*") if why else ""


def multiple_references(study_dir: Path | str) -> bool:
    """Whether the study's data has multiple references, the premise of the multi-reference section:
    conditional data (``notes.json``'s ``conditioning``; unconditional rows share one empty x, which
    is no meaning representation) with some x of two or more rows among the validation rows (the
    study folder's ``val.jsonl``, else that of a run's ``data_dir``). True where it cannot tell."""
    import json

    d = Path(study_dir)
    notes = d / "notes.json"
    try:
        if notes.exists() and json.loads(notes.read_text()).get("conditioning") == "unconditional":
            return False
        val = d / "val.jsonl"
        if not val.exists():
            cfg = next(iter(sorted((d / "runs").glob("*/config.json"))), None)
            if cfg is None:
                return True
            val = Path(json.loads(cfg.read_text())["data_dir"]) / "val.jsonl"
        seen: set[str] = set()
        with open(val, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    x = json.loads(line).get("x") or ""
                    if x in seen:
                        return True
                    seen.add(x)
        return False
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return True


def multiref_table(study_dir: Path | str, digits: int = 3) -> pd.DataFrame | None:
    """The study's ``multiref.csv`` (per run: pairwise BLEU among the latent values' outputs per
    MR, the references covered, the MRs), its known columns first and renamed
    (``MULTIREF_COLUMNS``), any other column kept; None when the file is absent or unreadable."""
    f = Path(study_dir) / "multiref.csv"
    if not f.exists():
        return None
    try:
        t = pd.read_csv(f)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError):
        return None
    known = [c for c in MULTIREF_COLUMNS if c in t]
    t = t[known + [c for c in t.columns if c not in known]].rename(columns=MULTIREF_COLUMNS)
    return t.round(digits)
