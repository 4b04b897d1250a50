"""The staircase by |S| over seeds: does measured use follow the length ordering theory predicts?

Under a ragged-length weighting each example has its own beta_eff = beta |S| / w (``zfree.objective.
theory``): plain beta |S|, distribution beta |S| c_base, example beta |S| (b + eps). Near a weighting's
boundary theory predicts use on some rows and not on others, ordered by |S| (on the synthetic benchmark
short rows first, for distribution and example weighting alike). ``zfree_lab.experiment.results.
SweepResults.use_by_length`` tabulates one run; this module reads a study's runs at several seeds and
tests the ordering with seeds as the replicates (as ``zfree_lab.experiment.seed_stats`` does for the gains):

- per run, the staircase slope: the ordinary least-squares slope of the per-row measured use (0/1,
  ``zfree.evaluate.use.measured_use``) on |S| over its evaluated rows (use fraction per token of |S|),
  and the same slope of the rows' ``predicted_use``;
- per cell, the mean slope over seeds with its two-sided t-interval and the one-sided p of
  H0: slope >= 0 (the prediction is a negative slope), ``zfree_lab.experiment.seed_stats.t_interval``.

The per-row table (``use_by_length_rows``, shipped as ``STAIRCASE_ROWS_FILE``: no machine path) holds
every number the two tables are computed from.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from zfree.core.io import read_table
from zfree_lab.experiment.seed_stats import t_interval

#: the per-row table of a study's staircase (``use_by_length_rows``)
STAIRCASE_ROWS_FILE = "staircase_rows.parquet"
#: the per-row columns read from a run's ``per_example.parquet``
ROW_COLUMNS = ("id", "n_tokens", "measured_use", "predicted_use", "kl", "bayes_nll")


def use_by_length_rows(study_dir: Path | str, summary: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """One row per (CVAE run, evaluated row) of the study: the cell key (``zfree_lab.experiment.leaderboard.
    cell_key``), ``seed``, ``run_id`` and ``ROW_COLUMNS`` (measured and predicted use as 0/1 floats, KL
    and the Bayes rate in nats); and the key's columns. ``summary``: summary.csv's rows. Runs whose
    per-example table lacks measured or predicted use are left out; empty when none has them."""
    from zfree_lab.experiment.leaderboard import _prepared, cell_key

    s = _prepared(summary)
    if s.empty:
        return pd.DataFrame(columns=[*ROW_COLUMNS, "seed", "run_id"]), []
    key = cell_key(s)
    parts = []
    for _, r in s.iterrows():
        f = Path(study_dir) / "runs" / r["run_id"] / "per_example.parquet"
        if not f.is_file():
            continue
        pe = read_table(f)
        if not {"measured_use", "predicted_use", "n_tokens"} <= set(pe):
            continue
        pe = pe.assign(**{c: np.nan for c in ROW_COLUMNS if c not in pe})[list(ROW_COLUMNS)]
        pe = pe.astype({"measured_use": float, "predicted_use": float, "n_tokens": int})
        parts.append(pe.assign(**{k: r[k] for k in key}, seed=int(r["seed"]), run_id=r["run_id"]))
    if not parts:
        return pd.DataFrame(columns=[*ROW_COLUMNS, "seed", "run_id"]), key
    return pd.concat(parts, ignore_index=True), key


def staircase_slope(n_tokens, use) -> float:
    """The ordinary least-squares slope of ``use`` (one value per row, e.g. 0/1) on ``n_tokens`` (|S|),
    per token: cov(|S|, use) / var(|S|). NaN with fewer than two distinct lengths (no slope)."""
    x, y = np.asarray(n_tokens, float), np.asarray(use, float)
    if x.shape != y.shape:
        raise ValueError(f"n_tokens has shape {x.shape}, use {y.shape}")
    if len(np.unique(x)) < 2:
        return float("nan")
    xc = x - x.mean()
    return float((xc * (y - y.mean())).sum() / (xc * xc).sum())


def staircase_table(rows: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    """One row per cell of ``rows`` (``use_by_length_rows``): the key, ``n_seeds``, ``seeds``, the measured
    and predicted use fractions (means over seeds), ``slope`` (mean over seeds of the runs' staircase
    slopes) with ``slope_t_lo``/``slope_t_hi`` (two-sided 95 % t-interval over seeds), ``slope_p_negative``
    (one-sided p of H0: slope >= 0), ``predicted_slope`` (mean over seeds) and the per-seed slopes as text.
    Fewer than 2 seeds, or slopes without spread: the interval and p are NaN."""
    out = []
    for k, g in rows.groupby(key, dropna=False, sort=False):
        row = dict(zip(key, k if isinstance(k, tuple) else (k,)))
        by_seed = [gs for _, gs in g.groupby("seed", sort=True)]
        slopes = [staircase_slope(gs["n_tokens"], gs["measured_use"]) for gs in by_seed]
        pred = [staircase_slope(gs["n_tokens"], gs["predicted_use"]) for gs in by_seed]
        t, neg = t_interval(slopes), t_interval([-x for x in slopes])
        row.update(n_seeds=len(by_seed), seeds=" ".join(str(int(gs["seed"].iloc[0])) for gs in by_seed),
                   measured_use=float(np.mean([gs["measured_use"].mean() for gs in by_seed])),
                   predicted_use=float(np.mean([gs["predicted_use"].mean() for gs in by_seed])),
                   slope=t["mean"], slope_t_lo=t["lo"], slope_t_hi=t["hi"], slope_p_negative=neg["p"],
                   predicted_slope=float(np.nanmean(pred)) if np.isfinite(pred).any() else float("nan"),
                   slope_per_seed=" ".join(f"{x:.4f}" for x in slopes))
        out.append(row)
    return pd.DataFrame(out)


def use_by_length_table(rows: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    """One row per (cell, |S|): ``n_seeds``, ``rows`` (evaluated rows of that length, per seed on average),
    ``measured_use`` and ``predicted_use`` (means over seeds of each seed's fraction at that length),
    ``measured_use_sd`` (their standard deviation over seeds; NaN at one seed) and ``kl`` (mean nats)."""
    per_seed = (rows.groupby([*key, "n_tokens", "seed"], dropna=False, sort=True)
                .agg(measured_use=("measured_use", "mean"), predicted_use=("predicted_use", "mean"),
                     kl=("kl", "mean"), rows=("measured_use", "size")).reset_index())
    return (per_seed.groupby([*key, "n_tokens"], dropna=False, sort=False)
            .agg(n_seeds=("seed", "nunique"), rows=("rows", "mean"), measured_use=("measured_use", "mean"),
                 measured_use_sd=("measured_use", "std"), predicted_use=("predicted_use", "mean"),
                 kl=("kl", "mean")).reset_index())
