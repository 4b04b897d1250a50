"""Switch-on speed (issue 15, part 1): steps and wall time until alignment NMI (m = 1) >= 0.9 and
rho_recon <= 0.3 for distribution weighting at beta = 0.3 on one core, for the old recipe
(``remedies.HARD_EM_RECIPE``) and the new one (``remedies.SWITCH_ON_RECIPE``), each seed, side by side.

Every recipe x seed runs ``training.train_cvae`` unchanged in its own process (one torch thread,
``--jobs`` at a time, all started together, so the recipes share the machine's load). The
benchmark's own evaluations (every ``--every`` steps on the first ``--eval-rows`` validation rows,
the same rows for every recipe) stop a run once both targets hold or at ``--cap`` steps; their
time is subtracted from the wall time (the recipe's own hand-over gate is counted). Steps are
machine-independent; wall times are only comparable within one invocation.

Usage (the exact command of analysis/results/switch_on_variants.md):
  OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 .venv/bin/python analysis/benchmarks/bench_switch_on.py \
      --recipes old new --seeds 0 1 --cap 1300 --every 50 --jobs 2
  extra variants: --variant 'name={"lr_new": 0.01}' (flat TrainConfig fields over the new recipe;
  'name=old:{...}' over the old one).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import tempfile
import time
from pathlib import Path

NMI_KEY, RHO_KEY = "structure/alignment_nmi_unambiguous", "loss/val/baseline_normalized_reconstruction_loss"


class Reached(Exception):
    """Raised from the benchmark's evaluation once both targets hold (stops train_cvae)."""


def _child(name: str, overrides: dict, seed: int, a: argparse.Namespace, q) -> None:
    import torch
    from sklearn.metrics import normalized_mutual_info_score

    torch.set_num_threads(1)
    from zfree_lab.run import training
    from zfree.config import TrainConfig

    flat = {**TrainConfig().to_flat(), "weighting": "distribution", "beta": 0.3, "batch_size": 64, **overrides,
            "seed": seed, "steps": a.cap, "eval_every": a.every, "eval_rows": max(a.eval_rows, 500),
            "decode_rows": 8, "checkpoint_every": 0, "data_dir": a.data_dir, "base_dir": a.base_dir}
    cfg = TrainConfig.from_flat(flat)
    real = training.evaluate
    clock = {"t0": None, "eval": 0.0}
    hist = []

    def bench_eval(model, val, val_pairs, *, step, b, **kw):
        t = time.time()
        if clock["t0"] is None:
            clock["t0"] = t
        n = a.eval_rows
        ev = real(model, val[:n], val_pairs[:n], step=step, b=b[:n], **kw)
        clock["eval"] += time.time() - t
        wall = time.time() - clock["t0"] - clock["eval"]
        nmi, rho = ev.metrics.get(NMI_KEY, float("nan")), ev.metrics.get(RHO_KEY, float("nan"))
        hist.append({"step": step, "wall_s": wall, "nmi1": nmi, "rho": rho,
                     "kl": ev.metrics.get("loss/val/kl_prior_loss"), "phase_soft": None})
        df = ev.per_example
        un = df["n_consistent"] == 1
        nmi_k = normalized_mutual_info_score(df["strategy"][un], df["oracle_latent"][un])  # k* = argmin_k nll_k
        hist[-1]["nmi1_kstar"] = float(nmi_k)
        print(f"{name} seed {seed} step {step} wall {wall:.0f} s NMI1 {nmi:.3f} rho {rho:.3f} "
              f"(k* NMI1 {nmi_k:.3f}, oracle rho {ev.metrics.get('latent/oracle_rho', float('nan')):.3f})", flush=True)
        if a.confusion:  # posterior argmax (rows) against the true strategy, m = 1 rows
            from zfree.evaluate.latent_stats import confusion
            print(confusion(ev.per_example).to_string(), flush=True)
        if step > 0 and nmi >= a.nmi and rho <= a.rho:
            raise Reached
        return ev

    training.evaluate = bench_eval
    out = Path(tempfile.mkdtemp(prefix=f"bench-{name}-{seed}-"))
    reached = False
    try:
        training.train_cvae(cfg, out / "run", progress=False)
    except Reached:
        reached = True
    gate = []
    mpath = out / "run" / "metrics.jsonl"
    if mpath.exists():
        rows = [json.loads(x) for x in mpath.read_text().splitlines() if x.strip()]
        gate = [r.get("aid/handover_step") for r in rows if r.get("aid/handover_step") is not None][-1:]
    q.put({"name": name, "seed": seed, "reached": reached, "hist": hist, "handover": gate[0] if gate else None})


def main() -> None:
    from zfree.objective.remedies import HARD_EM_RECIPE, SWITCH_ON_RECIPE

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipes", nargs="*", default=["old", "new"])
    ap.add_argument("--variant", action="append", default=[], help="name={json} over new, or name=old:{json}")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    ap.add_argument("--cap", type=int, default=1300, help="step cap per run")
    ap.add_argument("--every", type=int, default=50, help="benchmark evaluation every N steps")
    ap.add_argument("--eval-rows", type=int, default=300)
    ap.add_argument("--nmi", type=float, default=0.9)
    ap.add_argument("--rho", type=float, default=0.3)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--data-dir", default="data/synth/default")
    ap.add_argument("--base-dir", default="data/base/default")
    ap.add_argument("--json", help="also write the per-run histories here")
    ap.add_argument("--confusion", action="store_true", help="print the m = 1 confusion table at each evaluation")
    a = ap.parse_args()
    recipes = {"old": HARD_EM_RECIPE, "new": SWITCH_ON_RECIPE}
    chosen = {r: recipes[r] for r in a.recipes}
    for v in a.variant:
        name, spec = v.split("=", 1)
        base = HARD_EM_RECIPE if spec.startswith("old:") else SWITCH_ON_RECIPE
        chosen[name] = {**base, **json.loads(spec.removeprefix("old:"))}
    load = os.getloadavg()
    print(f"load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores; "
          f"{len(chosen) * len(a.seeds)} runs, {a.jobs} at a time", flush=True)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    todo = [(n, o, s) for s in a.seeds for n, o in chosen.items()]
    procs, results = [], []
    while todo or procs:
        while todo and len(procs) < a.jobs:
            n, o, s = todo.pop(0)
            p = ctx.Process(target=_child, args=(n, o, s, a, q))
            p.start()
            procs.append(p)
        while not q.empty() or all(p.is_alive() for p in procs) and procs:
            try:
                results.append(q.get(timeout=5))
                break
            except Exception:
                continue
        procs = [p for p in procs if p.is_alive() or p.join() or False]
    while not q.empty():
        results.append(q.get())
    print(f"load average at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'recipe':14s} {'seed':>4s} {'steps':>6s} {'wall_s':>8s} {'s/step':>7s} {'NMI1':>6s} {'rho':>6s} handover reached")
    by, reached = {}, {}
    for r in sorted(results, key=lambda r: (r["seed"], r["name"])):
        last = r["hist"][-1]
        by[(r["name"], r["seed"])] = last
        reached[(r["name"], r["seed"])] = r["reached"]
        print(f"{r['name']:14s} {r['seed']:4d} {last['step']:6d} {last['wall_s']:8.0f} "
              f"{last['wall_s'] / max(1, last['step']):7.3f} {last['nmi1']:6.3f} {last['rho']:6.3f} "
              f"{str(r['handover']):>8s} {r['reached']}")
    for n in chosen:
        if n == "old":
            continue
        for s in a.seeds:
            if ("old", s) in by and (n, s) in by:
                o, x = by[("old", s)], by[(n, s)]
                note = "" if reached[("old", s)] and reached[(n, s)] else " (a target not reached: not a ratio to target)"
                print(f"ratio old/{n} seed {s}: steps {o['step'] / max(1, x['step']):.2f}, "
                      f"wall {o['wall_s'] / max(1e-9, x['wall_s']):.2f}{note}")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
