"""Seeds as the unit of evidence: the seed-level paired analysis of a study's gains.

A study run at several seeds (``seeds:`` in a spec, ``zfree study --seeds 0-2``) trains every CVAE
run, its z-free control and each oracle once per seed; a seed moves all arms of a cell together
(they draw the same batches), so the contrast is paired within a seed and the seeds are the
replicates. Per cell (``zfree_lab.experiment.leaderboard.cell_key``) and quantity (z gain, net gain,
within-model use, gain - rate; ``zfree_lab.experiment.gains``):

- per seed, the paired mean over the evaluated rows (the run against its own seed's control);
- their mean and the two-sided 95 % t-interval over seeds (Student 1908), with the one-sided
  p-value of H0: mean <= 0 and, for the net gain, the TOST p-value of equivalence within
  +/- ``TOST_MARGIN`` nats/example (Schuirmann 1987: the larger of the two one-sided t-tests' p);
- as a check, the 95 % percentile interval of a two-stage bootstrap (seeds resampled, then rows
  within each drawn seed, the arms of a row kept paired; Davison & Hinkley 1997, section 3.8).

One seed gives no interval over seeds: its columns are NaN and ``n_seeds`` = 1, which the report
prints as "1 seed". The row bootstrap of ``zfree_lab.experiment.gains.interval`` stays the within-seed
interval and is named so wherever it appears.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from zfree.core.io import atomic_write_text

SEED_GAINS_FILE = "seed_gains.csv"
#: the per-row paired table seed_gains.csv is computed from (``paired_rows``), written beside it
SEED_ROWS_FILE = "seed_rows.parquet"
CONFIDENCE = 0.95
N_BOOT = 2000
#: the equivalence margin of the net gain's TOST, nats per example
TOST_MARGIN = 0.25
#: quantity -> (the run's per-row column pair it is the mean of): gain = control - run, etc.
QUANTITIES = ("z_gain", "net_gain", "use_shuffled", "gain_minus_rate")


def t_interval(values, confidence: float = CONFIDENCE) -> dict[str, float]:
    """mean, two-sided ``confidence`` t-interval (lo, hi), the one-sided p of H0: mean <= 0, the t
    statistic and n over ``values`` (one per seed; NaN entries dropped). Fewer than 2 values or zero
    spread: the interval and p are NaN (a constant has no t)."""
    v = np.asarray(values, float)
    v = v[np.isfinite(v)]
    n = len(v)
    out = {"mean": float(v.mean()) if n else np.nan, "lo": np.nan, "hi": np.nan, "p": np.nan, "t": np.nan, "n": n}
    if n < 2 or float(v.std(ddof=1)) == 0.0:
        return out
    se = float(v.std(ddof=1)) / np.sqrt(n)
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * se
    t = out["mean"] / se
    out.update(lo=out["mean"] - half, hi=out["mean"] + half, t=t, p=float(stats.t.sf(t, n - 1)))
    return out


def tost_p(values, margin: float = TOST_MARGIN) -> float:
    """The TOST p-value that the mean of ``values`` lies within (-margin, +margin): the larger of the
    one-sided t-tests of H0: mean <= -margin and H0: mean >= +margin. NaN below 2 values."""
    v = np.asarray(values, float)
    v = v[np.isfinite(v)]
    if len(v) < 2 or float(v.std(ddof=1)) == 0.0:
        return np.nan
    se = float(v.std(ddof=1)) / np.sqrt(len(v))
    lower = stats.t.sf((v.mean() + margin) / se, len(v) - 1)
    upper = stats.t.cdf((v.mean() - margin) / se, len(v) - 1)
    return float(max(lower, upper))


def holm_adjusted(pvalues) -> np.ndarray:
    """Holm's step-down adjusted p-values of a family of tests (Holm 1979): sorted ascending, the i-th
    (from 0) of m is multiplied by m - i, made non-decreasing and capped at 1; returned in the input
    order. A hypothesis is rejected at level alpha iff its adjusted p < alpha. NaN entries (a test with no
    t) stay NaN and count in m (they are tests of the family that could not reject)."""
    p = np.asarray(pvalues, float)
    m = len(p)
    out = np.full(m, np.nan)
    finite = np.flatnonzero(np.isfinite(p))
    order = finite[np.argsort(p[finite], kind="stable")]
    running = 0.0
    for i, j in enumerate(order):
        running = max(running, min(1.0, (m - i) * p[j]))
        out[j] = running
    return out


def two_stage_bootstrap(row_values: list[np.ndarray], n_boot: int = N_BOOT, seed: int = 0,
                        confidence: float = CONFIDENCE) -> tuple[float, float]:
    """(lo, hi): the percentile interval of the mean over seeds of the per-seed row means, seeds drawn
    with replacement and then rows within each drawn seed. ``row_values``: one array of paired per-row
    differences per seed. NaN below 2 seeds."""
    arrays = [np.asarray(a, float) for a in row_values if len(a)]
    if len(arrays) < 2:
        return np.nan, np.nan
    rng = np.random.default_rng(seed)
    n = len(arrays)
    means = np.empty(n_boot)
    for i in range(n_boot):
        picks = rng.integers(n, size=n)
        means[i] = np.mean([arrays[j][rng.integers(len(arrays[j]), size=len(arrays[j]))].mean() for j in picks])
    a = (1 - confidence) / 2
    return float(np.quantile(means, a)), float(np.quantile(means, 1 - a))


def _row_values(study_dir: Path, run_id: str, control_id: str) -> pd.DataFrame:
    """Per evaluated row (index id), the paired differences behind each of ``QUANTITIES`` (module docstring)."""
    from zfree_lab.experiment.gains import _paired, _per_example

    runs = Path(study_dir) / "runs"
    pr, pc = _paired(_per_example(str(runs / run_id)), _per_example(str(runs / control_id)))
    D, Dc = pr["D"].to_numpy(), pc["D"].to_numpy()
    return pd.DataFrame({"z_gain": Dc - D, "net_gain": Dc - pr["marginal_nll"].to_numpy(),
                         "use_shuffled": pr["d_shuffled"].to_numpy() - D,
                         "gain_minus_rate": Dc - D - pr["kl"].to_numpy(float)}, index=pr.index.rename("id"))


def paired_rows(study_dir: Path | str, summary: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The long per-row table the seed-level analysis reads (and a study ships as ``SEED_ROWS_FILE``: no
    machine path): one row per (CVAE run, evaluated row) with the cell key, seed, run and control ids and
    the paired per-row differences of ``QUANTITIES``; and the cell key's columns. Empty without controls."""
    from zfree_lab.experiment.leaderboard import _prepared, cell_key

    s = _prepared(summary)
    if s.empty or "control_run_id" not in s or s["control_run_id"].isna().all():
        return pd.DataFrame(), []
    s = s[s["control_run_id"].notna()]
    key = cell_key(s)
    parts = [_row_values(Path(study_dir), r["run_id"], r["control_run_id"]).reset_index().assign(
        **{k: r[k] for k in key}, seed=int(r["seed"]), run_id=r["run_id"], control_run_id=r["control_run_id"])
        for _, r in s.iterrows()]
    return pd.concat(parts, ignore_index=True), key


def seed_gains_from_rows(rows: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    """One row per cell of ``rows`` (``paired_rows``): the key, ``n_seeds``, ``seeds``, and per quantity its
    mean over seeds with the t-interval (``<q>_t_lo``, ``<q>_t_hi``), one-sided p (``<q>_p``), the two-stage
    bootstrap interval (``<q>_boot_lo``, ``<q>_boot_hi``) and the per-seed values; ``net_gain_tost_p``."""
    out = []
    for k, g in rows.groupby(key, dropna=False, sort=False):
        row = dict(zip(key, k if isinstance(k, tuple) else (k,)))
        by_seed = [(seed, gs) for seed, gs in g.groupby("seed", sort=True)]
        row.update(n_seeds=len(by_seed), seeds=" ".join(str(int(x)) for x, _ in by_seed),
                   run_ids=" ".join(gs["run_id"].iloc[0] for _, gs in by_seed))
        for q in QUANTITIES:
            per_seed = [float(gs[q].mean()) for _, gs in by_seed]
            t = t_interval(per_seed)
            lo, hi = two_stage_bootstrap([gs[q].to_numpy() for _, gs in by_seed if np.isfinite(gs[q]).all()])
            row.update({q: t["mean"], f"{q}_t_lo": t["lo"], f"{q}_t_hi": t["hi"], f"{q}_p": t["p"],
                        f"{q}_boot_lo": lo, f"{q}_boot_hi": hi, f"{q}_per_seed": " ".join(f"{x:.4f}" for x in per_seed)})
        row["net_gain_tost_p"] = tost_p([float(gs["net_gain"].mean()) for _, gs in by_seed])
        out.append(row)
    return pd.DataFrame(out)


def seed_gains_table(study_dir: Path | str, summary: pd.DataFrame) -> pd.DataFrame:
    """``seed_gains_from_rows`` of the study's ``paired_rows`` (``summary``: summary.csv's rows with the
    gain columns). Empty without controls."""
    rows, key = paired_rows(study_dir, summary)
    return seed_gains_from_rows(rows, key) if len(rows) else pd.DataFrame()


def seeds_text(n_seeds: int) -> str:
    """"1 seed" / "3 seeds": how every number over seeds says its evidence."""
    return f"{int(n_seeds)} seed" + ("" if int(n_seeds) == 1 else "s")


def write_seed_gains(study_dir: Path | str, summary: pd.DataFrame) -> pd.DataFrame:
    """``study_dir/seed_gains.csv`` (``seed_gains_from_rows``) and the per-row table it is computed from,
    ``seed_rows.parquet`` (``paired_rows``), written when the study has controls; returns the table."""
    from zfree.core.io import atomic_write_parquet

    rows, key = paired_rows(study_dir, summary)
    if not len(rows):
        return pd.DataFrame()
    tab = seed_gains_from_rows(rows, key)
    atomic_write_parquet(Path(study_dir) / SEED_ROWS_FILE, rows)
    atomic_write_text(Path(study_dir) / SEED_GAINS_FILE, tab.to_csv(index=False))
    return tab
