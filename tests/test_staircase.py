"""The staircase by |S| over seeds (zfree_lab.experiment.staircase) and Holm's adjustment
(zfree_lab.experiment.seed_stats.holm_adjusted), against numpy/scipy closed forms and a study folder built
by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from zfree_lab.experiment.seed_stats import holm_adjusted
from zfree_lab.experiment.staircase import (STAIRCASE_ROWS_FILE, staircase_slope, staircase_table,
                                        use_by_length_rows, use_by_length_table)


def test_staircase_slope_is_least_squares():
    rng = np.random.default_rng(0)
    x = rng.integers(5, 14, 300)
    y = (rng.random(300) < np.clip(1.6 - 0.1 * x, 0, 1)).astype(float)
    assert staircase_slope(x, y) == pytest.approx(stats.linregress(x, y).slope, rel=1e-12)
    assert staircase_slope(x, 0.3 + 0 * x) == pytest.approx(0.0)  # flat use: no staircase
    assert np.isnan(staircase_slope([7, 7, 7], [1, 0, 1]))  # one length: no slope
    with pytest.raises(ValueError, match="shape"):
        staircase_slope([5, 6], [1.0])


def test_holm_against_the_step_down_by_hand():
    p = [0.01, 0.04, 0.03, 0.20]
    # sorted 0.01, 0.03, 0.04, 0.20 -> 4*0.01, 3*0.03, 2*0.04, 1*0.20, then non-decreasing
    assert holm_adjusted(p) == pytest.approx([0.04, 0.09, 0.09, 0.20])
    assert holm_adjusted([0.6, 0.5]) == pytest.approx([1.0, 1.0])  # capped at 1
    a = holm_adjusted([0.02, np.nan])  # a test that had no t still counts in the family
    assert a[0] == pytest.approx(0.04) and np.isnan(a[1])
    assert holm_adjusted([0.03]) == pytest.approx([0.03])


def _rows(slopes_by_cell: dict[str, list[float]], n: int = 270) -> pd.DataFrame:
    """Per cell and seed, rows at |S| 5..13 whose use falls with length at the given (noise-free) slope."""
    parts = []
    for cell, slopes in slopes_by_cell.items():
        for seed, s in enumerate(slopes):
            x = np.repeat(np.arange(5, 14), n // 9)
            use = np.clip(0.5 + s * (x - 9), 0, 1)
            parts.append(pd.DataFrame({"id": [f"r{i}" for i in range(len(x))], "n_tokens": x, "measured_use": use,
                                       "predicted_use": (x <= 9).astype(float), "kl": use, "bayes_nll": 1.39,
                                       "weighting": cell, "seed": seed, "run_id": f"{cell}_{seed}"}))
    return pd.concat(parts, ignore_index=True)


def test_staircase_table_tests_the_negative_slope_over_seeds():
    rows = _rows({"example": [-0.08, -0.10, -0.06], "plain": [0.0, 0.0, 0.0]})
    tab = staircase_table(rows, ["weighting"]).set_index("weighting")
    ex = tab.loc["example"]
    assert ex["n_seeds"] == 3 and ex["seeds"] == "0 1 2"
    assert ex["slope"] == pytest.approx(-0.08)
    want = stats.ttest_1samp([-0.08, -0.10, -0.06], 0.0, alternative="less")
    assert ex["slope_p_negative"] == pytest.approx(want.pvalue, rel=1e-9)
    lo, hi = stats.t.interval(0.95, 2, loc=-0.08, scale=stats.sem([-0.08, -0.10, -0.06]))
    assert (ex["slope_t_lo"], ex["slope_t_hi"]) == pytest.approx((lo, hi))
    # the predicted use is 1 up to |S| = 9 and 0 after: its least-squares slope
    x = rows.loc[rows["run_id"] == "example_0", "n_tokens"]
    assert ex["predicted_slope"] == pytest.approx(staircase_slope(x, (x <= 9).astype(float)))
    assert np.isnan(tab.loc["plain", "slope_p_negative"])  # no spread: no t, H0 not rejected


def test_use_by_length_table_averages_seed_fractions():
    rows = _rows({"example": [-0.1, -0.1]})
    t = use_by_length_table(rows, ["weighting"])
    assert list(t["n_tokens"]) == list(range(5, 14)) and (t["n_seeds"] == 2).all()
    at5 = t.set_index("n_tokens").loc[5]
    assert at5["measured_use"] == pytest.approx(0.9) and at5["predicted_use"] == 1.0 and at5["measured_use_sd"] == 0
    assert at5["rows"] == 30


def test_use_by_length_rows_reads_each_runs_per_example_table(tmp_path):
    summary = pd.DataFrame({"run_id": ["a", "b", "c"], "weighting": ["example", "example", "plain"],
                            "beta": [0.5, 0.5, 0.03], "seed": [0, 1, 0], "kl_prior_loss": [1.0, 1.0, 0.0],
                            "control_run_id": ["ca", "cb", "cc"]})
    for rid, seed in (("a", 0), ("b", 1)):
        d = tmp_path / "runs" / rid
        d.mkdir(parents=True)
        pd.DataFrame({"id": ["r1", "r2"], "n_tokens": [5, 12], "measured_use": [True, False],
                      "predicted_use": [True, False], "kl": [1.3, 0.0], "bayes_nll": [1.39, 1.39],
                      "lbar": [0.1, 0.2]}).to_parquet(d / "per_example.parquet")
    (tmp_path / "runs" / "c").mkdir(parents=True)  # a run without its table is left out
    rows, key = use_by_length_rows(tmp_path, summary)
    assert "weighting" in key and "beta" in key
    assert set(rows["run_id"]) == {"a", "b"} and len(rows) == 4
    assert rows["measured_use"].dtype == float and list(rows.loc[rows.run_id == "a", "measured_use"]) == [1.0, 0.0]
    assert set(rows.columns) >= {"id", "n_tokens", "measured_use", "predicted_use", "kl", "bayes_nll", "seed"}
    assert not any(str(tmp_path) in str(v) for v in rows.astype(str).to_numpy().ravel())  # no machine path
    assert STAIRCASE_ROWS_FILE.endswith(".parquet")
