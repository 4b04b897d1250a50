"""Copy a finished leaderboard-example study's tables here, without machine paths, and rebuild its headline
numbers from them (issue 58 item 3; preregistered in PREREGISTRATION.md).

    .venv/bin/python analysis/results/leaderboard-example/collect.py STUDY   # copy the tables, then print
    .venv/bin/python analysis/results/leaderboard-example/collect.py         # print from the shipped tables

Copies runs.csv (each run's settings and summary metrics), leaderboard.csv (the study's board, its intervals
the leaderboard's own), seed_rows.parquet and seed_gains.csv (the per-row
paired table and the seed-level gains, ``zfree_lab.experiment.seed_stats``) and writes staircase_rows.parquet
(per evaluated row of every CVAE run: |S|, measured and predicted use, KL; ``zfree_lab.experiment.staircase``).
``headline`` computes every number of the README from those files alone; ``tests/test_shipped_results.py``
calls it and checks the README against it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).parent
#: the settings and summary columns a reader needs beside each run's id
SETTINGS = ["run_id", "control_run_id", "weighting", "beta", "epsilon", "remedy", "aid", "seed", "steps", "batch_size",
            "lr_backbone", "lr_new", "n_latent", "posterior_features", "kl_prior_loss", "mutual_information",
            "codes_used", "alignment_nmi", "measured_use_fraction", "predicted_use_fraction", "beta_eff_median",
            "handover_step", "handover_forced", "train_wall_s"]
#: the preregistered arms: name -> (weighting, beta, aid)
ARMS = {"plain 0.03, unaided": ("plain", 0.03, "none"), "example 0.144, unaided": ("example", 0.144, "none"),
        "example 0.51, aided": ("example", 0.51, "hard_em_then_soft")}


def main(study: Path) -> None:
    from zfree_lab.experiment.staircase import use_by_length_rows

    summary = pd.read_csv(study / "summary.csv")
    summary[[c for c in SETTINGS if c in summary]].to_csv(HERE / "runs.csv", index=False)
    pd.read_csv(study / "seed_gains.csv").to_csv(HERE / "seed_gains.csv", index=False)
    pd.read_csv(study / "leaderboard.csv").to_csv(HERE / "leaderboard.csv", index=False)
    pd.read_parquet(study / "seed_rows.parquet").to_parquet(HERE / "seed_rows.parquet", index=False)
    rows, _ = use_by_length_rows(study, summary)
    # zstd: snappy's bytes of this table happen to hold a letter, a colon and a backslash in a row, which the
    # shipped-results test reads as a Windows path (tests/test_shipped_results.py, MACHINE_PATH)
    rows.to_parquet(HERE / "staircase_rows.parquet", index=False, compression="zstd")


def _arm(df: pd.DataFrame, arm: str) -> pd.DataFrame:
    w, beta, aid = ARMS[arm]
    return df[(df["weighting"] == w) & np.isclose(df["beta"].astype(float), beta) & (df["aid"] == aid)]


def headline(d: Path = HERE) -> dict[str, pd.DataFrame | dict]:
    """From the shipped tables of ``d``: ``arms`` (one row per arm: seeds, and per quantity the mean over
    seeds with its 95 % t-interval over seeds), ``h1`` (the preregistered contrast U(example 0.144) −
    U(plain 0.03), unaided: per-seed values, t-interval, one-sided p, the two-stage bootstrap check),
    ``staircase`` (``zfree_lab.experiment.staircase.staircase_table`` of every arm) and ``by_length`` (measured
    and predicted use per |S| and arm, means over seeds)."""
    from zfree_lab.experiment.seed_stats import t_interval, two_stage_bootstrap
    from zfree_lab.experiment.staircase import staircase_table, use_by_length_table

    rows, runs = pd.read_parquet(d / "seed_rows.parquet"), pd.read_csv(d / "runs.csv")
    stair = pd.read_parquet(d / "staircase_rows.parquet")
    arms = []
    for arm in ARMS:
        r, s, st = _arm(rows, arm), _arm(runs, arm), _arm(stair, arm)
        out = {"arm": arm, "n_seeds": int(s["seed"].nunique()), "seeds": " ".join(map(str, sorted(s["seed"])))}
        per_seed = {q: r.groupby("seed")[q].mean() for q in ("use_shuffled", "z_gain", "net_gain")}
        per_seed["rate"] = s.set_index("seed")["kl_prior_loss"]
        per_seed["measured_use"] = st.groupby("seed")["measured_use"].mean()
        per_seed["predicted_use"] = st.groupby("seed")["predicted_use"].mean()
        per_seed["codes_used"] = s.set_index("seed")["codes_used"]
        for q, v in per_seed.items():
            t = t_interval(v.sort_index().to_numpy(float))
            out.update({q: t["mean"], f"{q}_lo": t["lo"], f"{q}_hi": t["hi"]})
        arms.append(out)
    ex, pl = _arm(rows, "example 0.144, unaided"), _arm(rows, "plain 0.03, unaided")
    delta = (ex.groupby("seed")["use_shuffled"].mean() - pl.groupby("seed")["use_shuffled"].mean()).dropna()
    t = t_interval(delta.to_numpy(float))
    paired = [(ex[ex.seed == s].set_index("id")["use_shuffled"]
               - pl[pl.seed == s].set_index("id")["use_shuffled"]).dropna().to_numpy() for s in delta.index]
    boot = two_stage_bootstrap(paired)
    h1 = {"per_seed": delta.to_dict(), **t, "boot_lo": boot[0], "boot_hi": boot[1],
          "supported": bool(np.isfinite(t["p"]) and t["p"] < 0.05)}
    stair = stair.assign(arm=[next(a for a, (w, b, ai) in ARMS.items()
                                   if w == x.weighting and np.isclose(x.beta, b) and ai == x.aid)
                              for x in stair[["weighting", "beta", "aid"]].itertuples()])
    return {"arms": pd.DataFrame(arms), "h1": h1, "staircase": staircase_table(stair, ["arm"]),
            "by_length": use_by_length_table(stair, ["arm"])}


def _num(x: float, nd: int) -> str:
    """``x`` as the README writes it: ``nd`` decimals, a typographic minus (and no "−0.000")."""
    s = f"{x:.{nd}f}"
    return (s[1:] if s.startswith("-") and float(s) == 0 else s).replace("-", "−")


def _ci(x: float, lo: float, hi: float, nd: int) -> str:
    """``mean [lo, hi]``, or ``mean (no spread)`` where the seeds agree exactly (no t-interval)."""
    return f"{_num(x, nd)} [{_num(lo, nd)}, {_num(hi, nd)}]" if np.isfinite(lo) else f"{_num(x, nd)} (no spread)"


def _p(p: float) -> str:
    return _num(p, 3) if np.isfinite(p) else "none (no spread: no t)"


#: the arm table's columns: quantity -> (header, decimals)
COLUMNS = {"rate": ("rate (KL)", 4), "measured_use": ("measured use", 2), "predicted_use": ("predicted use", 2),
           "codes_used": ("codes used", 1), "use_shuffled": ("within-model use U", 4), "z_gain": ("z gain", 3),
           "net_gain": ("net gain", 3)}


def markdown(h: dict) -> list[str]:
    """The README's tables and test lines, each a line the README holds verbatim (the shipped-results test
    checks them): the arm table, the H1 line, the staircase lines and the use-by-|S| table of each arm that
    used z on some row."""
    out = ["| arm | seeds | " + " | ".join(v[0] for v in COLUMNS.values()) + " |",
           "|---|---|" + "---|" * len(COLUMNS)]
    for _, a in h["arms"].iterrows():
        cells = [_ci(a[q], a[f"{q}_lo"], a[f"{q}_hi"], nd) for q, (_, nd) in COLUMNS.items()]
        out.append(f"| {a['arm']} | {a['n_seeds']} ({a['seeds']}) | " + " | ".join(cells) + " |")
    t = h["h1"]
    per = ", ".join(_num(v, 5) for v in t["per_seed"].values())
    out.append(f"H1: Δ = U(example 0.144) − U(plain 0.03) = {_ci(t['mean'], t['lo'], t['hi'], 5)} nats/example over "
               f"{t['n']} seeds (per seed {per}); t = {_num(t['t'], 2)}, one-sided p = {_p(t['p'])}; two-stage "
               f"bootstrap [{_num(t['boot_lo'], 5)}, {_num(t['boot_hi'], 5)}]")
    for _, s in h["staircase"].iterrows():
        out.append(f"staircase, {s['arm']}: slope {_ci(s['slope'], s['slope_t_lo'], s['slope_t_hi'], 4)} use per token "
                   f"of |S| over {s['n_seeds']} seeds (per seed {', '.join(_num(float(x), 4) for x in s['slope_per_seed'].split())}), "
                   f"one-sided p (slope < 0) = {_p(s['slope_p_negative'])}; predicted {_num(s['predicted_slope'], 4)}")
    by = h["by_length"]
    for arm, g in by.groupby("arm", sort=False):
        if not g["measured_use"].any():  # an arm that used z on no row: the arm table says so
            continue
        out.append(f"| {arm}, by \\|S\\| | " + " | ".join(str(int(n)) for n in g["n_tokens"]) + " |")
        out.append("|---|" + "---|" * len(g))
        out.append("| measured | " + " | ".join(_num(x, 2) for x in g["measured_use"]) + " |")
        out.append("| predicted | " + " | ".join(_num(x, 2) for x in g["predicted_use"]) + " |")
        out.append("| rows per seed | " + " | ".join(f"{x:.0f}" for x in g["rows"]) + " |")
    return out


def _print(h: dict) -> None:
    print("\n".join(markdown(h)))


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    _print(headline())
