"""A study's ``multiref.csv``: per run with a ``multiref.parquet`` (a discrete
CVAE or a label oracle on real text), its pairwise-BLEU and #references covered over its K greedy
outputs per MR (``zfree.evaluate.multiref``), and its z-free control's values beside them over the
control's first K *samples* for the same MRs (the control has K = 1: one greedy y per MR has no
diversity to measure, so it is compared through K draws at temperature 1). Written where
summary.csv is (``zfree_lab.experiment.tables.write_summary_csv``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from zfree.core.io import atomic_write_text
from zfree.evaluate.multiref import multiref_metrics
from zfree_lab.run.multiref_run import MULTIREF_FILE, outputs_and_references
from zfree_lab.experiment.gains import links_of
from zfree_lab.experiment.results import collect_runs

MULTIREF_CSV = "multiref.csv"
MULTIREF_CSV_COLUMNS = ["run_id", "latent_source", "weighting", "beta", "aid", "k", "pairwise_bleu", "refs_covered",
                        "n_mrs", "control_id", "control_pairwise_bleu", "control_refs_covered", "control_n_mrs"]
#: the multi-reference metrics of a run and of its control (``multiref/<name>`` of ``multiref_metrics``)
_METRICS = ("pairwise_bleu", "refs_covered", "n_mrs")


def scored(table: pd.DataFrame, k: int | None = None, ids=None) -> dict[str, float]:
    """``multiref_metrics`` of one run's ``multiref.parquet`` table: the first ``k`` outputs of each
    MR (all when None), on the MRs in ``ids`` only when given (a run and its control on the same
    MRs). NaN values (and n_mrs 0) when an MR has fewer than ``k`` outputs or no MR is left."""
    t = table if ids is None else table[table["id"].isin(set(ids))]
    outs, refs = outputs_and_references(t, k)
    if not outs or (k is not None and min(len(o) for o in outs) < k):
        return {"multiref/pairwise_bleu": np.nan, "multiref/refs_covered": np.nan, "multiref/n_mrs": 0.0}
    return multiref_metrics(outs, refs)


def _control_of(run_id: str, links: dict) -> str | None:
    """The control linked to a CVAE run or a label oracle in ``controls.json`` (``links_of``)."""
    return links["controls"].get(run_id) or links["oracles"].get(run_id, {}).get("control")


def multiref_table(study_dir: Path | str) -> pd.DataFrame:
    """One row per finished run of ``study_dir/runs`` with a ``multiref.parquet`` and K >= 2
    outputs per MR (columns ``MULTIREF_CSV_COLUMNS``; k = its outputs per MR): its scores, and its
    control's (``controls.json``) over the control's first k samples on the MRs both decoded (NaN
    without a linked control, its parquet or k samples). Empty (with the columns) when no run has one."""
    d = Path(study_dir)
    links = links_of(d)
    runs = collect_runs(d / "runs", kind="all")
    rows = []
    for r in runs.to_dict("records") if not runs.empty else []:
        path = Path(r["run_dir"]) / MULTIREF_FILE
        if not path.exists():
            continue
        tab = pd.read_parquet(path)
        k = int(tab.groupby("id").size().min()) if len(tab) else 0
        if tab.empty or (tab["kind"] != "greedy").any() or k < 2:
            continue  # a control (sampled outputs) is a column beside its runs, not a row
        own = scored(tab)
        cid = _control_of(r["run_id"], links)
        cpath = d / "runs" / str(cid) / MULTIREF_FILE
        ctrl = scored(pd.read_parquet(cpath), k, ids=tab["id"]) if cid and cpath.exists() else {}
        rows.append({"run_id": r["run_id"], "latent_source": r.get("latent_source", "posterior"),
                     "weighting": r.get("weighting"), "beta": r.get("beta"), "aid": r.get("aid", "none"), "k": k,
                     **{m: own[f"multiref/{m}"] for m in _METRICS}, "control_id": cid,
                     **{f"control_{m}": ctrl.get(f"multiref/{m}", np.nan) for m in _METRICS}})
    return pd.DataFrame(rows, columns=MULTIREF_CSV_COLUMNS)


def write_multiref_csv(study_dir: Path | str) -> pd.DataFrame | None:
    """``study_dir/multiref.csv`` (``multiref_table``) when some run has multi-reference outputs;
    returns the table, or None (nothing written) when none has."""
    tab = multiref_table(study_dir)
    if tab.empty:
        return None
    atomic_write_text(Path(study_dir) / MULTIREF_CSV, tab.to_csv(index=False))
    return tab
