"""The preregistered factorial-smollm2 study (issue 58; PREREGISTRATION.md in this folder, committed before any
run): its per-row tables without machine paths, the preregistered tests and the decision, written before any
result of the study existed.

    .venv/bin/python analysis/results/factorial-smollm2/collect.py STUDY            # tables, decisions.json, table.md here
    .venv/bin/python analysis/results/factorial-smollm2/collect.py STUDY --out DIR  # elsewhere (the pretrained regime)

It reads the study folder itself, so a study still running gives a partial table (no ``zfree report`` needed):
``controls.json``'s links (``zfree_lab.experiment.gains.links_of``), ``notes.json``'s predicted boundaries (β* per
weighting, to name an arm's β factor) and setting (the regime), and per linked run ``config.json`` (seed,
weighting, β, aid), ``summary.json`` (MI, codes used, theory's predicted use) and ``per_example.parquet``. A run
counts once it and its control have written ``per_example.parquet``. It writes into ``--out``:

- ``rows.parquet``: per CVAE run and evaluated row, U = D_shuffled − D_q, G = D_control − D_q, N = D_control −
  marginal NLL (``zfree_lab.experiment.seed_stats._row_values``) and the row's KL, on the rows the run and its
  control both evaluated;
- ``oracle_rows.parquet``: per oracle run and row, D of the oracle, of its control and of its null (NaN until
  the null has finished);
- ``arm_seeds.csv``: per arm × seed the preregistered quantities (rate, MI, codes used, U, G, N, predicted use);
- ``arms.csv``: per arm, each quantity's mean over seeds with its t-interval and two-stage bootstrap interval;
- ``runs.csv``: every linked run (role, arm, seed, finished or not);
- ``decisions.json`` and ``table.md``: the tests and the decision, computed by ``decide`` from the tables alone.

The tests, as preregistered (α = 0.05, seeds the replicates, t over seeds, ``zfree_lab.experiment.seed_stats``):
H1-W (W ∈ {distribution, example}): U(W, none) − U(plain, none) per seed, one-sided t of H0: mean ≤ 0; H2-W (W ∈
{plain, distribution, example}): G(W, hard EM) per seed, one-sided t of H0: mean ≤ 0; Holm across the five, a
hypothesis supported iff its Holm-adjusted p < 0.05; H3 per aided arm: TOST of N within ±0.25 nats/example, beside
the one-sided t of N > 0, no correction; the theory check (distribution + aid at 3 β*: U and G with t-intervals);
the oracle's ΔR = D_control − D_oracle, ΔR_null = D_control − D_null, V = D_null − D_oracle (read); beside each
t-interval the two-stage bootstrap (seeds, then rows within seed); the mixed model (arm fixed, seed random
intercept) of H1 and H2 when statsmodels is installed, else reported as skipped.

Choices not specified in the preregistration; chosen before any result:

- The combined decision: "pending" while a seed, arm or control that H1 or H2 needs is missing; else "weightings"
  when an H1 is supported (which ones named), "aid" when no H1 is but an H2 is, "nothing" when none is (the
  preregistration's Publication: "what switches z on (the aid, or nothing)"). H3 and the theory check do not enter.
- H3's "each aided arm" includes the distribution + aid arm at 3 β* (four TOSTs).
- A contrast's bootstrap resamples, per seed, the rows both arms evaluated (their row values paired); its t uses
  the difference of the per-seed means, as preregistered.
- An arm's β factor is its β over the study's β* of its weighting (notes.json), named 1/3 or 3 within 1 %.
- Seeds 3-5, where any has run, get a second analysis at 6 seeds beside the one at 3 (both published).
- The mixed model: MixedLM (REML), U ~ arm (plain the reference) per H1 pair, G ~ 0 + arm over the aided arms for H2,
  its Wald z one-sided (normal, no small-sample degrees of freedom: a check beside the t, never a decision); a model
  that does not fit says its error, one on the boundary its warning. statsmodels is not in the project's venv: the
  tests exercise the skip; the fit was run once by hand with statsmodels 0.15 on a stand-in study.
- Every finished run must record one ``reference/c_base`` (within 1e-9 relative), else no table (``check_one_base``;
  added 2026-12-07 when a replaced machine fine-tuned the base again, before any result was read).
- The rate is the mean per-row KL of the evaluated rows (as ``zfree_lab.experiment.gains.run_gains``).
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).parent
ALPHA = 0.05
#: the preregistered TOST margin of H3, nats per example
MARGIN = 0.25
SEEDS = (0, 1, 2)
#: added under the same preregistration if a GPU is lent: the analysis at 6 seeds
EXTENDED_SEEDS = (0, 1, 2, 3, 4, 5)
#: config aid -> the preregistration's name
AIDS = {"none": "none", "hard_em_then_soft": "hard_em"}
FACTORS = {"1/3": 1 / 3, "3": 3.0}
#: the preregistered arms: (weighting, aid, β factor)
ARMS = [(w, a, "1/3") for w in ("plain", "distribution", "example") for a in ("none", "hard_em")] + \
       [("distribution", "hard_em", "3")]
ARM = ["weighting", "aid", "beta_factor"]
#: per-seed quantity -> rows.parquet column (``seed_stats._row_values``' names)
QUANTITIES = {"U": "use_shuffled", "G": "z_gain", "N": "net_gain"}
ORACLE_QUANTITIES = {"delta_R": ("D_control", "D_oracle"), "delta_R_null": ("D_control", "D_null"),
                     "label_value": ("D_null", "D_oracle")}
RUN_METRICS = {"mutual_information": "latent/mutual_information", "codes_used": "latent/codes_used",
               "predicted_use_fraction": "latent/predicted_use_fraction"}


def beta_factor(beta: float, beta_star: float | None) -> str:
    """The name in ``FACTORS`` of β / β* (β is written to 4 significant figures, so within 1 %), else the ratio."""
    if beta_star is None or not beta_star > 0:
        return "unknown"
    ratio = beta / beta_star
    return next((k for k, f in FACTORS.items() if abs(ratio / f - 1) < 0.01), f"{ratio:.3g}")


def _finished(runs_dir: Path, rid: str | None) -> bool:
    return rid is not None and (runs_dir / rid / "per_example.parquet").is_file()


def check_one_base(runs_dir: Path, run_ids, rtol: float = 1e-9) -> float | None:
    """The one ``reference/c_base`` (nats/token) the finished runs ``run_ids`` record in their summaries, or None where
    none records it. Raises ValueError naming the runs where they record more than one (within ``rtol`` relative):
    runs computed against different z-free bases (a base fine-tuned again on a replaced machine, DEVIATIONS.md)
    are not one study's arms."""
    import math
    from zfree.core.io import read_json

    seen: dict[float, list[str]] = {}
    for rid in sorted(run_ids):
        f = runs_dir / rid / "summary.json"
        if not (_finished(runs_dir, rid) and f.is_file()):
            continue
        c = read_json(f).get("reference/c_base")
        if c is None:
            continue
        key = next((k for k in seen if math.isclose(k, float(c), rel_tol=rtol)), float(c))
        seen.setdefault(key, []).append(rid)
    if len(seen) > 1:
        groups = "; ".join(f"{c!r}: {', '.join(r)}" for c, r in sorted(seen.items()))
        raise ValueError(f"the runs record {len(seen)} different z-free bases (summary reference/c_base, nats/token): "
                         f"{groups}")
    return next(iter(seen), None)


def main(study: Path, out: Path = HERE) -> dict:
    """Write the tables of the study folder ``study`` into ``out`` (module docstring) and return ``decide``'s dict."""
    from zfree.core.io import read_json
    from zfree_lab.experiment.gains import _per_example, links_of
    from zfree_lab.experiment.seed_stats import _row_values
    from zfree_lab.experiment.study_notes import study_notes
    from zfree_lab.run.run_folder import read_run_config

    runs_dir, links, notes = study / "runs", links_of(study), study_notes(study)
    stars = {r["weighting"]: float(r["beta_star"]) for r in notes.get("predicted_boundaries", [])}
    cfg = {rid: read_run_config(runs_dir / rid / "config.json") for rid in
           {*links["controls"], *links["controls"].values(), *links["oracles"], *links["nulls"].values()}
           if (runs_dir / rid / "config.json").is_file()}
    check_one_base(runs_dir, cfg)  # one z-free base for every run, or no table
    runs, rows, arm_seeds = [], [], []
    for rid, cid in sorted(links["controls"].items()):
        c = cfg.get(rid, {})
        arm = {"weighting": c.get("weighting"), "aid": AIDS.get(c.get("aid", "none"), c.get("aid")),
               "beta_factor": beta_factor(float(c.get("beta", np.nan)), stars.get(c.get("weighting")))}
        seed = int(c["seed"]) if "seed" in c else -1
        done = _finished(runs_dir, rid) and _finished(runs_dir, cid)
        runs.append({"run_id": rid, "role": "cvae", **arm, "seed": seed, "beta": c.get("beta"),
                     "control_run_id": cid, "finished": _finished(runs_dir, rid)})
        if not done:
            continue
        rv = _row_values(study, rid, cid)
        rv["kl"] = _per_example(str(runs_dir / rid))["kl"].reindex(rv.index).to_numpy(float)
        rows.append(rv.reset_index().assign(**arm, seed=seed, run_id=rid, control_run_id=cid))
        s = read_json(runs_dir / rid / "summary.json") if (runs_dir / rid / "summary.json").is_file() else {}
        arm_seeds.append({**arm, "seed": seed, "run_id": rid, "control_run_id": cid, "beta": float(c["beta"]),
                          "beta_star": stars.get(arm["weighting"], np.nan), "rows": len(rv), "rate": rv["kl"].mean(),
                          **{k: s.get(key, np.nan) for k, key in RUN_METRICS.items()},
                          **{q: rv[col].mean() for q, col in QUANTITIES.items()}})
    for cid in sorted(set(links["controls"].values())):
        c = cfg.get(cid, {})
        runs.append({"run_id": cid, "role": "control", "weighting": c.get("weighting"), "seed": c.get("seed"),
                     "finished": _finished(runs_dir, cid)})
    orows = []
    for oid, link in sorted(links["oracles"].items()):
        nid, cid, seed = links["nulls"].get(oid), link["control"], cfg.get(oid, {}).get("seed")
        runs += [{"run_id": oid, "role": "oracle", "label": link["label"], "seed": seed, "control_run_id": cid,
                  "finished": _finished(runs_dir, oid)}]
        if nid is not None:
            runs.append({"run_id": nid, "role": "null_oracle", "label": link["label"], "seed": seed,
                         "control_run_id": cid, "finished": _finished(runs_dir, nid)})
        if not (_finished(runs_dir, oid) and _finished(runs_dir, cid)):
            continue
        po, pc = _per_example(str(runs_dir / oid)), _per_example(str(runs_dir / cid))
        ids = po.index.intersection(pc.index)
        d_null = (_per_example(str(runs_dir / nid))["D"].reindex(ids).to_numpy(float) if _finished(runs_dir, nid)
                  else np.full(len(ids), np.nan))
        orows.append(pd.DataFrame({"oracle_run_id": oid, "seed": int(seed), "label": link["label"], "id": ids,
                                   "D_oracle": po.loc[ids, "D"].to_numpy(), "D_control": pc.loc[ids, "D"].to_numpy(),
                                   "D_null": d_null}))
    cols = ["id", *QUANTITIES.values(), "gain_minus_rate", "kl", *ARM, "seed", "run_id", "control_run_id"]
    rows = pd.concat(rows, ignore_index=True)[cols] if rows else pd.DataFrame(columns=cols)
    arm_seeds = pd.DataFrame(arm_seeds, columns=[*ARM, "seed", "run_id", "control_run_id", "beta", "beta_star", "rows",
                                                 "rate", *RUN_METRICS, *QUANTITIES])
    dup = arm_seeds[arm_seeds.duplicated([*ARM, "seed"], keep=False)]
    if len(dup):  # two runs of one arm and seed: a changed training path, to be named, never averaged silently
        raise ValueError(f"several runs of one arm and seed: {sorted(dup['run_id'])}")
    oracle_rows = (pd.concat(orows, ignore_index=True) if orows else
                   pd.DataFrame(columns=["oracle_run_id", "seed", "label", "id", "D_oracle", "D_control", "D_null"]))
    out.mkdir(parents=True, exist_ok=True)
    # zstd, as the other studies' per-row tables: snappy's bytes can happen to look like a Windows path
    rows.to_parquet(out / "rows.parquet", index=False, compression="zstd")
    oracle_rows.to_parquet(out / "oracle_rows.parquet", index=False, compression="zstd")
    arm_seeds.sort_values([*ARM, "seed"]).to_csv(out / "arm_seeds.csv", index=False)
    pd.DataFrame(runs).to_csv(out / "runs.csv", index=False)
    regime = notes.get("setting", "unknown")  # entangled_run (primary) or pretrained_source (secondary)
    decisions = {"regime": regime, **decide(rows, arm_seeds, oracle_rows)}
    arms = arm_table(rows, arm_seeds, oracle_rows)
    arms.assign(regime=regime).to_csv(out / "arms.csv", index=False)
    (out / "decisions.json").write_text(json.dumps(_jsonable(decisions), indent=1, allow_nan=False) + "\n",
                                        encoding="utf-8")
    (out / "table.md").write_text(markdown(decisions, arms) + "\n", encoding="utf-8")
    return decisions


def _arm(df: pd.DataFrame, arm: tuple) -> pd.DataFrame:
    w, a, f = arm
    return df[(df["weighting"] == w) & (df["aid"] == a) & (df["beta_factor"] == f)]


def _per_seed(arm_seeds: pd.DataFrame, arm: tuple, q: str, seeds) -> pd.Series:
    """seed -> the arm's per-seed value of ``q`` (a column of arm_seeds.csv), for the seeds in ``seeds`` it has."""
    a = _arm(arm_seeds, arm)
    a = a[a["seed"].isin(seeds)]
    return a.set_index("seed")[q].astype(float).dropna().sort_index()


def _row_arrays(rows: pd.DataFrame, arm: tuple, q: str, seeds) -> dict[int, pd.Series]:
    """seed -> the arm's per-row values of ``q`` (``QUANTITIES``), indexed by row id."""
    r = _arm(rows, arm)
    r = r[r["seed"].isin(seeds)]
    return {int(s): g.set_index("id")[QUANTITIES[q]].astype(float) for s, g in r.groupby("seed")}


def _bootstrap(a: dict, b: dict | None = None) -> list[float]:
    """The two-stage bootstrap's 95 % interval (``seed_stats.two_stage_bootstrap``: seeds drawn, then rows within
    each drawn seed) of the per-row values ``a`` or, for a contrast, of a − b on the rows both evaluated."""
    from zfree_lab.experiment.seed_stats import two_stage_bootstrap

    arrays = ([v.dropna().to_numpy(float) for _, v in sorted(a.items())] if b is None else
              [(a[s] - b[s]).dropna().to_numpy(float) for s in sorted(set(a) & set(b))])
    return list(two_stage_bootstrap(arrays))


def _test(values: pd.Series, seeds, boot: list[float]) -> dict:
    """Per-seed values, mean, 95 % t-interval, t, one-sided p of H0: mean ≤ 0 (``seed_stats.t_interval``), the
    bootstrap beside it, and the seeds of ``seeds`` it lacks."""
    from zfree_lab.experiment.seed_stats import t_interval

    missing = sorted(set(seeds) - set(values.index))
    return {"per_seed": {int(k): float(v) for k, v in values.items()}, **t_interval(values.to_numpy(float)),
            "two_stage_95": boot, "missing_seeds": missing, "complete": not missing}


def seed_sets(arm_seeds: pd.DataFrame, oracle_rows: pd.DataFrame) -> dict[str, tuple[int, ...]]:
    """The analyses to run: seeds 0-2 always, 0-5 as well once any run of seeds 3-5 exists (preregistered)."""
    present = set(arm_seeds["seed"].astype(int)) | set(oracle_rows["seed"].astype(int))
    return {"0-2": SEEDS, **({"0-5": EXTENDED_SEEDS} if present & set(EXTENDED_SEEDS[3:]) else {})}


def decide(rows: pd.DataFrame, arm_seeds: pd.DataFrame, oracle_rows: pd.DataFrame) -> dict:
    """``analyse`` at each of ``seed_sets``, and the arms the preregistration does not name (left out of every test)."""
    names = set(map(tuple, arm_seeds[ARM].to_numpy())) - set(ARMS)
    return {"analyses": {n: analyse(rows, arm_seeds, oracle_rows, s) for n, s in seed_sets(arm_seeds, oracle_rows).items()},
            "not_preregistered_arms": sorted(" ".join(map(str, a)) for a in names)}


DECISIONS = {
    "pending": "a seed, an arm or a control that H1 or H2 needs has not finished: no decision",
    "weightings": "a reconstruction weighting keeps z on where plain β at the same β_eff does not (H1 supported)",
    "aid": "no weighting keeps z on beyond plain β (H1 not supported); the hard-EM aid switches z on (H2 supported)",
    "nothing": "neither a weighting (H1) nor the aid (H2) is shown to switch z on",
}


def analyse(rows: pd.DataFrame, arm_seeds: pd.DataFrame, oracle_rows: pd.DataFrame, seeds) -> dict:
    """Every test the preregistration names at ``seeds`` (module docstring): ``tests`` (H1-W, H2-W with Holm and a
    status each), ``h3`` (per aided arm), ``theory`` (the arm at 3 β*), ``oracle`` (per label), ``mixed_model``,
    ``missing`` (the arm × seed pairs not finished), ``complete`` and ``decision``."""
    from zfree_lab.experiment.seed_stats import holm_adjusted, tost_p

    def test(arm, q, minus=None):
        v = _per_seed(arm_seeds, arm, q, seeds)
        if minus is None:
            return _test(v, seeds, _bootstrap(_row_arrays(rows, arm, q, seeds)))
        return _test((v - _per_seed(arm_seeds, minus, q, seeds)).dropna(), seeds,
                     _bootstrap(_row_arrays(rows, arm, q, seeds), _row_arrays(rows, minus, q, seeds)))

    plain = ("plain", "none", "1/3")
    tests = {f"H1-{w}": {"what": f"U({w}, none) − U(plain, none)", **test((w, "none", "1/3"), "U", plain)}
             for w in ("distribution", "example")}
    tests.update({f"H2-{w}": {"what": f"G({w}, hard EM)", **test((w, "hard_em", "1/3"), "G")}
                  for w in ("plain", "distribution", "example")})
    for t, p in zip(tests.values(), holm_adjusted([t["p"] for t in tests.values()])):
        t["p_holm"] = float(p)
        t["status"] = ("pending" if not t["complete"] else
                       "supported" if np.isfinite(p) and p < ALPHA else "not supported")
    h3 = {}
    for arm in (a for a in ARMS if a[1] == "hard_em"):
        t = test(arm, "N")
        t["tost_p"] = tost_p(list(t["per_seed"].values()), MARGIN)
        t["status"] = ("pending" if not t["complete"] else
                       "within ±0.25 of 0" if np.isfinite(t["tost_p"]) and t["tost_p"] < ALPHA else "not shown within ±0.25")
        h3[" ".join(arm)] = t
    theory = {q: test(("distribution", "hard_em", "3"), q) for q in ("U", "G")}
    missing = [f"{' '.join(a)} seed {s}" for a in ARMS for s in seeds if s not in set(_per_seed(arm_seeds, a, "U", seeds).index)]
    oracle = {}
    for label, g in oracle_rows[oracle_rows["seed"].isin(seeds)].groupby("label"):
        oracle[label] = {}
        for q, (a, b) in ORACLE_QUANTITIES.items():
            r = g.assign(value=g[a] - g[b]).dropna(subset=["value"])
            arrays = {int(s): x.set_index("id")["value"] for s, x in r.groupby("seed")}
            oracle[label][q] = _test(r.groupby("seed")["value"].mean(), seeds, _bootstrap(arrays))
        missing += [f"oracle {label} seed {s}" for s in oracle[label]["delta_R"]["missing_seeds"]]
        missing += [f"null oracle {label} seed {s}" for s in oracle[label]["delta_R_null"]["missing_seeds"]
                    if s not in oracle[label]["delta_R"]["missing_seeds"]]
    if oracle_rows.empty or not oracle_rows["seed"].isin(seeds).any():
        missing.append("oracles: none finished")
    complete = all(t["complete"] for t in tests.values())
    supported = [n for n, t in tests.items() if t["status"] == "supported"]
    decision = ("pending" if not complete else "weightings" if any(n.startswith("H1") for n in supported)
                else "aid" if supported else "nothing")
    return {"seeds": list(seeds), "tests": tests, "h3": h3, "theory": theory, "oracle": oracle,
            "mixed_model": mixed_model(arm_seeds, seeds), "missing": missing, "complete": complete,
            "supported": supported, "decision": decision, "decision_text": DECISIONS[decision]}


def mixed_model(arm_seeds: pd.DataFrame, seeds) -> dict:
    """The preregistered second check of H1 and H2: a linear mixed model of the per-seed values, arm a fixed effect,
    seed a random intercept (statsmodels' MixedLM, REML); per tested arm its coefficient, standard error and the
    one-sided p of its Wald z. Skipped, and said so, when statsmodels is not installed."""
    try:
        import statsmodels.formula.api as smf
    except ImportError:
        return {"status": "skipped: statsmodels is not installed in this venv; no mixed model was fitted"}
    from scipy.stats import norm

    def fit(formula: str, df: pd.DataFrame) -> dict:
        with warnings.catch_warnings(record=True) as caught:  # a fit on the boundary (zero seed variance) says so
            warnings.simplefilter("always")
            try:
                res = smf.mixedlm(formula, df, groups=df["seed"]).fit(reml=True)
            except Exception as e:  # a singular fit at 3 seeds says its error: a check, not a decision
                return {"error": f"{type(e).__name__}: {e}"}
        return {"warnings": sorted({str(w.message) for w in caught}),
                **{k: {"coef": float(res.fe_params[k]), "se": float(res.bse[k]),
                       "p_one_sided": float(norm.sf(res.fe_params[k] / res.bse[k]))}
                   for k in res.fe_params.index if k != "Intercept"}}

    a = arm_seeds[arm_seeds["seed"].isin(seeds)]
    out = {"status": "fitted"}
    for w in ("distribution", "example"):
        df = pd.concat([_arm(a, ("plain", "none", "1/3")), _arm(a, (w, "none", "1/3"))])
        out[f"H1-{w}"] = fit("U ~ C(weighting, Treatment(reference='plain'))", df)
    df = pd.concat([_arm(a, (w, "hard_em", "1/3")) for w in ("plain", "distribution", "example")])
    out["H2"] = fit("G ~ 0 + C(weighting)", df)
    return out


def arm_table(rows: pd.DataFrame, arm_seeds: pd.DataFrame, oracle_rows: pd.DataFrame) -> pd.DataFrame:
    """One row per analysis (``seed_sets``) and arm (the preregistered ones, then any other): its seeds and per
    quantity the mean over seeds with the 95 % t-interval (``_lo``, ``_hi``), and for U, G, N the two-stage
    bootstrap interval (``_boot_lo``, ``_boot_hi``)."""
    from zfree_lab.experiment.seed_stats import t_interval

    out = []
    arms = ARMS + sorted(set(map(tuple, arm_seeds[ARM].to_numpy())) - set(ARMS), key=str)
    for name, seeds in seed_sets(arm_seeds, oracle_rows).items():
        for arm in arms:
            row = dict(zip(ARM, arm), analysis=name)
            have = _per_seed(arm_seeds, arm, "U", seeds).index
            row.update(n_seeds=len(have), seeds=" ".join(map(str, have)))
            for q in ("rate", *RUN_METRICS, *QUANTITIES):
                t = t_interval(_per_seed(arm_seeds, arm, q, seeds).to_numpy(float))
                row.update({q: t["mean"], f"{q}_lo": t["lo"], f"{q}_hi": t["hi"]})
                if q in QUANTITIES:
                    row[f"{q}_boot_lo"], row[f"{q}_boot_hi"] = _bootstrap(_row_arrays(rows, arm, q, seeds))
            out.append(row)
    return pd.DataFrame(out)


def _num(x, nd: int = 3) -> str:
    """``x`` with ``nd`` decimals and a typographic minus; "n/a" for NaN or None."""
    if x is None or not np.isfinite(x):
        return "n/a"
    s = f"{x:.{nd}f}"
    return (s[1:] if s.startswith("-") and float(s) == 0 else s).replace("-", "−")


def _ci(m, lo, hi) -> str:
    return f"{_num(m)} [{_num(lo)}, {_num(hi)}]" if lo is not None and np.isfinite(lo) else f"{_num(m)} (no interval)"


def _p(p) -> str:
    return "n/a" if p is None or not np.isfinite(p) else ("< 0.001" if p < 0.001 else _num(p))


def markdown(decisions: dict, arms: pd.DataFrame) -> str:
    """table.md: per analysis the arm table (nats per example; mean over seeds [95 % t-interval]; U, G, N with the
    two-stage bootstrap interval after it), the test lines and the decision; a partial study says so first."""
    out = [f"# factorial-smollm2, regime {decisions['regime']}"]
    for name, d in decisions["analyses"].items():
        out += ["", f"## seeds {name}", ""]
        if not d["complete"] or d["missing"]:
            out += [f"**PARTIAL STUDY{': decision pending' if not d['complete'] else ''}.** Not finished: "
                    + "; ".join(d["missing"]), ""]
        out += ["| weighting | aid | β/β* | seeds | rate | MI | codes used | U | G | N | predicted use |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
        for _, a in arms[arms["analysis"] == name].iterrows():
            cells = [_ci(a[q], a[f"{q}_lo"], a[f"{q}_hi"]) for q in ("rate", "mutual_information", "codes_used")]
            cells += [_ci(a[q], a[f"{q}_lo"], a[f"{q}_hi"]) + f" (boot [{_num(a[f'{q}_boot_lo'])}, "
                      f"{_num(a[f'{q}_boot_hi'])}])" for q in QUANTITIES]
            cells.append(_ci(a["predicted_use_fraction"], a["predicted_use_fraction_lo"], a["predicted_use_fraction_hi"]))
            out.append(f"| {a['weighting']} | {a['aid']} | {a['beta_factor']} | {a['n_seeds']} ({a['seeds']}) | "
                       + " | ".join(cells) + " |")
        out.append("")
        for n, t in d["tests"].items():
            out.append(f"- {n}: {t['what']} = {_ci(t['mean'], t['lo'], t['hi'])} over {t['n']} seeds, one-sided p "
                       f"{_p(t['p'])}, Holm p {_p(t['p_holm'])}, bootstrap [{_num(t['two_stage_95'][0])}, "
                       f"{_num(t['two_stage_95'][1])}]: **{t['status']}**")
        for n, t in d["h3"].items():
            out.append(f"- H3 {n}: N = {_ci(t['mean'], t['lo'], t['hi'])}, one-sided p (N > 0) {_p(t['p'])}, "
                       f"TOST (±{MARGIN}) p {_p(t['tost_p'])}: {t['status']}")
        for q, t in d["theory"].items():
            out.append(f"- theory check, distribution + aid at 3 β*: {q} = {_ci(t['mean'], t['lo'], t['hi'])} (read)")
        for label, qs in d["oracle"].items():
            out.append(f"- oracle {label}: " + "; ".join(f"{q} = {_ci(t['mean'], t['lo'], t['hi'])} over {t['n']} seeds"
                                                           for q, t in qs.items()) + " (read)")
        mm = d["mixed_model"]
        out.append(f"- mixed model (check): {mm['status']}")
        for n, fit in ((k, v) for k, v in mm.items() if k != "status"):
            terms = "; ".join(f"{k} = {_num(v['coef'])} (se {_num(v['se'])}, one-sided p {_p(v['p_one_sided'])})"
                              for k, v in fit.items() if isinstance(v, dict))
            out.append(f"  - {n}: {fit.get('error') or terms}" + (f" ({'; '.join(fit['warnings'])})"
                                                                  if fit.get("warnings") else ""))
        out.append(f"- **decision: {d['decision']}** — {d['decision_text']}")
    return "\n".join(out)


def _jsonable(obj):
    """Strict JSON: numpy scalars as Python numbers, NaN (fewer than two seeds, no spread) as null."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.integer, np.bool_)):
        return obj.item()
    if isinstance(obj, (float, np.floating)):
        return None if not np.isfinite(obj) else float(obj)
    return obj


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", type=Path, help="the study folder (zfree study --preset factorial-smollm2 --out STUDY)")
    parser.add_argument("--out", type=Path, default=HERE, help="where the tables go (default: this folder)")
    args = parser.parse_args()
    d = main(args.study, args.out)
    print((args.out / "table.md").read_text(encoding="utf-8"))
