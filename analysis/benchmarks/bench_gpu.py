"""GPU benchmark (issue 16): scoring tokens/s, model FLOP utilisation (MFU) and peak memory, and
the CVAE training step's time and peak memory against the shared-prefix ideal, in fp32 and bf16.

Rows run on CUDA when present (``no CUDA: skipped GPU rows`` otherwise) and on the CPU in fp32
(small: ``--cpu-steps``). The model is the shipped base run (``--model``, default
data/base/default/model), or any causal LM folder / GGUF file zfree loads; the pairs are
``--data`` (default data/synth/default/val.jsonl).

  scoring   ``zfree.reference.scoring.score_pairs`` (token-budget batches, ``--batch-tokens``); tokens/s
            counts every real token of (x, y) passed through the model; FLOPs = 2 N tokens with
            N the parameters outside the input embedding (forward only; attention FLOPs left out,
            so MFU is a lower bound); MFU = FLOP/s / the chip's dense peak for the dtype
            (``PEAK_TFLOPS`` by device name, or ``--peak-tflops``; nan when unknown).
  cvae      one training step as ``zfree_lab.run.training`` runs it (``build_cvae``, ``step_objective``,
            AdamW) for the base model's own step, the discrete CVAE (K values, shared prefix and
            the full pass) and the continuous CVAE (S samples); x base = step time over the base
            step; ideal = (|x| + K|y|) / (|x| + |y|) (one pass over the x-prefix, K over the
            y-region); x ideal = x base / ideal (1 = the shared-prefix ideal reached). FLOPs of a
            step = 6 N (|x| + K|y|) per row (forward + backward of the ideal token count).
  memory    CUDA: torch.cuda.max_memory_allocated over the timed calls; CPU: growth of the process's
            peak RSS (a high-water mark, so a lower bound; bench_cvae_step.py measures CPU peaks per path).
  head      (CUDA only; issue 24) bench_head_chunks.py's table on CUDA, fp32 and bf16: a tiny body
            (2 layers, width 64) at vocabularies ``--head-vocabs``, batch 32, |x| = |y| = 20: base,
            soft K-way, hard-EM and continuous steps with the chunked head, and base / soft with the
            whole head; peak = torch.cuda.max_memory_allocated of one step over what was allocated before.

Usage: .venv/bin/python analysis/benchmarks/bench_gpu.py [--model DIR] [--batch 64] [--steps 10]
TF32 stays off (torch's default), so fp32 rows are true fp32.
"""

from __future__ import annotations

import argparse
import copy
import resource
import time
from pathlib import Path

import numpy as np
import torch

from zfree.config import TrainConfig
from zfree.data.batching import collate, encode_pairs, pad_id_of
from zfree.data.pairs import load_pairs
from zfree.models.loading import load_causal_lm
from zfree.objective.objectives import step_objective
from zfree.reference.scoring import score_pairs
from zfree_lab.run.run_setup import build_cvae

#: dense peak TFLOP/s by a substring of torch.cuda.get_device_name and dtype (vendor data sheets,
#: SXM parts; fp32 = non-tensor-core fp32, as TF32 is off)
PEAK_TFLOPS = {"H200": {"bf16": 989.0, "fp32": 67.0}, "H100": {"bf16": 989.0, "fp32": 67.0},
               "A100": {"bf16": 312.0, "fp32": 19.5}, "L40S": {"bf16": 362.0, "fp32": 91.6},
               "L4": {"bf16": 121.0, "fp32": 30.3}, "A10": {"bf16": 125.0, "fp32": 31.2}}


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _peak_reset(dev):
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _peak_mib(dev, rss0):
    if dev.type == "cuda":
        return torch.cuda.max_memory_allocated(dev) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - rss0


def _peak_tflops(dev, precision, override):
    if override:
        return override
    if dev.type != "cuda":
        return float("nan")
    name = torch.cuda.get_device_name(dev)
    return next((v[precision] for k, v in PEAK_TFLOPS.items() if k in name), float("nan"))


def _n_params(model) -> int:
    emb = model.get_input_embeddings().weight
    return sum(p.numel() for p in model.parameters() if p is not emb) + (
        emb.numel() if model.get_output_embeddings() is not None and model.get_output_embeddings().weight is emb else 0)


def bench_scoring(folder, pairs, dev, precision, a):
    model, tok = load_causal_lm(folder, device=str(dev), dtype="bfloat16" if precision == "bf16" else "float32")
    enc = encode_pairs(tok, pairs)
    tokens = sum(len(e.prefix_ids) + len(e.target_ids) for e in enc)
    score_pairs(model, tok, pairs[:64], cache=False, max_batch_tokens=a.batch_tokens)  # warm-up
    _sync(dev)
    rss0 = _peak_reset(dev)
    times = []
    for _ in range(a.repeats):
        t = time.perf_counter()
        score_pairs(model, tok, pairs, cache=False, max_batch_tokens=a.batch_tokens)
        _sync(dev)
        times.append(time.perf_counter() - t)
    t = min(times)
    flops = 2 * _n_params(model) * tokens / t
    return {"tok_s": tokens / t, "mfu": flops / (_peak_tflops(dev, precision, a.peak_tflops) * 1e12),
            "peak": _peak_mib(dev, rss0)}


def bench_steps(folder, pairs, dev, precision, a, steps):
    backbone, tok = load_causal_lm(folder, device=str(dev), dtype="float32")
    enc = encode_pairs(tok, pairs)
    rng = np.random.default_rng(0)
    batches = [collate([enc[i] for i in rng.integers(0, len(enc), a.batch)], pad_id=pad_id_of(tok))
               for _ in range(steps + 1)]
    x_tok = np.mean([float((b.prefix_len - 1).sum()) for b in batches])
    y_tok = np.mean([float(b.target_len.sum()) for b in batches])
    batches = [b.to(dev) for b in batches]
    N = _n_params(backbone)
    rows = {}
    paths = [("base", 1, "auto"), ("discrete", a.K, "auto"), ("discrete", a.K, "off"), ("continuous", a.K, "auto")]
    base_t = None
    for kind, K, sp in paths:
        cfg = TrainConfig().replace(device=str(dev), precision=precision, weighting="distribution", beta=0.3,
                                    latent_kind="continuous" if kind == "continuous" else "discrete",
                                    n_latent=max(K, 2), n_samples=K, shared_prefix=sp)
        torch.manual_seed(0)
        if kind == "base":
            model = copy.deepcopy(backbone).train()
        else:
            model = build_cvae(cfg, copy.deepcopy(backbone))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

        def one(b):
            if kind == "base":
                from zfree.models.nll import masked_mean_token_nll
                from zfree.models.base import target_logprobs
                from zfree.models.precision import body_autocast

                with body_autocast(precision, dev):
                    loss = masked_mean_token_nll(-target_logprobs(model, b), b.target_mask).mean()
            else:
                loss = step_objective(kind, model, b, cfg, 1, 2.0, None, None).total
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        one(batches[0])  # warm-up (head check, allocator)
        _sync(dev)
        rss0 = _peak_reset(dev)
        t = time.perf_counter()
        for b in batches[1:]:
            one(b)
        _sync(dev)
        dt = (time.perf_counter() - t) / steps
        base_t = dt if kind == "base" else base_t
        ideal = 1.0 if kind == "base" else (x_tok + K * y_tok) / (x_tok + y_tok)
        flops = 6 * N * (x_tok + (1 if kind == "base" else K) * y_tok) / dt
        rows[f"{kind} K={K} prefix={sp}"] = {"ms": 1000 * dt, "x_base": dt / base_t, "ideal": ideal,
                                             "x_ideal": dt / base_t / ideal, "peak": _peak_mib(dev, rss0),
                                             "mfu": flops / (_peak_tflops(dev, precision, a.peak_tflops) * 1e12)}
        del model, opt
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return rows, x_tok, y_tok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="data/base/default/model")
    ap.add_argument("--data", default="data/synth/default/val.jsonl")
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--K", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--cpu-steps", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-tokens", type=int, default=8192)
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="override the chip's dense peak (TFLOP/s)")
    ap.add_argument("--head-vocabs", default="50257,128256", help="vocabularies of the head-chunk rows ('' to skip)")
    a = ap.parse_args()
    pairs = load_pairs(Path(a.data))[: a.rows]
    targets = [(torch.device("cpu"), "fp32", a.cpu_steps)]
    if torch.cuda.is_available():
        targets = [(torch.device("cuda"), p, a.steps) for p in ("fp32", "bf16")] + targets
        print(f"device: {torch.cuda.get_device_name(0)}; torch {torch.__version__}")
    else:
        print("no CUDA: skipped GPU rows")
    print(f"model {a.model}, {len(pairs)} rows, batch {a.batch}, K = S = {a.K}")
    for dev, precision, steps in targets:
        s = bench_scoring(a.model, pairs if dev.type == "cuda" else pairs[:256], dev, precision, a)
        print(f"\n== {dev.type} {precision}: scoring {s['tok_s']:,.0f} tokens/s, MFU {s['mfu']:.3f}, "
              f"peak {s['peak']:.0f} MiB")
        rows, x_tok, y_tok = bench_steps(a.model, pairs, dev, precision, a, steps)
        print(f"training step, mean tokens per batch: prefix {x_tok:.0f}, suffix {y_tok:.0f}; {steps} steps")
        print(f"{'path':<32}{'ms/step':>10}{'x base':>8}{'ideal':>7}{'x ideal':>9}{'MFU':>7}{'peak MiB':>10}")
        for name, r in rows.items():
            print(f"{name:<32}{r['ms']:>10.1f}{r['x_base']:>8.2f}{r['ideal']:>7.2f}{r['x_ideal']:>9.2f}"
                  f"{r['mfu']:>7.3f}{r['peak']:>10.0f}")
    if torch.cuda.is_available():
        bench_head(a)


def bench_head(a) -> None:
    """bench_head_chunks.py's rows on CUDA (fp32, bf16) for each of ``--head-vocabs``."""
    import bench_head_chunks as hc  # beside this file (the script's folder is on sys.path)
    from zfree.models.base import build_synthetic_gpt2

    for V in [int(v) for v in a.head_vocabs.split(",") if v]:
        for precision in ("fp32", "bf16"):
            hc.run("tiny body (2 layers, width 64)", lambda: build_synthetic_gpt2(V, n_layer=2, n_embd=64, n_head=4),
                   hc.batches(V, 4, 32, 20, 20), 4, 3, True, dev=torch.device("cuda"), precision=precision)


if __name__ == "__main__":
    main()
