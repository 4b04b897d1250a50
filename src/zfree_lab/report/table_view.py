"""How the report shows a table that would scroll sideways: turned a quarter when it is wide and short."""

from __future__ import annotations

import pandas as pd


def turned_when_wide(table: pd.DataFrame, max_columns: int = 8, rows: str = "quantity") -> pd.DataFrame:
    """``table`` turned a quarter (its rows as columns, its columns as rows named ``rows``) when it has more
    than ``max_columns`` columns and no more rows than that, so that a table of a few labels and many
    quantities (``gains_report.available_gain_table`` with its null, flipped and net columns) reads down the
    page instead of scrolling sideways; else ``table`` itself. Cells are kept as they are (object dtype)."""
    if len(table.columns) > max_columns and len(table) <= max_columns:
        view = table.astype(object).T
        view.columns.name, view.index.name = table.index.name, rows
        return view
    return table
