"""The e2e-smollm2 preset's training steps on CPU or CUDA (issue 37): seconds per step, peak memory and
model FLOP utilisation (MFU) of the z-free control's step, the K-way soft step and the hard-EM step, at the
preset's settings (analysis/studies/presets/e2e-smollm2.yaml: LoRA rank 8, batch 8 of E2E train rows,
K = 4, the optimal posterior, the hard E-step on the first 3 tokens of y, distribution weighting).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 .venv/bin/python analysis/benchmarks/preset_step.py \\
        --model "$(.venv/bin/zfree model fetch smollm2-135m-instruct)" --device cpu --steps 3

Each step is what the loop runs (``zfree.objective.objectives.step_objective``, backward, AdamW over the
trainable parameters: LoRA adapters, latent embeddings, posterior and router heads).

- FLOPs are counted, not estimated: torch's own FLOP formulas (``torch.utils.flop_counter.flop_registry``,
  what ``FlopCounterMode`` sums; its module tracker fails on the step's no-grad parts) over every op of one
  whole step (forward and backward: matrix products, attention); MFU = counted FLOPs / seconds per step / the chip's
  dense peak for the precision (``bench_gpu.PEAK_TFLOPS``: fp32 is the non-tensor-core peak; since issue 56
  the steps run fp32 products on TF32 on CUDA, as the loop does, so an fp32 MFU over 100 % is possible and
  bench_large_step.py uses the TF32 peak; nan on CPU, where no peak is known).
- Seconds per step: the mean over ``--steps`` steps after one warm-up step, batches drawn from the train rows.
- Peak memory: ``torch.cuda.max_memory_allocated`` over the timed steps on CUDA; on CPU the growth of the
  process's peak RSS (a high-water mark, so a lower bound).

Prints one JSON line per step kind (and writes them to ``--json`` when given). Run it on an otherwise idle
machine: another torch process on the same cores skews every number.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gpu import PEAK_TFLOPS  # noqa: E402

from zfree.config import TrainConfig  # noqa: E402
from zfree.data.batching import collate, encode_pairs, pad_id_of  # noqa: E402
from zfree.data.pairs import load_pairs  # noqa: E402
from zfree.models.loading import load_causal_lm  # noqa: E402
from zfree.objective.objectives import GIVEN, Phase, step_objective  # noqa: E402
from zfree.models.precision import tf32_matmuls  # noqa: E402
from zfree_lab.run.run_setup import build_cvae, store_frozen_body  # noqa: E402

#: step kind -> (the objective's phase, the preset's config fields for it)
KINDS = {
    "control": (GIVEN, {"latent_source": "control", "n_latent": 1, "beta": 0.0}),
    "soft": ("discrete", {"n_latent": 4, "posterior_features": "optimal", "beta": 0.003512}),
    "hard_em": (Phase.HARD, {"n_latent": 4, "posterior_features": "optimal", "beta": 0.003512,
                             "aid": "hard_em_then_soft", "hard_em_estep_tokens": 3}),
}


class CountFlops(TorchDispatchMode):
    """Sums torch's FLOP formula of every dispatched op that has one (matrix products, convolutions,
    attention), as FlopCounterMode does, without its module tracker."""

    def __init__(self):
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            self.total += formula(*args, **kwargs, out_val=out)
        return out


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench(kind: str, backbone_dir: str, pairs, a, dev: torch.device) -> dict:
    """One step kind: build the preset's model for it, warm up, count one step's FLOPs, time ``a.steps``."""
    phase, fields = KINDS[kind]
    cfg = TrainConfig().replace(device=str(dev), precision=a.precision, weighting="distribution",
                                lora_rank=a.lora, batch_size=a.batch, **fields)
    backbone, tok = load_causal_lm(backbone_dir, device=str(dev), dtype="float32")
    torch.manual_seed(0)
    model = build_cvae(cfg, backbone).to(dev).train()
    store_frozen_body(model, cfg.optim)  # bf16: the frozen LoRA body stored in bf16, as the loop does (issue 56)
    if kind == "control":
        model.set_given({p.id: 0 for p in pairs})  # the control's one value for every row
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    enc = encode_pairs(tok, pairs)
    rng = np.random.default_rng(0)
    batches = [collate([enc[i] for i in rng.integers(0, len(enc), a.batch)], pad_id=pad_id_of(tok)).to(dev)
               for _ in range(a.steps + 2)]

    def one(b):
        with tf32_matmuls(dev):  # as the loop's steps (issue 56): fp32 products on TF32 on CUDA
            loss = step_objective(phase, model, b, cfg, 1, a.c_base, None, None).total
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    one(batches[0])  # warm-up: allocator, optimizer state
    with CountFlops() as fc:
        one(batches[1])
    flops = fc.total
    _sync(dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    rss0 = _rss_mib()
    t = time.perf_counter()
    for b in batches[2:]:
        one(b)
    _sync(dev)
    dt = (time.perf_counter() - t) / a.steps
    peak = torch.cuda.max_memory_allocated(dev) / 2**20 if dev.type == "cuda" else _rss_mib() - rss0
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    peak_tf = next((v[a.precision] for k, v in PEAK_TFLOPS.items() if k in name), float("nan"))
    tokens = float(np.mean([float((b.prefix_len + b.target_len).sum()) for b in batches[2:]]))
    return {"kind": kind, "device": name, "precision": a.precision, "threads": torch.get_num_threads(),
            "batch": a.batch, "lora_rank": a.lora, "steps": a.steps, "s_per_step": dt,
            "tokens_per_batch": tokens, "gflop_per_step": flops / 1e9, "tflop_s": flops / dt / 1e12,
            "mfu": flops / dt / (peak_tf * 1e12), "peak_mib": peak,
            "trainable_params": int(sum(p.numel() for p in params))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="model folder (zfree model fetch smollm2-135m-instruct)")
    ap.add_argument("--data", default="data/e2e/train.jsonl")
    ap.add_argument("--device", default="auto", help="auto (cuda when present), cpu, cuda")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lora", type=int, default=8, help="LoRA rank (0: full fine-tuning)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rows", type=int, default=2000, help="train rows the batches are drawn from")
    ap.add_argument("--c-base", type=float, default=2.9656, help="c_base in nats/token (scales the loss only)")
    ap.add_argument("--kinds", default="control,soft,hard_em")
    ap.add_argument("--json", default="", help="append the JSON lines to this file too")
    a = ap.parse_args()
    dev = torch.device("cuda" if a.device == "auto" and torch.cuda.is_available() else
                       ("cpu" if a.device == "auto" else a.device))
    pairs = load_pairs(Path(a.data))[: a.rows]
    for kind in a.kinds.split(","):
        row = bench(kind, a.model, pairs, a, dev)
        line = json.dumps(row)
        print(line, flush=True)
        if a.json:
            with open(a.json, "a") as f:
                f.write(line + "\n")
        if dev.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
