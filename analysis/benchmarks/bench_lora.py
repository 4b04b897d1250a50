"""Full fine-tuning against LoRA on one model (issue 24): checkpoint size and step time.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 .venv/bin/python analysis/benchmarks/bench_lora.py \
        --model "$(.venv/bin/zfree model fetch smollm2-135m-instruct)" --data data/e2e/train.jsonl --out runs/bench-lora

Each mode trains one discrete CVAE (``zfree train --model``: split, reference, the run) for ``--steps``
steps at ``--batch`` rows, evaluating at step 0 and at the end on the same few rows; the step time
is (wall at the end - 2 x the step-0 evaluation) / steps. Prints one JSON line per mode."""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path


def bench(model: str, data: str, out: Path, mode: str, steps: int, batch: int) -> dict:
    """One mode's numbers: checkpoint bytes, step seconds, trainable parameters."""
    from zfree_lab.experiment.own_study import own_train_config
    from zfree_lab.run.training import train_cvae

    run = out / mode
    shutil.rmtree(run, ignore_errors=True)
    over = {"steps": steps, "eval_every": steps, "eval_rows": 8, "decode_rows": 0, "batch_size": batch,
            "warmup_backbone": 1, "device": "cpu", **({"lora_rank": 8} if mode == "lora" else {})}
    cfg = own_train_config(model, data, run, overrides=over)
    t0 = time.time()
    train_cvae(cfg, run, progress=False)
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    ck = sum(f.stat().st_size for f in (run / "checkpoint").iterdir())
    return {"mode": mode, "checkpoint_bytes": ck, "checkpoint_mb": round(ck / 2**20, 2),
            "step_s": round((rows[-1]["wall_s"] - 2 * rows[0]["wall_s"]) / steps, 3), "batch": batch,
            "steps": steps, "run_s": round(time.time() - t0, 1)}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="model folder, .gguf or hub id")
    ap.add_argument("--data", required=True, help="JSONL pairs")
    ap.add_argument("--out", default="runs/bench-lora", help="folder of the two runs")
    ap.add_argument("--steps", type=int, default=4, help="training steps per mode")
    ap.add_argument("--batch", type=int, default=8, help="rows per step")
    a = ap.parse_args()
    for mode in ("full", "lora"):
        print(json.dumps(bench(a.model, a.data, Path(a.out), mode, a.steps, a.batch)), flush=True)
