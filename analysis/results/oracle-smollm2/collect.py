"""Copy a finished (or partly finished) oracle-smollm2 study's tables here, without machine paths, and compute the
preregistered tests and decision from them (issue 55; PREREGISTRATION.md in this folder, written before any run).

    .venv/bin/python analysis/results/oracle-smollm2/collect.py STUDY   # copy the tables, then print
    .venv/bin/python analysis/results/oracle-smollm2/collect.py         # print from the shipped tables
    .venv/bin/python analysis/results/oracle-smollm2/collect.py STUDY --out DIR   # a running study, elsewhere

``main`` writes three tables, every run named by its id:

- ``oracles.csv``: the study's ``available_gain.csv`` (one row per oracle run: delta_R, delta_R_null,
  label_value, flipped, H, each with its row interval; ``zfree_lab.experiment.gains.oracle_table``) joined to
  the oracle run's config (seed, router_clip, latent_capacity, injection) and its arm (``shipped``: global clip,
  per_value; ``decoupled``: own clip, shared_delta);
- ``oracle_rows.parquet``: per oracle run and evaluated row, D of the oracle, of its control and of its null
  oracle (NaN where the null has not finished) and the oracle's flipped-label D (its D_shuffled), the rows the
  oracle and its control both evaluated: every per-seed number below is a mean over these rows;
- ``runs.csv``: every oracle, control and null run (role, seed, arm, label, route, steps) with its step-0
  ρ_recon (the run's own check: 1 at step 0).

``headline`` computes from those files alone, exactly as preregistered (α = 0.05, seeds the replicates, t over
seeds): per oracle arm (arm × label × route) ΔR = D_control − D_oracle, ΔR_null = D_control − D_null,
V = D_null − D_oracle and F = D_flipped − D_oracle as per-seed row means, with their t-intervals over seeds, and H
(read); **H1** C = ΔR(complete, decoupled) − ΔR(complete, shipped), one-sided t of H0: mean C ≤ 0; **H2**
ΔR(complete, decoupled), one-sided t of H0: mean ≤ 0; Holm across H1 and H2; the issue's criterion (the
two-sided 95 % t-interval of ΔR(complete, decoupled) holds 0 or lies above it, no correction); **H3** the TOST
(±0.25 nats/example) of each of the 7 decoupled nulls' ΔR_null (no correction), the shipped null's ΔR_null with
its t-interval and the contrast ΔR_null(decoupled) − ΔR_null(shipped) for complete (read); the **routes**: V > 0
one-sided t for n_sentences and y_words on each route, Holm within the six, route-to-route differences of V
read with their t-intervals; the checks (two-stage bootstrap of C and of each ΔR, step-0 ρ_recon of every run);
and the **decision**: the deficit was the oracle arm's when H1 is supported and the decoupled complete oracle
is not below its control, else it does not come from items 1-2. A study short of its 3 seeds × 8 oracle arms
(each with its control and null) is reported as incomplete, its decision pending.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).parent
ALPHA = 0.05
#: the preregistered seeds and oracle arms: (arm, label, route)
SEEDS = (0, 1, 2)
ARMS = [("shipped", "complete", "embedding"), ("decoupled", "complete", "embedding"),
        *[("decoupled", label, route) for label in ("n_sentences", "y_words") for route in ("embedding", "mid", "memory")]]
#: the recipe settings that name an arm: (router_clip, latent_capacity) -> arm
ARM_OF = {("global", "per_value"): "shipped", ("own", "shared_delta"): "decoupled"}
KEY = ["arm", "label", "route"]
#: the per-seed quantities of each oracle arm: name -> (minuend, subtrahend) columns of oracle_rows.parquet
QUANTITIES = {"delta_R": ("D_control", "D_oracle"), "delta_R_null": ("D_control", "D_null"),
              "label_value": ("D_null", "D_oracle"), "flipped": ("D_flipped", "D_oracle")}
#: the step-0 check's tolerance on |ρ_recon − 1| (the runs' own check passes at 1e-5)
RHO0_TOL = 1e-4


def _arm_fields(cfg: dict) -> dict:
    """seed, arm, route and the two recipe settings of a run's flat config."""
    clip, capacity = cfg.get("router_clip", "global"), cfg.get("latent_capacity", "per_value")
    return {"seed": int(cfg.get("seed", 0)), "arm": ARM_OF.get((clip, capacity), f"{clip}/{capacity}"),
            "route": cfg.get("injection", "embedding"), "router_clip": clip, "latent_capacity": capacity}


def main(study: Path, out: Path = HERE) -> None:
    """Write ``oracles.csv``, ``oracle_rows.parquet`` and ``runs.csv`` of the study folder ``study`` into ``out``."""
    from zfree.core.io import read_json
    from zfree_lab.run.run_folder import read_run_config
    from zfree_lab.experiment.gains import _paired, _per_example, links_of, oracle_table

    if not (study / "controls.json").is_file():
        raise SystemExit(f"collect.py: {study} is not an oracle-smollm2 study folder (no controls.json)")
    runs_dir, links = study / "runs", links_of(study)
    # a finished study's table; while it runs, the same table from the runs finished so far
    oracles = pd.read_csv(study / "available_gain.csv") if (study / "available_gain.csv").exists() else oracle_table(study)
    if oracles.empty:
        done = sum((r / "summary.json").is_file() for r in runs_dir.glob("*"))
        raise SystemExit(f"collect.py: no oracle of {study} has finished beside its control yet ({done} runs "
                         f"finished): nothing to collect")
    fields = {oid: _arm_fields(read_run_config(runs_dir / oid / "config.json")) for oid in oracles["oracle_run_id"]}
    meta = pd.DataFrame([{"oracle_run_id": oid, **f} for oid, f in fields.items()])
    oracles = meta.merge(oracles, on="oracle_run_id")
    oracles[[*KEY, "seed", *[c for c in oracles if c not in (*KEY, "seed")]]].sort_values(
        [*KEY, "seed"]).to_csv(out / "oracles.csv", index=False)
    rows, runs = [], []
    for o in oracles.itertuples():
        po, pc = _paired(_per_example(str(runs_dir / o.oracle_run_id)), _per_example(str(runs_dir / o.control_run_id)))
        null = o.null_run_id if isinstance(o.null_run_id, str) else None
        have_null = null is not None and (runs_dir / null / "per_example.parquet").is_file()
        d_null = (_per_example(str(runs_dir / null))["D"].reindex(po.index).to_numpy() if have_null
                  else np.full(len(po), np.nan))
        rows.append(pd.DataFrame({"oracle_run_id": o.oracle_run_id, "seed": o.seed, "arm": o.arm, "label": o.label,
                                  "route": o.route, "id": po.index, "D_oracle": po["D"].to_numpy(),
                                  "D_control": pc["D"].to_numpy(), "D_null": d_null,
                                  "D_flipped": po["d_shuffled"].to_numpy(), "H_router": po["kl"].to_numpy(float)}))
        for role, rid in (("oracle", o.oracle_run_id), ("control", o.control_run_id), ("null_oracle", null)):
            if rid is None or not (runs_dir / rid / "summary.json").is_file():
                continue
            s = read_json(runs_dir / rid / "summary.json")
            runs.append({"run_id": rid, "role": role, "oracle_run_id": o.oracle_run_id, "seed": o.seed, "arm": o.arm,
                         "label": o.label, "route": o.route, "steps": s.get("steps"),
                         "rho0": s.get("init/loss/val/baseline_normalized_reconstruction_loss", np.nan),
                         "train_wall_s": s.get("wall_s", np.nan)})
    # zstd, as leaderboard-example's per-row tables: snappy's bytes can happen to look like a Windows path
    pd.concat(rows, ignore_index=True).to_parquet(out / "oracle_rows.parquet", index=False, compression="zstd")
    # a control serves the oracles of its recipe and seed: one line per run and role
    pd.DataFrame(runs).drop_duplicates(["run_id", "role"]).to_csv(out / "runs.csv", index=False)


def _select(df: pd.DataFrame, arm: str, label: str, route: str) -> pd.DataFrame:
    return df[(df["arm"] == arm) & (df["label"] == label) & (df["route"] == route)]


def _per_seed(rows: pd.DataFrame, arm, label, route, q: str) -> pd.Series:
    """seed -> the row mean of quantity ``q`` (``QUANTITIES``) of that oracle arm; seeds without it left out."""
    a, b = QUANTITIES[q]
    r = _select(rows, arm, label, route)
    return (r[a] - r[b]).groupby(r["seed"]).mean().dropna().sort_index()


def _row_arrays(rows: pd.DataFrame, arm, label, route, q: str) -> dict[int, pd.Series]:
    """seed -> quantity ``q`` per evaluated row (indexed by row id) of that oracle arm."""
    a, b = QUANTITIES[q]
    r = _select(rows, arm, label, route)
    r = r.assign(value=r[a] - r[b]).dropna(subset=["value"])
    return {int(s): g.set_index("id")["value"] for s, g in r.groupby("seed")}


def headline(d: Path = HERE) -> dict:
    """Every number the preregistration names, from the shipped tables of ``d`` (module docstring): ``arms``
    (one row per oracle arm: seeds, and per quantity the mean over seeds with its t-interval, and H), ``h1``,
    ``h2`` (each: per-seed values, t-interval, one-sided p, Holm-adjusted p, supported), ``criterion``
    (ΔR(complete, decoupled)'s interval not below 0), ``h3`` (per decoupled null: TOST p, equivalent; the shipped
    null's t-interval; the decoupled − shipped null contrast), ``routes`` (V per label × route: one-sided p,
    Holm within the six, supported) and ``route_differences``, ``checks`` (bootstraps, step-0 ρ_recon),
    ``complete`` and ``decision``."""
    from zfree_lab.experiment.seed_stats import TOST_MARGIN, holm_adjusted, t_interval, tost_p, two_stage_bootstrap

    rows, oracles, runs = (pd.read_parquet(d / "oracle_rows.parquet"), pd.read_csv(d / "oracles.csv"),
                           pd.read_csv(d / "runs.csv"))
    arms = []
    for arm, label, route in ARMS:
        out = {"arm": arm, "label": label, "route": route}
        seeds = _per_seed(rows, arm, label, route, "delta_R").index
        out.update(n_seeds=len(seeds), seeds=" ".join(map(str, seeds)))
        for q in QUANTITIES:
            t = t_interval(_per_seed(rows, arm, label, route, q).to_numpy(float))
            out.update({q: t["mean"], f"{q}_lo": t["lo"], f"{q}_hi": t["hi"], f"{q}_n": t["n"]})
        h = t_interval(_select(oracles, arm, label, route)["H"].to_numpy(float))
        out.update(H=h["mean"], H_lo=h["lo"], H_hi=h["hi"])
        arms.append(out)
    arms = pd.DataFrame(arms)

    def test(values: pd.Series) -> dict:
        return {"per_seed": {int(k): float(v) for k, v in values.items()}, **t_interval(values.to_numpy(float))}

    dec = _per_seed(rows, "decoupled", "complete", "embedding", "delta_R")
    ship = _per_seed(rows, "shipped", "complete", "embedding", "delta_R")
    h1, h2 = test((dec - ship).dropna()), test(dec)
    for h, p in zip((h1, h2), holm_adjusted([h1["p"], h2["p"]])):
        h.update(p_holm=float(p), supported=bool(np.isfinite(p) and p < ALPHA))
    # the criterion: the two-sided 95 % interval holds 0 or lies above it, i.e. its upper end >= 0
    criterion = {"lo": h2["lo"], "hi": h2["hi"], "not_below": bool(np.isfinite(h2["hi"]) and h2["hi"] >= 0)}

    nulls = []
    for arm, label, route in ARMS:
        if arm != "decoupled":
            continue
        v = _per_seed(rows, arm, label, route, "delta_R_null")
        p = tost_p(v.to_numpy(float), TOST_MARGIN)
        nulls.append({"label": label, "route": route, **t_interval(v.to_numpy(float)), "tost_p": p,
                      "equivalent": bool(np.isfinite(p) and p < ALPHA)})
    null_ship = _per_seed(rows, "shipped", "complete", "embedding", "delta_R_null")
    null_dec = _per_seed(rows, "decoupled", "complete", "embedding", "delta_R_null")
    h3 = {"decoupled": pd.DataFrame(nulls), "shipped": test(null_ship),
          "contrast": test((null_dec - null_ship).dropna()), "margin": TOST_MARGIN}

    routes = []
    for label in ("n_sentences", "y_words"):
        for route in ("embedding", "mid", "memory"):
            routes.append({"label": label, "route": route,
                           **t_interval(_per_seed(rows, "decoupled", label, route, "label_value").to_numpy(float))})
    routes = pd.DataFrame(routes)
    routes["p_holm"] = holm_adjusted(routes["p"].to_numpy(float))
    routes["supported"] = np.isfinite(routes["p_holm"]) & (routes["p_holm"] < ALPHA)
    diffs = []
    for label in ("n_sentences", "y_words"):
        v = {r: _per_seed(rows, "decoupled", label, r, "label_value") for r in ("embedding", "mid", "memory")}
        for a, b in (("mid", "embedding"), ("memory", "embedding"), ("memory", "mid")):
            diffs.append({"label": label, "routes": f"{a} − {b}", **t_interval((v[a] - v[b]).dropna().to_numpy(float))})

    def paired_rows(arrays_a: dict, arrays_b: dict | None = None) -> list[np.ndarray]:
        """Per seed the row values (minus the other arm's on the same rows, for a contrast)."""
        if arrays_b is None:
            return [a.to_numpy(float) for _, a in sorted(arrays_a.items())]
        return [(arrays_a[s] - arrays_b[s]).dropna().to_numpy(float) for s in sorted(set(arrays_a) & set(arrays_b))]

    dec_rows = _row_arrays(rows, "decoupled", "complete", "embedding", "delta_R")
    ship_rows = _row_arrays(rows, "shipped", "complete", "embedding", "delta_R")
    boot = {"C": two_stage_bootstrap(paired_rows(dec_rows, ship_rows))}
    for arm, label, route in ARMS:
        boot[f"delta_R {arm} {label} {route}"] = two_stage_bootstrap(
            paired_rows(_row_arrays(rows, arm, label, route, "delta_R")))
    rho = runs["rho0"].astype(float)
    checks = {"bootstrap": boot, "rho0_max_dev": float((rho - 1).abs().max()) if len(rho) else np.nan,
              "rho0_ok": bool(len(rho) and np.isfinite(rho).all() and ((rho - 1).abs() <= RHO0_TOL).all()),
              "n_runs": int(runs["run_id"].nunique())}

    have = {(r["arm"], r["label"], r["route"]): set(map(int, r["seeds"].split())) for _, r in arms.iterrows()}
    with_null = {(a, lab, rt): set(_per_seed(rows, a, lab, rt, "delta_R_null").index) for a, lab, rt in ARMS}
    complete = all(have[k] >= set(SEEDS) and with_null[k] >= set(SEEDS) for k in ARMS)
    if not complete:
        decision = "pending"
    elif h1["supported"] and criterion["not_below"]:
        decision = "oracle arm"
    else:
        decision = "not items 1-2"
    return {"arms": arms, "h1": h1, "h2": h2, "criterion": criterion, "h3": h3, "routes": routes,
            "route_differences": pd.DataFrame(diffs), "checks": checks, "complete": complete, "decision": decision,
            "n_oracle_runs": int(len(oracles))}


def _num(x: float, nd: int) -> str:
    """``x`` with ``nd`` decimals, a typographic minus (and no "−0.000")."""
    if not np.isfinite(x):
        return "n/a"
    s = f"{x:.{nd}f}"
    return (s[1:] if s.startswith("-") and float(s) == 0 else s).replace("-", "−")


def _ci(x: float, lo: float, hi: float, nd: int = 3) -> str:
    return f"{_num(x, nd)} [{_num(lo, nd)}, {_num(hi, nd)}]" if np.isfinite(lo) else f"{_num(x, nd)} (no interval)"


def _p(p: float) -> str:
    """`` = 0.014``, `` < 0.001`` or ``: none (no t)``: what follows a p in a line."""
    return (" < 0.001" if p < 0.001 else f" = {_num(p, 3)}") if np.isfinite(p) else ": none (no t)"


DECISIONS = {
    "oracle arm": "H1 supported and the decoupled complete oracle not below its control: the deficit was the oracle "
                  "arm's (hidden coupling and/or unequal capacity, not separated by this design)",
    "not items 1-2": "H1 not supported, or the decoupled complete oracle's interval below 0: the deficit does not come "
                     "from items 1-2 (read the null, flipped and route rows for where it does)",
    "pending": "the study is incomplete (fewer than 3 seeds of some oracle arm, its control or its null): no decision",
}


def markdown(h: dict) -> list[str]:
    """The results' table and test lines (nats per example; intervals: 95 % t over seeds)."""
    out = ["| arm | label | route | seeds | ΔR | ΔR_null | V | F | H |", "|---|---|---|---|---|---|---|---|---|"]
    for _, a in h["arms"].iterrows():
        # a quantity over fewer seeds than ΔR (a null not finished) says over how many
        cells = [_ci(a[q], a[f"{q}_lo"], a[f"{q}_hi"]) + (f" ({a[f'{q}_n']} seeds)" if q != "H" and a[f"{q}_n"] < a["n_seeds"]
                                                           else "") for q in ("delta_R", "delta_R_null", "label_value", "flipped", "H")]
        out.append(f"| {a['arm']} | {a['label']} | {a['route']} | {a['n_seeds']} ({a['seeds']}) | " + " | ".join(cells) + " |")
    for name, what in (("h1", "C = ΔR(complete, decoupled) − ΔR(complete, shipped)"), ("h2", "ΔR(complete, decoupled)")):
        t = h[name]
        per = ", ".join(f"{s}: {_num(v, 3)}" for s, v in t["per_seed"].items())
        out.append(f"{name.upper()}: {what} = {_ci(t['mean'], t['lo'], t['hi'])} over {t['n']} seeds ({per}); "
                   f"t = {_num(t['t'], 2)}, one-sided p{_p(t['p'])}, Holm p{_p(t['p_holm'])}: "
                   f"{'supported' if t['supported'] else 'not supported'}")
    c = h["criterion"]
    out.append(f"criterion: the decoupled complete oracle is {'not below' if c['not_below'] else 'below'} its control "
               f"(95 % t-interval [{_num(c['lo'], 3)}, {_num(c['hi'], 3)}])")
    for _, n in h["h3"]["decoupled"].iterrows():
        out.append(f"H3, null {n['label']} on {n['route']} (decoupled): ΔR_null = {_ci(n['mean'], n['lo'], n['hi'])} "
                   f"over {n['n']} seeds, "
                   f"TOST (±{h['h3']['margin']}) p{_p(n['tost_p'])}: {'null' if n['equivalent'] else 'not shown null'}")
    s, cst = h["h3"]["shipped"], h["h3"]["contrast"]
    out.append(f"H3, null complete (shipped): ΔR_null = {_ci(s['mean'], s['lo'], s['hi'])}; decoupled − shipped "
               f"{_ci(cst['mean'], cst['lo'], cst['hi'])} (read, not tested)")
    for _, r in h["routes"].iterrows():
        out.append(f"route, {r['label']} on {r['route']}: V = {_ci(r['mean'], r['lo'], r['hi'])} over {r['n']} seeds, "
                   f"one-sided p{_p(r['p'])}, Holm (6) p{_p(r['p_holm'])}: {'supported' if r['supported'] else 'not supported'}")
    for _, r in h["route_differences"].iterrows():
        out.append(f"route difference, {r['label']}, V({r['routes']}) = {_ci(r['mean'], r['lo'], r['hi'])} (read)")
    b = h["checks"]["bootstrap"]["C"]
    out.append(f"checks: C two-stage bootstrap [{_num(b[0], 3)}, {_num(b[1], 3)}]; step-0 ρ_recon within {RHO0_TOL} of 1 "
               f"in {'every' if h['checks']['rho0_ok'] else 'NOT every'} run ({h['checks']['n_runs']} runs, largest "
               f"deviation {_num(h['checks']['rho0_max_dev'], 6)})")
    out.append("checks: two-stage bootstrap of ΔR, " + "; ".join(
        f"{k.removeprefix('delta_R ')} [{_num(v[0], 3)}, {_num(v[1], 3)}]" for k, v in h["checks"]["bootstrap"].items()
        if k != "C"))
    out.append(f"decision: {DECISIONS[h['decision']]}")
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", type=Path, nargs="?",
                        help="the study folder (zfree study --preset oracle-smollm2 --out STUDY); omitted: print "
                             "from the tables in --out")
    parser.add_argument("--out", type=Path, default=HERE, help="where the tables go (default: this folder)")
    args = parser.parse_args()
    if args.study is not None:
        main(args.study, args.out)
    print("\n".join(markdown(headline(args.out))))
