"""The report's "Remedies leaderboard" section: the method
line, the ranked table (each value as mean [lo, hi] over seeds) and the winners in words, from the
rows of ``leaderboard.csv`` (``zfree_lab.experiment.leaderboard.leaderboard``). The figure is
``zfree_lab.report.plotting_study.plot_leaderboard``. Units: z gain and rate in nats per example;
intervals are the 95 % percentile bootstrap of the mean over seeds (``seed_interval``).
"""

from __future__ import annotations

import pandas as pd

from zfree_lab.experiment.leaderboard import DATASET, HIDDEN_AXES, INSIDE, N_BOOT, winners
from zfree_lab.report.report import md_text


def _mean_ci(m, lo, hi) -> str:
    if pd.isna(m):
        return "–"
    return f"{m:.3g}" + ("" if pd.isna(lo) or pd.isna(hi) else f" [{lo:.3g}, {hi:.3g}]")


def _ratio(v) -> str:
    return "–" if pd.isna(v) else f"{v:.2f}×"


def _count(v) -> str:
    """A token count in k / M (1500 -> "1.5k")."""
    if pd.isna(v):
        return "–"
    return next((f"{v / s:.3g}{u}" for s, u in ((1e9, "G"), (1e6, "M"), (1e3, "k")) if abs(v) >= s), f"{v:.3g}")


def leaderboard_table(board: pd.DataFrame) -> pd.DataFrame:
    """The ranked table of ``board`` (its rows in order), indexed by (side, rank): remedy, weighting, β (and the
    data set, latent kind, aid and hidden axes where they vary), seeds, then "mean [lo, hi]" of z
    gain, rate, alignment NMI (with the label it is against) and task correctness, the share of
    seeds that used z, and the compute: mean forward tokens and wall seconds with their ratios to
    the reference cell (``compute_ref``). Metric columns with no value in any cell are left out; a
    key column is shown only where it varies inside one remedy (one a remedy sets is its name's)."""
    keys = [DATASET] if DATASET in board and board[DATASET].nunique() > 1 else []
    keys += ["side", "rank", "remedy", "weighting", "beta"]
    # a field a remedy sets itself (switch_on's aid, gaussian's latent kind) is named by the remedy
    keys += [c for c in ("latent_kind", "aid", *HIDDEN_AXES) if c in board and c != "steps" and c not in keys
             and (board.groupby("remedy")[c].nunique(dropna=False) > 1).any()]
    t = board[keys].rename(columns={"beta": "β", "latent_kind": "latent kind"}).copy()
    t["rank"] = [("–" if pd.isna(r) else f"{int(r)}") for r in board["rank"]]
    t["seeds"] = board["n_seeds"].astype(int).to_numpy()
    cols = {"z_gain": "z gain [nats/ex]", "rate": "rate KL [nats/ex]", "alignment_nmi": "alignment NMI",
            "task_correctness": "task correct"}
    for c, name in cols.items():
        if board[c].notna().any():
            t[name] = [_mean_ci(r[c], r[f"{c}_lo"], r[f"{c}_hi"]) for _, r in board.iterrows()]
    if board["alignment_nmi"].notna().any():
        t["NMI against"] = board["alignment_label"].fillna("").to_numpy()
    if board["z_used_share"].notna().any():
        t["z used (seeds)"] = ["–" if pd.isna(s) else f"{round(s * n)}/{n}"
                               for s, n in zip(board["z_used_share"], board["n_seeds"].astype(int))]
    t["forward tokens"] = [_count(v) for v in board["forward_tokens"]]
    t["tokens ×"] = [_ratio(v) for v in board["forward_tokens_ratio"]]
    t["wall s"] = ["–" if pd.isna(v) else f"{v:.3g}" for v in board["train_wall_s"]]
    t["wall ×"] = [_ratio(v) for v in board["train_wall_ratio"]]
    t["× against"] = board["compute_ref"].fillna("").to_numpy()
    return t.set_index(["side", "rank"])


def method_markdown(board: pd.DataFrame) -> str:
    """The method line above the table: cells, seeds, the interval method (and that it is coarse at
    3 seeds), equal steps and batch (or which steps differ), compute in forward tokens and wall
    time, the side rule and the ranking."""
    n = sorted({int(v) for v in board["n_seeds"]})
    seeds = sorted({s for v in board["seeds"].astype(str) for s in v.split()}, key=lambda s: (len(s), s))
    steps = pd.to_numeric(board.get("steps", pd.Series(dtype=float)), errors="coerce").dropna()
    steps = sorted({int(v) for v in steps})
    equal = (f"Every run trains {steps[0]} steps at the study's batch size (equal steps and batch)" if len(steps) == 1
             else f"⚠ the cells train different step counts ({', '.join(map(str, steps))}): compare their compute "
                  "columns" if steps else "Steps unknown")
    coarse = "; coarse at 3 seeds: it cannot leave the range of the seeds" if min(n) <= 3 else ""
    return (f"**Method.** {len(board)} cells (remedy × weighting × β), each over "
            f"{md_text(' or '.join(map(str, n)))} seed(s) (seeds {md_text(', '.join(seeds))}), each seed with its own z-free control. Each value is the "
            f"mean over seeds with its 95 % percentile bootstrap interval over seeds (scipy.stats.bootstrap, "
            f"{N_BOOT} resamples{coarse}); one seed gives no interval. {equal}; "
            "compute is measured, not assumed: forward tokens (token positions through the decoder body, the "
            "aggressive encoder's inner passes and every extra pass included) and train wall time, with their "
            "ratio (×) to the plain 'none' cell at the same weighting and β, or to the cell's z-free control where "
            f"the study has no 'none' cell. Side: inside the predicted boundary where theory's predicted use "
            f"fraction (β_eff < 1 + |S|·excess / Bayes NLL: theory at η = 1) exceeds {INSIDE:g}; rank: by mean z gain within each side.")


def winner_markdown(board: pd.DataFrame) -> str:
    """The winners in words (``zfree_lab.experiment.leaderboard.winners``), one escaped bullet per data
    set and side, under a bold lead; "" for an empty board."""
    lines = winners(board)
    return "\n".join(["**Winners** (highest mean z gain per side):", "", *(f"- {md_text(w)}" for w in lines)]) \
        if lines else ""

