"""Two studies of the e2e-smollm2 preset that differ in the seed only: each run against the same run of the
other seed, and each seed's z gain and oracle against its own control (PREREGISTRATION.md, "Seed 1").

    .venv/bin/python analysis/results/e2e-smollm2/seeds.py runs/e2e-smollm2 runs/e2e-smollm2-seed1

Writes seeds.csv beside this file and prints it as markdown. Runs are named ``STUDY/RUN_ID`` (the study
folder's name and the run's id), never by a path on the machine that ran them. For each role (the aided run, the z-free
control, the `complete` oracle): D of each seed (nats/example, y and its end token) on the rows both
evaluated, and D(second) - D(first) with a 95 % bootstrap over rows (``zfree_lab.experiment.gains.interval``).
The row bootstrap of one pair's gain does not contain the training noise; the controls' seed difference is
that noise, measured once. Reads only.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from zfree.config import LatentSource
from zfree.core.io import read_json
from zfree_lab.experiment.gains import interval

HERE = Path(__file__).resolve().parent


def _D(run: Path) -> pd.Series:
    """Per row: D = n_tokens x lbar (nats/example), indexed by id."""
    t = pd.read_parquet(run / "per_example.parquet", columns=["id", "n_tokens", "lbar"])
    return (t["n_tokens"] * t["lbar"]).set_axis(t["id"])


def roles(study: Path) -> dict[str, Path]:
    """The finished runs of ``study`` by role: "aided" (the CVAE run), "control", "oracle"."""
    out = {}
    for d in sorted((study / "runs").iterdir()):
        if not (d / "summary.json").exists():
            continue
        source = LatentSource.parse(read_json(d / "config.json").get("latent_source"))
        out[{"posterior": "aided", "control": "control", "label": "oracle"}[source.kind]] = d
    return out


def run_name(run: Path) -> str:
    """``STUDY/RUN_ID`` of a run folder ``STUDY/runs/RUN_ID``: no machine path in a shipped table."""
    run = run.resolve()
    return f"{run.parent.parent.name}/{run.name}"


def pair(a: Path, b: Path) -> dict:
    """D of runs ``a`` and ``b`` on their common rows and D(b) - D(a) with its interval."""
    da, db = _D(a), _D(b)
    ids = da.index.intersection(db.index)
    est, lo, hi = interval(db.loc[ids].to_numpy() - da.loc[ids].to_numpy())
    return {"rows": len(ids), "D_a": float(da.loc[ids].mean()), "D_b": float(db.loc[ids].mean()),
            "D_b_minus_D_a": est, "lo": lo, "hi": hi}


def main(first: Path, second: Path) -> pd.DataFrame:
    r1, r2 = roles(first), roles(second)
    rows = []
    for role in ("aided", "control", "oracle"):  # the same run, the other seed
        if role in r1 and role in r2:
            rows.append({"compare": f"{role}: seed b vs seed a", "a": run_name(r1[role]), "b": run_name(r2[role]),
                         **pair(r1[role], r2[role])})
    for name, r in (("a", r1), ("b", r2)):  # each seed against its own control: -(D_run - D_control)
        for role, what in (("aided", "z gain"), ("oracle", "oracle delta_R")):
            if role in r and "control" in r:
                p = pair(r[role], r["control"])  # D_control - D_run
                rows.append({"compare": f"{what}, seed {name}", "a": run_name(r[role]), "b": run_name(r["control"]), **p})
    out = pd.DataFrame(rows)
    out.to_csv(HERE / "seeds.csv", index=False)
    print("| comparison | rows | D_a | D_b | D_b − D_a [95 %] |\n|---|---|---|---|---|")
    for _, x in out.iterrows():
        print(f"| {x['compare']} | {x['rows']} | {x['D_a']:.3f} | {x['D_b']:.3f} | "
              f"{x['D_b_minus_D_a']:.3f} [{x['lo']:.3f}, {x['hi']:.3f}] |")
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: seeds.py STUDY_SEED_A STUDY_SEED_B")
    main(Path(sys.argv[1]), Path(sys.argv[2]))
