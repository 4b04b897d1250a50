"""The synthetic oracle check per injection route (issue 55): per-row table and route table from finished
``zfree study --preset oracle-routes --set injection=ROUTE`` folders, without machine paths.

    .venv/bin/python analysis/results/oracle-routes-synth/collect.py embedding=STUDY mid=STUDY memory=STUDY \
        [text:embedding=RUN_DIR ...]
    .venv/bin/python analysis/results/oracle-routes-synth/collect.py --add "ROUTE (what differs)=STUDY" ...

Writes rows.csv (one row per route, seed and evaluated row: the control's, the strategy oracle's and
its null oracle's D = |S| lbar, and the row's strategy information ``info`` = its Bayes z-free loss
log(K / m), which the strategy reduces to 0: I(s; y | x) on that row; nats per example) and routes.csv
(``route_table``: per route and seed the oracle's gain D_control - D_oracle and the null's
D_control - D_null, each with its 95 % row-bootstrap interval, the information over the same rows,
and whether each check passes). ``tests/test_shipped_results.py`` recomputes routes.csv from rows.csv and finds
each number in the README's route table: a row per route, labelled ``ROUTE``; where a route has several seeds, a
row per seed labelled ``ROUTE, seed N`` and a row ``ROUTE (N seeds)`` with its seeds.csv line (the t-interval
over seeds of gain - information and of the null's gain).
A ``text:ROUTE=RUN_DIR`` argument (a text oracle trained on that route's control recipe, ``zfree train
--config CONTROL/config.json --set latent_source=text:strategy``) adds text_rows.csv: per evaluated row the
control's D and the text oracle's D_text (the strategy written into x).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).parent


def study_rows(route: str, study: Path) -> pd.DataFrame:
    """The per-row table of one study: every (oracle, its control, its null) of controls.json, by seed."""
    from zfree.core.io import read_json
    from zfree_lab.run.run_folder import read_run_config

    links, runs, out = read_json(study / "controls.json"), study / "runs", []
    for oid, link in links["oracles"].items():
        nid = links["nulls"][oid]

        def d(rid):
            pe = pd.read_parquet(runs / rid / "per_example.parquet").set_index("id")
            return pe["n_tokens"] * pe["lbar"], pe

        dc, _ = d(link["control"])
        do, pe = d(oid)
        dn, _ = d(nid)
        seed = read_run_config(runs / oid / "config.json")["seed"]
        out.append(pd.DataFrame({"route": route, "seed": seed, "label": link["label"], "id": do.index,
                                 "D_control": dc.loc[do.index].to_numpy(), "D_oracle": do.to_numpy(),
                                 "D_null": dn.loc[do.index].to_numpy(), "info": pe["bayes_nll"].to_numpy(float)}))
    return pd.concat(out, ignore_index=True)


def route_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per route and seed: rows; info (the strategy information, the mean over the rows of log(K / m));
    gain = D_control - D_oracle and null_gain = D_control - D_null with their intervals
    (``zfree_lab.experiment.gains.interval``: 95 % percentile bootstrap over the rows, seed 0); gain_minus_info
    (the paired per-row difference, with its interval); D_control_excess (D_control - info: the control's
    loss above the Bayes z-free loss) and D_oracle (the oracle's loss above the Bayes loss given s, 0);
    oracle_pass (info inside the gain's interval) and null_pass (0 inside the null's interval)."""
    from zfree_lab.experiment.gains import interval

    out = []
    for (route, seed), g in rows.groupby(["route", "seed"], sort=False):
        gain = g["D_control"].to_numpy() - g["D_oracle"].to_numpy()
        null = g["D_control"].to_numpy() - g["D_null"].to_numpy()
        info = float(g["info"].mean())
        (e, lo, hi), (n, nlo, nhi) = interval(gain), interval(null)
        d, dlo, dhi = interval(gain - g["info"].to_numpy())
        out.append({"route": route, "seed": int(seed), "rows": len(g), "info": info, "gain": e, "gain_lo": lo,
                    "gain_hi": hi, "gain_minus_info": d, "gain_minus_info_lo": dlo, "gain_minus_info_hi": dhi,
                    "null_gain": n, "null_gain_lo": nlo, "null_gain_hi": nhi,
                    "D_control_excess": float(g["D_control"].mean()) - info, "D_oracle": float(g["D_oracle"].mean()),
                    "oracle_pass": bool(lo <= info <= hi), "null_pass": bool(nlo <= 0 <= nhi)})
    return pd.DataFrame(out)


def text_rows(route: str, study: Path, run: Path) -> pd.DataFrame:
    """Per evaluated row of the text oracle ``run``: D of the study's control (the one its oracles are paired
    with) and the text oracle's D_text."""
    from zfree.core.io import read_json

    control = next(iter(read_json(study / "controls.json")["oracles"].values()))["control"]
    d = {k: pd.read_parquet(f / "per_example.parquet").set_index("id") for k, f in
         (("control", study / "runs" / control), ("text", run))}
    ids = d["text"].index
    return pd.DataFrame({"route": route, "id": ids,
                         "D_control": (d["control"]["n_tokens"] * d["control"]["lbar"]).loc[ids].to_numpy(),
                         "D_text": (d["text"]["n_tokens"] * d["text"]["lbar"]).to_numpy()})


def add_rows(pairs: list[str]) -> pd.DataFrame:
    """``--add "ROUTE (what differs)=STUDY" ...``: the shipped rows.csv with each named study's rows in place of
    any rows of the same route name and seed (a try added without the earlier studies' folders at hand; a study
    of more seeds of a shipped route adds its seeds to that route)."""
    rows = pd.read_csv(HERE / "rows.csv")
    for p in pairs:
        route, study = p.split("=", 1)
        new = study_rows(route, Path(study))
        same = (rows["route"] == route) & rows["seed"].isin(set(new["seed"]))
        rows = pd.concat([rows[~same], new], ignore_index=True)
    return rows


def seed_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per route run at 2 or more seeds, the seed-level test: per seed the mean over its rows of gain -
    information (D_control - D_oracle - info) and of the null's gain (D_control - D_null); over the seeds their
    mean and 95 % t-interval (``zfree_lab.experiment.seed_stats.t_interval``: seeds are the replicates) and, as a
    check, the two-stage bootstrap (seeds, then rows within each; ``two_stage_bootstrap``); ``oracle_pass``:
    0 inside the t-interval of gain - information, ``null_pass``: 0 inside the null's. nats per example."""
    from zfree_lab.experiment.seed_stats import t_interval, two_stage_bootstrap

    out = []
    for route, g in rows.groupby("route", sort=False):
        seeds = sorted(g["seed"].unique())
        if len(seeds) < 2:
            continue
        rec = {"route": route, "seeds": len(seeds)}
        for key, diff in (("gain_minus_info", g["D_control"] - g["D_oracle"] - g["info"]),
                          ("null_gain", g["D_control"] - g["D_null"])):
            per_seed = [diff[g["seed"] == s].to_numpy() for s in seeds]
            t = t_interval([v.mean() for v in per_seed])
            lo, hi = two_stage_bootstrap(per_seed)
            rec.update({key: t["mean"], f"{key}_t_lo": t["lo"], f"{key}_t_hi": t["hi"], f"{key}_boot_lo": lo,
                        f"{key}_boot_hi": hi})
        rec["oracle_pass"] = bool(rec["gain_minus_info_t_lo"] <= 0 <= rec["gain_minus_info_t_hi"])
        rec["null_pass"] = bool(rec["null_gain_t_lo"] <= 0 <= rec["null_gain_t_hi"])
        out.append(rec)
    return pd.DataFrame(out)


def write_tables(rows: pd.DataFrame) -> None:
    """routes.csv (per route and seed) and, where a route has several seeds, seeds.csv, from the shipped rows."""
    route_table(rows).to_csv(HERE / "routes.csv", index=False)
    seeds = seed_table(rows)
    if len(seeds):
        seeds.to_csv(HERE / "seeds.csv", index=False)
        print(seeds.round(3).to_string(index=False))
    print(route_table(rows).round(3).to_string(index=False))


def main(pairs: list[str]) -> None:
    if pairs[:1] == ["--add"]:
        add_rows(pairs[1:]).to_csv(HERE / "rows.csv", index=False, float_format="%.9g")
        write_tables(pd.read_csv(HERE / "rows.csv"))
        return
    args = dict(p.split("=", 1) for p in pairs)
    texts = {k[len("text:"):]: Path(v) for k, v in args.items() if k.startswith("text:")}
    studies = {k: Path(v) for k, v in args.items() if not k.startswith("text:")}
    if texts:
        t = pd.concat([text_rows(r, studies[r], f) for r, f in texts.items()], ignore_index=True)
        t.to_csv(HERE / "text_rows.csv", index=False, float_format="%.9g")
    rows = pd.concat([study_rows(r, s) for r, s in studies.items()], ignore_index=True)
    rows.to_csv(HERE / "rows.csv", index=False, float_format="%.9g")
    rows = pd.read_csv(HERE / "rows.csv")  # the table from the shipped rows, as the test reads them
    write_tables(rows)
    assert np.isfinite(rows[["D_control", "D_oracle", "D_null", "info"]].to_numpy()).all()


if __name__ == "__main__":
    main(sys.argv[1:])
