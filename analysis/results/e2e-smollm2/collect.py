"""The e2e-smollm2 finding from a study folder: gains of each finished CVAE run against its own z-free
control (``zfree_lab.experiment.gains.run_gains``, 95 % bootstrap over the evaluated rows), the label
oracles finished so far (``oracle_table``), and the runs' own metrics, written beside this file and
printed as markdown with the preregistered rule applied (PREREGISTRATION.md: z is used when the
measured use is >= 50 % of the rows and the z-gain interval lies above 0).

    .venv/bin/python analysis/results/e2e-smollm2/collect.py runs/e2e-smollm2
    # only oracle_pairs.csv (every oracle against its own recipe's control), leaving the other tables:
    # for a folder that holds a later variant's runs but not the study's first ones
    .venv/bin/python analysis/results/e2e-smollm2/collect.py runs/e2e-smollm2 --oracle-pairs
    # the tables into another folder (a later study of the preset, the GPU run), leaving these alone
    .venv/bin/python analysis/results/e2e-smollm2/collect.py runs/e2e-smollm2 --into analysis/results/e2e-smollm2/preset-lrnew1e-3

Reads only; works on a study still running (runs not finished are left out, and say so).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from zfree.config import without_log_only
from zfree.core.io import read_table
from zfree_lab.experiment.gains import interval, oracle_table, run_gains
from zfree_lab.experiment.results import collect_runs
from zfree_lab.run.run_folder import read_run_config

HERE = Path(__file__).resolve().parent
KEYS = ["run_id", "weighting", "beta", "aid", "n_latent", "steps", "reference/c_base",
        "loss/val/baseline_normalized_reconstruction_loss", "loss/val/kl_prior_loss", "latent/measured_use_fraction",
        "latent/predicted_use_fraction", "latent/codes_used", "latent_used", "aid/handover_step", "wall_s"]


def control_seed_spread(runs_dir: Path) -> pd.DataFrame:
    """Pairs of finished z-free controls whose configs differ in the seed only: the difference of their
    D (nats/example, y and its end token) on the rows both evaluated, with a 95 % bootstrap interval over
    rows. The training noise a z gain must beat: the row bootstrap of a gain does not contain it."""
    ctl = {}
    for d in sorted(runs_dir.iterdir()):
        if (d / "per_example.parquet").exists() and (d / "config.json").exists():
            cfg = without_log_only(read_run_config(d / "config.json"))
            if cfg.get("latent_source") == "control":
                ctl[d.name] = cfg
    out = []
    names = list(ctl)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            ca, cb = dict(ctl[a]), dict(ctl[b])
            if ca.pop("seed") != cb.pop("seed") and ca == cb:
                pa, pb = _D(runs_dir / a), _D(runs_dir / b)
                ids = pa.index.intersection(pb.index)
                est, lo, hi = interval(pb.loc[ids, "D"].to_numpy() - pa.loc[ids, "D"].to_numpy())
                out.append({"control_a": a, "seed_a": ctl[a]["seed"], "control_b": b, "seed_b": ctl[b]["seed"],
                            "rows": len(ids), "D_a": float(pa.loc[ids, "D"].mean()), "D_b": float(pb.loc[ids, "D"].mean()),
                            "D_b_minus_D_a": est, "lo": lo, "hi": hi})
    return pd.DataFrame(out)


def _D(run: Path) -> pd.DataFrame:
    """Per row: D = n_tokens x lbar (nats/example, y and its end token), indexed by id."""
    return (read_table(run / "per_example.parquet", columns=["id", "n_tokens", "lbar"])
            .assign(D=lambda t: t["n_tokens"] * t["lbar"]).set_index("id"))


def oracle_pairs(runs_dir: Path) -> pd.DataFrame:
    """Every finished label oracle (``latent_source`` "label:<key>"), planned or trained later with
    other shared fields (e.g. a LoRA variant), against the finished z-free control of its own recipe
    (``zfree_lab.experiment.controls.control_params`` of the oracle's config): delta_R = D_control - D_oracle
    (nats/example) on the rows both evaluated, 95 % bootstrap over rows. An oracle whose control has
    not finished is listed with NaN."""
    from zfree.config import LatentSource
    from zfree_lab.experiment.controls import control_params

    cfgs = {d.name: without_log_only(read_run_config(d / "config.json")) for d in sorted(runs_dir.iterdir())
            if (d / "summary.json").exists() and (d / "config.json").exists()}
    controls = {n: c for n, c in cfgs.items() if c.get("latent_source") == "control"}
    out = []
    for n, c in cfgs.items():
        source = LatentSource.parse(c.get("latent_source"))
        if source.kind != "label":
            continue
        want = without_log_only(control_params(c))
        match = [m for m, cc in controls.items() if cc == want]
        row = {"oracle": n, "label": source.label, "K": c["n_latent"], "lora_rank": c.get("lora_rank"),
               "lora_targets": c.get("lora_targets"), "control": match[0] if match else None}
        if match:
            po, pc = _D(runs_dir / n), _D(runs_dir / match[0])
            ids = po.index.intersection(pc.index)
            est, lo, hi = interval(pc.loc[ids, "D"].to_numpy() - po.loc[ids, "D"].to_numpy())
            row.update(rows=len(ids), D_control=float(pc.loc[ids, "D"].mean()), D_oracle=float(po.loc[ids, "D"].mean()),
                       delta_R=est, delta_R_lo=lo, delta_R_hi=hi)
        out.append(row)
    return pd.DataFrame(out)


def write_oracle_pairs(study: Path) -> None:
    """oracle_pairs.csv beside this file (``oracle_pairs``), each pair printed."""
    pairs = oracle_pairs(study / "runs")
    pairs.to_csv(HERE / "oracle_pairs.csv", index=False)
    for _, o in pairs.iterrows():
        if pd.notna(o.get("delta_R")):
            print(f"\noracle run {o['oracle']} (LoRA rank {o['lora_rank']}, {o['lora_targets']}) vs {o['control']}: "
                  f"D {o['D_oracle']:.3f} vs {o['D_control']:.3f}, delta_R {o['delta_R']:.3f} "
                  f"[{o['delta_R_lo']:.3f}, {o['delta_R_hi']:.3f}] nats/example on {o['rows']} rows")
        else:
            print(f"\noracle run {o['oracle']}: its control has not finished")


def main(study: Path) -> None:
    runs = collect_runs(study / "runs")
    given = collect_runs(study / "runs", kind="given")
    gains = run_gains(study, runs) if len(runs) else pd.DataFrame()
    oracles = oracle_table(study)
    summary = runs[[k for k in KEYS if k in runs]] if len(runs) else pd.DataFrame()
    summary.to_csv(HERE / "summary.csv", index=False)
    gains.to_csv(HERE / "gains.csv", index=False)
    oracles.to_csv(HERE / "available_gain.csv", index=False)
    est = json.loads((study / "estimate.json").read_text()) if (study / "estimate.json").exists() else {}
    print(f"study {study.resolve().name}: {len(runs)} CVAE run(s) and {len(given)} control/oracle run(s) finished")
    print("estimate: " + " ".join(est.get("lines", [])))
    for _, g in gains.iterrows():
        use = float(runs.set_index("run_id").loc[g["run_id"], "latent/measured_use_fraction"])
        used = use >= 0.5 and bool(g.get("z_gain_positive", False))
        print(f"\n| {g['run_id']} | value |\n|---|---|")
        for k in ("rows", "D_base", "D_control", "D", "finetune_gain", "z_gain", "rate"):
            v = g.get(k)
            lo, hi = g.get(f"{k}_lo"), g.get(f"{k}_hi")
            ci = f" [{lo:.3f}, {hi:.3f}]" if lo is not None and pd.notna(lo) else ""
            print(f"| {k} | {v:.3f}{ci} |" if isinstance(v, float) else f"| {k} | {v} |")
        print(f"| measured use | {use:.1%} of rows |")
        print(f"| rule (use >= 50 % and z-gain interval > 0) | {'z USED' if used else 'z NOT used'} |")
    for _, o in oracles.iterrows():
        print(f"\noracle {o['label']}: delta_R {o['delta_R']:.3f} [{o['delta_R_lo']:.3f}, {o['delta_R_hi']:.3f}] "
              f"nats/example, H {o['H']:.3f} ({o['H_source']}), eta {o['eta']:.3f} [{o['eta_lo']:.3f}, {o['eta_hi']:.3f}]")
    if oracles.empty:
        print("\noracle: not finished (no available gain, no eta yet)")
    write_oracle_pairs(study)
    spread = control_seed_spread(study / "runs")
    spread.to_csv(HERE / "control_seeds.csv", index=False)
    for _, c in spread.iterrows():
        print(f"\ncontrol seed {c['seed_b']} - seed {c['seed_a']}: D {c['D_b']:.3f} - {c['D_a']:.3f} = "
              f"{c['D_b_minus_D_a']:.3f} [{c['lo']:.3f}, {c['hi']:.3f}] nats/example on {c['rows']} rows "
              f"(training noise between two identical recipes)")


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):  # the usage is the module docstring
        print(__doc__)
        sys.exit(0)
    argv = sys.argv[1:]
    if "--into" in argv:  # the tables go there instead of beside this file
        i = argv.index("--into")
        HERE = Path(argv[i + 1]).resolve()
        HERE.mkdir(parents=True, exist_ok=True)
        argv = argv[:i] + argv[i + 2:]
    args = [a for a in argv if a != "--oracle-pairs"]
    folder = Path(args[0] if args else "runs/e2e-smollm2").resolve()
    (write_oracle_pairs if "--oracle-pairs" in argv else main)(folder)
