"""The preregistered e2e-smollm2 3-seed study (PREREGISTRATION.md here): its tables, without machine paths,
and the decisions its rules give.

    .venv/bin/python analysis/results/e2e-smollm2-seeds/collect.py STUDY_DIR   # after `zfree report STUDY_DIR`
    .venv/bin/python analysis/results/e2e-smollm2-seeds/collect.py --markdown  # the README's table

Copies the study's gains.csv, available_gain.csv, seed_gains.csv and seed_rows.parquet (the per-row paired
table of the aided runs against their controls), writes runs.csv (each run's settings), oracle_rows.parquet
(per seed and evaluated row: the oracle's Delta R = D_control - D_oracle and its net D_control - marginal
NLL) and decisions.json: what ``decide`` computes from the two per-row tables and runs.csv alone, so
``tests/test_shipped_results.py`` recomputes it from the shipped files.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

HERE = Path(__file__).parent
ALPHA = 0.05
#: the TOST margin of H_net, nats per example (preregistered)
MARGIN = 0.25
#: per-seed floor of within-model use for H_use, nats per example, and the least codes used (preregistered)
USE_FLOOR, MIN_CODES = 0.01, 2
SETTINGS = ["run_id", "seed", "weighting", "beta", "aid", "steps", "lr_new", "n_latent", "posterior_features",
            "codes_used", "mutual_information", "kl_prior_loss", "control_run_id"]


def one_sided(values) -> dict:
    """mean, two-sided 95 % t-interval over seeds and the one-sided p of H0: mean <= 0 (NaN below 2 seeds)."""
    v = np.asarray(values, float)
    out = {"n_seeds": len(v), "mean": float(v.mean()) if len(v) else np.nan, "lo": np.nan, "hi": np.nan,
           "p": np.nan, "per_seed": [round(float(x), 6) for x in v]}
    if len(v) >= 2 and v.std(ddof=1) > 0:
        se = v.std(ddof=1) / np.sqrt(len(v))
        half = stats.t.ppf(1 - ALPHA / 2, len(v) - 1) * se
        out.update(lo=float(v.mean() - half), hi=float(v.mean() + half),
                   p=float(stats.t.sf(v.mean() / se, len(v) - 1)))
    return out


def tost(values, margin: float = MARGIN) -> float:
    """TOST p of |mean| < margin (Schuirmann 1987): the larger of the two one-sided t-tests' p."""
    v = np.asarray(values, float)
    if len(v) < 2 or v.std(ddof=1) == 0:
        return float("nan")
    se = v.std(ddof=1) / np.sqrt(len(v))
    return float(max(stats.t.sf((v.mean() + margin) / se, len(v) - 1),
                     stats.t.cdf((v.mean() - margin) / se, len(v) - 1)))


def two_stage(rows: pd.DataFrame, column: str) -> list[float]:
    """The preregistered check beside each t-interval: the 95 % two-stage bootstrap (seeds drawn with
    replacement, then rows within each drawn seed; ``zfree_lab.experiment.seed_stats.two_stage_bootstrap``,
    its fixed seed 0), [lo, hi] in nats per example; NaN below 2 seeds."""
    from zfree_lab.experiment.seed_stats import two_stage_bootstrap

    lo, hi = two_stage_bootstrap([g[column].to_numpy() for _, g in rows.groupby("seed")])
    return [lo, hi]


def decide(seed_rows: pd.DataFrame, oracle_rows: pd.DataFrame, runs: pd.DataFrame) -> dict:
    """The preregistered tests: per seed the paired mean over the evaluated rows, then over seeds."""
    per_seed = seed_rows.groupby("seed")[["z_gain", "net_gain", "use_shuffled", "gain_minus_rate"]].mean()
    gain, net, use = (one_sided(per_seed[c]) for c in ("z_gain", "net_gain", "use_shuffled"))
    net["tost_p"] = tost(per_seed["net_gain"])
    codes = runs.set_index("run_id")["codes_used"]
    codes_per_seed = [int(codes[r]) for r in seed_rows.groupby("seed")["run_id"].first()]
    n = len(per_seed)
    out = {"seeds": [int(s) for s in per_seed.index], "finished": n == 3}
    out["H_gain"] = {**gain, "decision": ("lowers D against its control" if gain["p"] < ALPHA
                                          else "not shown at 3 seeds") if n == 3 else "not finished"}
    if n < 3:
        verdict = "not finished"
    elif net["p"] < ALPHA:
        verdict = "better than its control"
    elif net["tost_p"] < ALPHA:
        verdict = f"as good as its control within +/-{MARGIN}"
    else:
        verdict = "undecided at 3 seeds"
    out["H_net"] = {**net, "decision": verdict}
    floor_ok = bool(all(u >= USE_FLOOR for u in use["per_seed"]) and all(c >= MIN_CODES for c in codes_per_seed))
    for h, col in (("H_gain", "z_gain"), ("H_net", "net_gain")):
        out[h]["two_stage_95"] = two_stage(seed_rows, col)
    out["H_use"] = {**use, "codes_used_per_seed": codes_per_seed, "per_seed_floor_met": floor_ok,
                    "two_stage_95": two_stage(seed_rows, "use_shuffled"),
                    "decision": ("z switched on inside the model" if use["p"] < ALPHA and floor_ok
                                 else "not shown at 3 seeds") if n == 3 else "not finished"}
    if len(oracle_rows):
        by = oracle_rows.groupby("seed")[["delta_R", "oracle_net"]].mean()
        out["oracle"] = {q: {**one_sided(by[q]), "two_stage_95": two_stage(oracle_rows, q)}
                         for q in ("delta_R", "oracle_net")}
    return out


ROWS = [("H_gain", None, "z gain D_control − D_q"), ("H_net", None, "net gain D_control − marginal NLL"),
        ("H_use", None, "within-model use D_shuffled − D_q"), ("oracle", "delta_R", "oracle ΔR D_control − D_oracle"),
        ("oracle", "oracle_net", "oracle net D_control − its marginal NLL")]


def markdown(decisions: dict) -> str:
    """The README's table from ``decisions.json``: per quantity the seeds' values, mean, t-interval, one-sided
    p, the two-stage bootstrap check and the preregistered verdict (nats per example, 3 decimals, "−" the minus
    sign as the README prints it)."""
    def f(x):
        return "n/a" if x is None or (isinstance(x, float) and not np.isfinite(x)) else f"{x:.3f}".replace("-", "−")

    lines = ["| quantity | per seed | mean | 95 % t-interval over seeds | one-sided p (H0: ≤ 0) | two-stage bootstrap "
             "95 % | decision |", "|---|---|---|---|---|---|---|"]
    for key, sub, name in ROWS:
        d = decisions.get(key, {})
        d = d.get(sub, {}) if sub else d
        if not d:
            continue
        per = ", ".join(f(v) for v in d["per_seed"])
        p = "n/a" if d.get("p") is None else f"{d['p']:.3g}"
        ts = d.get("two_stage_95") or [None, None]
        lines.append(f"| {name} | {per} | {f(d['mean'])} | [{f(d['lo'])}, {f(d['hi'])}] | {p} | "
                     f"[{f(ts[0])}, {f(ts[1])}] | {d.get('decision', 'read, not tested')} |")
    return "\n".join(lines)


def _seed(run_dir: Path) -> int:
    return int(json.loads((run_dir / "config.json").read_text(encoding="utf-8"))["seed"])


def _oracle_rows(study: Path, available: pd.DataFrame) -> pd.DataFrame:
    from zfree_lab.experiment.gains import _paired, _per_example

    parts = []
    for r in available.itertuples():
        po, pc = _paired(_per_example(str(study / "runs" / r.oracle_run_id)),
                         _per_example(str(study / "runs" / r.control_run_id)))
        parts.append(pd.DataFrame({"id": po.index, "seed": _seed(study / "runs" / r.oracle_run_id), "label": r.label,
                                   "oracle_run_id": r.oracle_run_id, "control_run_id": r.control_run_id,
                                   "delta_R": pc["D"].to_numpy() - po["D"].to_numpy(),
                                   "oracle_net": pc["D"].to_numpy() - po["marginal_nll"].to_numpy()}))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _nan_to_null(obj):
    """Strict JSON: a NaN (fewer than two seeds, or no spread) is written as null."""
    if isinstance(obj, dict):
        return {k: _nan_to_null(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_nan_to_null(v) for v in obj]
    return None if isinstance(obj, float) and not np.isfinite(obj) else obj


def main(study: Path, dest: Path = HERE) -> dict:
    gains = pd.read_csv(study / "gains.csv")
    gains.drop(columns=[c for c in gains if c.endswith("_dir")]).to_csv(dest / "gains.csv", index=False)
    available = pd.read_csv(study / "available_gain.csv")
    available.drop(columns=[c for c in available if c.endswith("_dir")]).to_csv(dest / "available_gain.csv",
                                                                              index=False)
    pd.read_csv(study / "seed_gains.csv").to_csv(dest / "seed_gains.csv", index=False)
    seed_rows = pd.read_parquet(study / "seed_rows.parquet")
    seed_rows.to_parquet(dest / "seed_rows.parquet", index=False)
    summary = pd.read_csv(study / "summary.csv")
    runs = summary[[c for c in SETTINGS if c in summary]]
    runs.to_csv(dest / "runs.csv", index=False)
    oracle = _oracle_rows(study, available)
    oracle.to_parquet(dest / "oracle_rows.parquet", index=False)
    decisions = decide(seed_rows, oracle, runs)
    (dest / "decisions.json").write_text(json.dumps(_nan_to_null(decisions), indent=1, allow_nan=False) + "\n",
                                         encoding="utf-8")
    return decisions


if __name__ == "__main__":
    if sys.argv[1:2] == ["--markdown"]:  # the README's table from a written decisions.json
        path = Path(sys.argv[2]) if len(sys.argv) > 2 else HERE / "decisions.json"
        print(markdown(json.loads(path.read_text(encoding="utf-8"))))
    else:
        print(json.dumps(_nan_to_null(main(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else HERE)),
                         indent=1))
