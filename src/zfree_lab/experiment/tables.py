"""A study's tables, written by one function: ``aggregate`` writes runs.parquet, runs.csv,
per_example.parquet and, through ``write_summary_csv`` (the one writer of summary.csv), summary.csv
with the gain columns (gains.csv and available_gain.csv beside it where the study trained z-free
controls), multiref.csv where runs decoded multi-reference outputs, and leaderboard.csv for a
study with seeds or several remedies. A study calls it once, after its grid
(``zfree_lab.experiment.pipeline``); ``zfree report`` calls it before rendering."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from zfree.core.io import atomic_write_parquet, atomic_write_text
from zfree_lab.experiment.leaderboard import write_leaderboard
from zfree_lab.experiment.multiref_table import write_multiref_csv
from zfree_lab.experiment.results import per_example_table, runs_table, study_summary
from zfree_lab.experiment.seed_stats import write_seed_gains


def write_summary_csv(out: Path | str) -> pd.DataFrame:
    """``out/summary.csv``, one row per finished CVAE run: ``zfree_lab.experiment.results.study_summary``
    (on labelled data the study's notes and label warnings, the gains against the z-free controls).
    Also multiref.csv and leaderboard.csv (module docstring). Returns the table."""
    out = Path(out)
    tab = study_summary(out)
    atomic_write_text(out / "summary.csv", tab.to_csv(index=False))
    write_multiref_csv(out)
    write_leaderboard(out, tab)
    write_seed_gains(out, tab)
    return tab


def aggregate(sweep_dir: Path | str) -> dict[str, Path]:
    """Write the sweep's tidy tables: ``runs.parquet`` and ``runs.csv`` (``runs_table``),
    ``per_example.parquet`` (``per_example_table``), ``summary.csv`` (the study's columns, one row per
    run) and, for a study with seeds or several remedies, ``leaderboard.csv``
    (``zfree_lab.experiment.leaderboard.write_leaderboard``)."""
    d = Path(sweep_dir)
    runs = runs_table(d)
    out = {"runs.parquet": d / "runs.parquet", "runs.csv": d / "runs.csv",
           "per_example.parquet": d / "per_example.parquet", "summary.csv": d / "summary.csv"}
    atomic_write_parquet(out["runs.parquet"], runs.astype({c: str for c in runs.columns if runs[c].dtype == object}))
    atomic_write_text(out["runs.csv"], runs.to_csv(index=False))
    atomic_write_parquet(out["per_example.parquet"], per_example_table(runs))
    write_summary_csv(d)
    board = d / "leaderboard.csv"
    return out | ({"leaderboard.csv": board} if board.exists() else {})
