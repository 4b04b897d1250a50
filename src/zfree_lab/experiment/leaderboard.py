"""The remedies leaderboard: every remedy of a study
(``zfree.objective.remedies``, the ``remedy`` column of summary.csv) and every weighting, averaged
over the seeds (``ExperimentSpec.seeds``; each seed has its own z-free control), with a 95 %
interval over the seeds, the compute each cell cost, and the side of theory's predicted boundary.

A cell is (data set where the table has a ``dataset`` column, remedy, weighting, beta, latent kind,
aid; plus any of ``HIDDEN_AXES`` that varies inside such a group, so runs differing in a field the
key does not name are never averaged). The rows of one cell are its seeds. Units: z gain
(D_control - D_run) and rate (mean KL) in nats per example; compute in forward tokens (token
positions through the decoder body, ``zfree_lab.run.compute``) and train wall seconds.

Intervals: the 95 % percentile bootstrap of the mean over seeds (``seed_interval``). These are
intervals over *seeds* (training randomness), not over evaluated rows as ``gains.interval``'s are;
with 3 seeds the percentile interval can only take a few values (it lies between the smallest and
the largest seed) and is coarse. Two remedies whose intervals overlap are reported as not
distinguishable at this many seeds; non-overlap is a reading, not a test.

summary.csv keeps one row per run (item 4): the board is a separate file, ``leaderboard.csv``,
written only for studies that have seeds or several remedies (``wants_leaderboard``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import bootstrap

from zfree.core.io import atomic_write_text, read_json
from zfree.objective.remedies import REMEDIES

N_BOOT = 2000
CONFIDENCE = 0.95
LEADERBOARD_FILE = "leaderboard.csv"
#: the optional column naming the data set of each row (a board over several studies' summaries)
DATASET = "dataset"
#: the cell key, besides the data set
CELL = ["remedy", "weighting", "beta", "latent_kind", "aid"]
#: config columns of summary.csv that join the key where they vary inside a cell (a grid axis)
HIDDEN_AXES = ["n_latent", "posterior_features", "lr_new", "steps"]
#: predicted_use_fraction above this: the cell lies inside the predicted boundary (z pays on most rows)
INSIDE = 0.5
SIDES = ("inside", "outside", "unknown")
#: the metrics averaged over seeds, each with _lo / _hi: board column -> summary column
METRICS = {"z_gain": "z_gain", "rate": "rate", "task_correctness": "task_correctness"}
NMI_PREFIX = "structure/alignment_nmi/"


def seed_interval(values, n_boot: int = N_BOOT, seed: int = 0) -> tuple[float, float, float]:
    """(mean, lo, hi): the mean over seeds of ``values`` ((n_seeds,), NaN entries dropped: a seed
    whose run or control did not finish) and its 95 % percentile bootstrap interval
    (``scipy.stats.bootstrap``, ``method="percentile"``, ``n_boot`` resamples, generator seeded
    with ``seed``; as ``zfree_lab.experiment.gains.interval`` does over rows). With 3 seeds the
    resampled means take at most 10 values, so the interval is coarse (it never leaves [min, max]).
    One value: lo = hi = NaN (no interval from one seed); no value: all three NaN."""
    v = np.asarray(values, float).ravel()
    v = v[np.isfinite(v)]
    if len(v) == 0:
        return float("nan"), float("nan"), float("nan")
    mean = float(v.mean())
    if len(v) == 1:
        return mean, float("nan"), float("nan")
    res = bootstrap((v,), np.mean, n_resamples=n_boot, confidence_level=CONFIDENCE, method="percentile",
                    random_state=np.random.default_rng(seed))
    return mean, float(res.confidence_interval.low), float(res.confidence_interval.high)


def _prepared(summary: pd.DataFrame) -> pd.DataFrame:
    """The CVAE rows of ``summary`` with the key's defaults filled (remedy/aid "none", latent kind
    "discrete", seed 0), ``rate`` falling back on ``kl_prior_loss`` and z_used as 0/1."""
    s = summary.copy()
    if "latent_source" in s:  # a table that still holds the given-z runs
        s = s[s["latent_source"].fillna("posterior") == "posterior"]
    if "control_run_id" in s and "run_id" in s:
        s = s[~s["run_id"].isin(set(s["control_run_id"].dropna()))]
    for c, v in (("remedy", "none"), ("aid", "none"), ("latent_kind", "discrete"), ("seed", 0)):
        s[c] = s[c].fillna(v) if c in s else v
    kl = pd.to_numeric(s.get("kl_prior_loss", np.nan), errors="coerce")
    s["rate"] = pd.to_numeric(s["rate"], errors="coerce").fillna(kl) if "rate" in s else kl
    s["z_used"] = (s["z_used"].map({True: 1.0, False: 0.0, "True": 1.0, "False": 0.0}) if "z_used" in s
                   else np.nan)
    for c in ("z_gain", "task_correctness", "alignment_nmi", "predicted_use_fraction", "forward_tokens",
              "train_wall_s", "beta"):
        s[c] = pd.to_numeric(s[c], errors="coerce") if c in s else np.nan
    return s.reset_index(drop=True)


def cell_key(summary: pd.DataFrame) -> list[str]:
    """The columns that name a cell of ``summary`` (module docstring): [dataset], ``CELL``, and the
    ``HIDDEN_AXES`` that vary inside a group of those."""
    base = ([DATASET] if DATASET in summary else []) + CELL
    s = summary.assign(**{c: summary[c] if c in summary else "none" for c in base})
    extra = [c for c in HIDDEN_AXES if c in s and (s.groupby(base, dropna=False)[c].nunique(dropna=False) > 1).any()]
    return base + extra


def wants_leaderboard(summary: pd.DataFrame) -> bool:
    """True when ``summary`` (summary.csv rows) has more than one remedy, or a cell run with more
    than one seed: the studies that get a leaderboard.csv. Every other study's outputs stay as they were."""
    s = _prepared(summary)
    if s.empty:
        return False
    return bool(s["remedy"].nunique() > 1 or (s.groupby(cell_key(s), dropna=False)["seed"].nunique() > 1).any())


def _best_nmi(g: pd.DataFrame) -> tuple[str, tuple[float, float, float]]:
    """(label, seed_interval) of the cell's alignment NMI: the strategy's (``alignment_nmi``, the
    synthetic benchmark) where any seed has one, else the ``structure/alignment_nmi/<label>``
    column with the highest mean over seeds (real text); ("", NaNs) without any."""
    if g["alignment_nmi"].notna().any():
        return "strategy", seed_interval(g["alignment_nmi"])
    means = {c: pd.to_numeric(g[c], errors="coerce").mean() for c in g.columns if c.startswith(NMI_PREFIX)}
    means = {c: m for c, m in means.items() if np.isfinite(m)}
    if not means:
        return "", (np.nan, np.nan, np.nan)
    best = max(means, key=means.get)
    return best.removeprefix(NMI_PREFIX), seed_interval(pd.to_numeric(g[best], errors="coerce"))


def _control_compute(study_dir: Path | None, s: pd.DataFrame) -> dict[str, tuple[float, float]]:
    """control run id -> (forward_tokens, train_wall_s) from its summary.json under ``study_dir/runs``."""
    out = {}
    if study_dir is None or "control_run_id" not in s:
        return out
    for cid in s["control_run_id"].dropna().unique():
        f = Path(study_dir) / "runs" / str(cid) / "summary.json"
        if f.exists():
            d = read_json(f)
            out[cid] = (float(d.get("compute/forward_tokens", np.nan) or np.nan),
                        float(d.get("compute/train_wall_s", np.nan) or np.nan))
    return out


def _seed_text(x) -> str:
    try:
        return f"{int(x)}" if float(x).is_integer() else f"{float(x):g}"
    except (TypeError, ValueError):
        return str(x)


def _remedy_order(name: str) -> tuple[int, str]:
    first = str(name).split("+")[0]
    return (REMEDIES.index(first) if first in REMEDIES else len(REMEDIES), str(name))


def leaderboard(summary: pd.DataFrame, study_dir: Path | str | None = None) -> pd.DataFrame:
    """One row per cell (``cell_key``) of the CVAE runs of ``summary`` (summary.csv rows; the
    z-free controls and label oracles are left out), over its seeds:

    - the key columns, ``n_seeds``, ``seeds`` (space-separated), ``steps`` (the cell's, NaN if mixed);
    - ``z_gain``, ``rate``, ``task_correctness`` and ``alignment_nmi``: mean over seeds with ``_lo`` /
      ``_hi`` (``seed_interval``); ``alignment_label`` names what the NMI is against ("strategy" on
      the synthetic benchmark, else the label whose ``structure/alignment_nmi/<label>`` has the
      highest mean in the cell);
    - ``z_used_share``: fraction of seeds with ``z_used`` (measured use and a z gain above 0);
    - ``predicted_use_fraction`` (mean) and ``side``: "inside" the predicted boundary where it
      exceeds ``INSIDE``, "outside" where not, "unknown" without one;
    - compute: mean ``forward_tokens`` and ``train_wall_s``, and their ratios of means
      (``forward_tokens_ratio``, ``train_wall_ratio``) to the reference cell named in
      ``compute_ref``: "none" (the plain remedy's cell at the same data set, weighting and beta,
      the same latent kind preferred) or, without one, "control" (the cell's z-free controls, read
      from ``study_dir/runs/<control>/summary.json``);
    - ``rank``: by mean z gain, descending, within each (data set, side) block (1 = best; NaN
      without a z gain). Rows sorted by data set, side, rank.
    """
    s = _prepared(summary)
    key = cell_key(s)
    ctrl = _control_compute(None if study_dir is None else Path(study_dir), s)
    rows = []
    for k, g in s.groupby(key, dropna=False, sort=False):
        row = dict(zip(key, k if isinstance(k, tuple) else (k,)))
        seeds = sorted(pd.unique(g["seed"]))
        row.update(n_seeds=len(g), seeds=" ".join(_seed_text(x) for x in seeds))
        st = pd.to_numeric(g["steps"], errors="coerce").unique() if "steps" in g else []
        row["steps"] = float(st[0]) if len(st) == 1 else np.nan
        for out, col in METRICS.items():
            row[out], row[f"{out}_lo"], row[f"{out}_hi"] = seed_interval(g[col])
        label, (m, lo, hi) = _best_nmi(g)
        row.update(alignment_nmi=m, alignment_nmi_lo=lo, alignment_nmi_hi=hi, alignment_label=label)
        row["z_used_share"] = float(g["z_used"].mean()) if g["z_used"].notna().any() else np.nan
        p = float(g["predicted_use_fraction"].mean())
        row.update(predicted_use_fraction=p, side="unknown" if not np.isfinite(p) else
                   ("inside" if p > INSIDE else "outside"))
        row.update(forward_tokens=float(g["forward_tokens"].mean()), train_wall_s=float(g["train_wall_s"].mean()))
        cids = g["control_run_id"].dropna() if "control_run_id" in g else pd.Series(dtype=object)
        cc = [ctrl[c] for c in cids if c in ctrl]
        row["_control"] = tuple(float(pd.Series([c[i] for c in cc], dtype=float).mean()) for i in (0, 1))
        rows.append(row)
    board = pd.DataFrame(rows)
    if board.empty:
        return board
    _compute_ratios(board)
    blocks = ([DATASET] if DATASET in board else []) + ["side"]
    board["rank"] = board.groupby(blocks)["z_gain"].rank(method="min", ascending=False)
    board["_side"] = board["side"].map(SIDES.index)
    board["_remedy"] = board["remedy"].map(_remedy_order)
    board = board.sort_values([*blocks[:-1], "_side", "rank", "_remedy", "weighting"], na_position="last")
    return board.drop(columns=["_side", "_remedy", "_control"]).reset_index(drop=True)


def _compute_ratios(board: pd.DataFrame) -> None:
    """forward_tokens_ratio, train_wall_ratio and compute_ref of every row of ``board`` (in place):
    against the "none" cell of the same data set, weighting and beta (the same latent kind
    preferred, then a discrete one), else against the cell's own controls."""
    same = ([DATASET] if DATASET in board else []) + ["weighting", "beta"]
    fr, wr, ref = [], [], []
    for _, r in board.iterrows():
        cand = board[(board["remedy"] == "none") & (board[same] == r[same]).all(axis=1)]
        if len(cand):
            pick = cand[cand["latent_kind"] == r["latent_kind"]]
            pick = pick if len(pick) else cand[cand["latent_kind"] == "discrete"]
            pick = pick if len(pick) else cand
            ft, wt, name = pick["forward_tokens"].mean(), pick["train_wall_s"].mean(), "none"
        else:
            (ft, wt), name = r["_control"], "control"
        fr.append(r["forward_tokens"] / ft if np.isfinite(ft) and ft > 0 else np.nan)
        wr.append(r["train_wall_s"] / wt if np.isfinite(wt) and wt > 0 else np.nan)
        ref.append(name if np.isfinite(ft) or np.isfinite(wt) else "")
    board["forward_tokens_ratio"], board["train_wall_ratio"], board["compute_ref"] = fr, wr, ref


def _ci(lo, hi) -> str:
    return "[–]" if pd.isna(lo) or pd.isna(hi) else f"[{lo:.3g}, {hi:.3g}]"


def _name(r: pd.Series) -> str:
    return f"{r['remedy']} ({r['weighting']} β={r['beta']:g})"


def _cost(r: pd.Series) -> str:
    if r.get("compute_ref", "") not in ("none", "control"):
        return f"{r['remedy']}'s compute is unknown (no forward-token count)"
    against = ("the plain 'none' cell at the same weighting and β" if r["compute_ref"] == "none"
               else "its z-free control")
    ratio = lambda v: "?" if pd.isna(v) else f"{v:.2f}×"  # noqa: E731
    return (f"{r['remedy']} costs {ratio(r['forward_tokens_ratio'])} the forward tokens and "
            f"{ratio(r['train_wall_ratio'])} the train wall time of {against}")


def winners(board: pd.DataFrame) -> list[str]:
    """One plain-text paragraph per (data set, side) block of ``board`` (``leaderboard`` rows): the
    remedy whose cell has the highest mean z gain, with its interval over seeds; for every other
    remedy (its best cell in the block) whether its interval overlaps the winner's ("... overlaps
    ...: not distinguishable at 3 seeds") or lies below it; and the winner's compute ratios. A block
    without any z gain (no z-free control) says so."""
    if board.empty:
        return []
    blocks = ([DATASET] if DATASET in board else []) + ["side"]
    out = []
    for k, g in board.groupby(blocks, sort=False):
        k = k if isinstance(k, tuple) else (k,)
        where = (f"{k[0]}, " if len(k) > 1 else "") + {"inside": "inside the predicted boundary",
                                                       "outside": "outside the predicted boundary",
                                                       "unknown": "no predicted boundary"}.get(k[-1], str(k[-1]))
        g = g[g["z_gain"].notna()].sort_values("z_gain", ascending=False)
        if g.empty:
            out.append(f"{where}: no z gain measured (no finished z-free control), so no winner.")
            continue
        w = g.iloc[0]
        n = int(w["n_seeds"])
        wci = _ci(w["z_gain_lo"], w["z_gain_hi"])
        parts = [f"{where}: {_name(w)} has the highest mean z gain, {w['z_gain']:.3g} {wci} nats/example over {n} "
                 f"seed{'s' if n != 1 else ''}"]
        for _, o in g[g["remedy"] != w["remedy"]].drop_duplicates("remedy").iterrows():
            ns = int(min(n, o["n_seeds"]))
            if pd.isna(o["z_gain_lo"]) or pd.isna(w["z_gain_lo"]):
                parts.append(f"{o['remedy']} ({o['z_gain']:.3g}) cannot be compared with {w['remedy']}: one seed, "
                             "no interval")
            elif o["z_gain_hi"] >= w["z_gain_lo"] and o["z_gain_lo"] <= w["z_gain_hi"]:
                parts.append(f"{o['remedy']}'s interval {_ci(o['z_gain_lo'], o['z_gain_hi'])} overlaps "
                             f"{w['remedy']}'s {wci}: not distinguishable at {ns} seeds")
            else:
                parts.append(f"{o['remedy']}'s interval {_ci(o['z_gain_lo'], o['z_gain_hi'])} lies below "
                             f"{w['remedy']}'s {wci}")
        parts.append(_cost(w))
        out.append("; ".join(parts) + ".")
    return out


def write_leaderboard(study_dir: Path | str, summary: pd.DataFrame | None = None) -> Path | None:
    """``study_dir/leaderboard.csv`` (``leaderboard`` of ``summary``, default: the folder's
    summary.csv), written atomically when ``wants_leaderboard``; returns its path, or None (and
    removes a stale one) for a study without seeds or remedies."""
    d = Path(study_dir)
    if summary is None:
        summary = pd.read_csv(d / "summary.csv") if (d / "summary.csv").exists() else pd.DataFrame()
    f = d / LEADERBOARD_FILE
    if not wants_leaderboard(summary):
        f.unlink(missing_ok=True)
        return None
    atomic_write_text(f, leaderboard(summary, d).to_csv(index=False))
    return f


def read_leaderboard(study_dir: Path | str) -> pd.DataFrame | None:
    """The folder's leaderboard.csv, or None where the study has none (``write_leaderboard``)."""
    f = Path(study_dir) / LEADERBOARD_FILE
    return pd.read_csv(f, keep_default_na=True) if f.exists() else None
