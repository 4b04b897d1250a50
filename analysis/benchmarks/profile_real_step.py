"""Where a training step's time goes on a real model (issue 37): the K-way CVAE step and the z-free
control's step, split by torch.profiler into the output head over the vocabulary, the body's
matrix products, attention, and the rest (optimizer, latent injection, Python).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 .venv/bin/python analysis/benchmarks/profile_real_step.py \\
        --model "$(.venv/bin/zfree model fetch smollm2-135m-instruct)" --data data/e2e --batch 8

Each mode trains a real run (``zfree train --model``: split, reference, the run) for ``--steps``
steps without evaluation in between; the last step is profiled (the first ones warm the allocator
and the optimizer's state). Prints one JSON line per mode: seconds per step and the shares. Run it
on an otherwise idle machine: another torch process on the same cores skews every number.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from collections import defaultdict
from pathlib import Path


def classify(event, vocab: int) -> str:
    """A profiler event's share: head (a product whose output or weight has the vocabulary's size),
    body matmul, attention, or other."""
    name = event.key
    shapes = [tuple(s) for s in (event.input_shapes or []) if s]
    if name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear"):
        return "head" if any(vocab in s for s in shapes) else "body_matmul"
    if "attention" in name or "softmax" in name and not any(vocab in s for s in shapes):
        return "attention"
    if any(vocab in s for s in shapes):
        return "head"
    return "other"


def profile_mode(model: str, data: Path, out: Path, mode: str, steps: int, batch: int, k: int, lora: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    import zfree_lab.run.training as T
    from zfree_lab.experiment.own_study import own_train_config

    run = out / mode
    shutil.rmtree(run, ignore_errors=True)
    over = {"steps": steps, "eval_every": steps, "eval_rows": 4, "decode_rows": 0, "batch_size": batch,
            "warmup_backbone": 1, "device": "cpu", "n_latent": k, "lora_rank": lora, "weighting": "distribution",
            "beta": 0.01}
    if mode == "control":
        over.update({"latent_source": "control", "n_latent": 1, "beta": 0.0})
    elif mode == "hard_em":
        over.update({"aid": "hard_em_then_soft", "posterior_features": "optimal", "hard_em_estep_tokens": 3,
                     "hard_em_max_steps": steps + 10, "handover_check_every": 10 ** 6})
    else:
        over.update({"posterior_features": "optimal"})
    val = out / "val-16.jsonl"  # 16 rows spread over the val MRs: the reference scores only these
    if not val.exists():
        from zfree.data.pairs import load_pairs
        from zfree_lab.run.split import spread_sample, write_pairs

        out.mkdir(parents=True, exist_ok=True)
        write_pairs(spread_sample(load_pairs(data / "val.jsonl"), 16), val)
    cfg = own_train_config(model, str(data / "train.jsonl"), run, val=str(val), overrides=over)
    times, shares = [], defaultdict(float)
    orig_step, orig_opt = T._step_breakdown, T._optimizer_step
    state = {"n": 0, "prof": None}

    def step(*a, **kw):
        state["n"] += 1
        state["t"] = time.perf_counter()
        if state["n"] == steps:
            state["prof"] = profile(activities=[ProfilerActivity.CPU], record_shapes=True)
            state["prof"].__enter__()
        return orig_step(*a, **kw)

    def opt(*a, **kw):
        r = orig_opt(*a, **kw)
        times.append(time.perf_counter() - state["t"])
        if state["prof"] is not None:
            state["prof"].__exit__(None, None, None)
        return r

    T._step_breakdown, T._optimizer_step = step, opt
    try:
        T.train_cvae(cfg, run, progress=False)
    finally:
        T._step_breakdown, T._optimizer_step = orig_step, orig_opt
    vocab = json.loads((Path(cfg.base_dir) / "model" / "config.json").read_text())["vocab_size"]
    total = 0.0
    for ev in state["prof"].key_averages(group_by_input_shape=True):
        shares[classify(ev, vocab)] += ev.self_cpu_time_total / 1e6
        total += ev.self_cpu_time_total / 1e6
    return {"mode": mode, "batch": batch, "K": k if mode != "control" else 1, "lora_rank": lora,
            "step_s": [round(t, 2) for t in times], "last_step_s": round(times[-1], 2),
            "shares": {c: round(v / total, 3) for c, v in sorted(shares.items())}, "threads": torch.get_num_threads()}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="model folder")
    ap.add_argument("--data", default="data/e2e", help="folder with train.jsonl and val.jsonl")
    ap.add_argument("--out", default="runs/profile-real-step")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--lora", type=int, default=8, help="LoRA rank (0: full fine-tuning)")
    ap.add_argument("--modes", default="control,soft,hard_em")
    a = ap.parse_args()
    for m in a.modes.split(","):
        print(json.dumps(profile_mode(a.model, Path(a.data), Path(a.out), m, a.steps, a.batch, a.k, a.lora)), flush=True)
