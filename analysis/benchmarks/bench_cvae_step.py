"""Training-step time of the discrete CVAE (soft K-way step, and the hard-EM step that
differentiates only the chosen value's pass) and of the continuous CVAE (S samples) relative to
the base model's own step on the same batches, against the shared-prefix ideal
(|x| + K*|y|) / (|x| + |y|) (issue: both CVAEs); peak memory of each path in a fresh process.

Measured side by side in one process, interleaved, median of repeats; not a timed test.
Usage: OMP_NUM_THREADS=1 .venv/bin/python analysis/benchmarks/bench_cvae_step.py [--steps 12] [--batch 64]
Run it on an otherwise idle machine: another torch process on the same cores skews every ratio.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import subprocess
import sys
import threading
import time

import numpy as np
import torch

from zfree.config import ObjectiveConfig
from zfree.data.batching import collate, encode_pair
from zfree.data.pairs import load_pairs
from zfree_lab.run.tokenizer import build_digit_tokenizer
from zfree.models.nll import masked_mean_token_nll
from zfree.models.base import build_synthetic_gpt2, target_logprobs
from zfree.models.continuous import ContinuousCVAE
from zfree.models.discrete import DiscreteCVAE
from zfree.objective.objectives import assemble_objective


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="data/synth/default/val.jsonl")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", help=argparse.SUPPRESS)  # internal: one path in a fresh process, for peak RSS
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    tok = build_digit_tokenizer(10)
    enc = [encode_pair(tok, p) for p in load_pairs(a.data)]
    rng = np.random.default_rng(0)
    batches = [collate([enc[i] for i in rng.integers(0, len(enc), a.batch)]) for _ in range(a.steps)]
    x_tok = np.mean([float((b.prefix_len - 1).sum()) for b in batches])  # [bos] + x
    y_tok = np.mean([float(b.target_len.sum()) for b in batches])  # sep .. y: the z-dependent suffix
    obj = ObjectiveConfig(weighting="plain", beta=0.3)

    def make(kind, K):
        torch.manual_seed(0)
        base = build_synthetic_gpt2(len(tok))
        if kind == "base":
            m = base
        elif kind == "continuous":
            m = ContinuousCVAE(base, 16, n_samples=K)
        else:
            m = DiscreteCVAE(base, K)
            m.shared_prefix = kind != "naive"
        return m, torch.optim.AdamW(m.parameters(), 1e-4)

    def step(kind, m, opt, b):
        if kind == "base":
            loss = masked_mean_token_nll(-target_logprobs(m, b), b.target_mask).mean()
        elif kind == "continuous":
            o = m(b)
            loss = masked_mean_token_nll(-o.target_logprobs, b.target_mask).mean() + 0.3 * (
                o.posterior_mean ** 2).mean()
        elif kind == "hard":  # objectives.hard_em_objective's passes: K-way without gradient, one with
            sel = m.forward_selected(b, "best")
            o, tlp = sel.out, sel.selected_logprobs
            loss = masked_mean_token_nll(-tlp, b.target_mask).mean() + torch.nn.functional.cross_entropy(
                o.posterior_logits, o.posterior_logits.argmax(-1))
        else:
            o = m(b)
            r = masked_mean_token_nll(-o.target_logprobs, b.target_mask)
            loss = assemble_objective(obj, recon_per_latent=r, q_logits=o.posterior_logits, p_logits=o.prior_logits,
                                      target_len=b.target_len).total
        opt.zero_grad()
        loss.backward()
        opt.step()

    configs = [("base", 0), ("shared", 4), ("naive", 4), ("shared", 6), ("hard", 6), ("shared", 8), ("naive", 8),
               ("continuous", 1), ("continuous", 4)]
    if a.only:
        kind, K = a.only.split(":")
        c = (kind, int(K))
        m, opt = make(*c)
        gc.collect()
        before = _rss_mib()  # current resident memory: interpreter, model, batches
        peak, stop = [before], threading.Event()

        def sample():  # the high-water mark of ru_maxrss is set by imports and data loading, so sample
            while not stop.is_set():  # the current RSS during the steps (large tensors are mmapped
                peak.append(_rss_mib())  # and returned to the OS when freed)
                time.sleep(0.0005)

        t = threading.Thread(target=sample)
        t.start()
        for b in batches[:3]:
            step(kind, m, opt, b)
        stop.set()
        t.join()
        print(json.dumps({"maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                          "step_mib": max(peak) - before}))
        return
    models = {c: make(*c) for c in configs}
    times = {c: [] for c in configs}
    for c in configs:  # warm-up
        step(c[0], *models[c], batches[0])
    for b in batches:  # interleaved, so drifts in machine load hit every path alike
        for c in configs:
            t = time.perf_counter()
            step(c[0], *models[c], b)
            times[c].append(time.perf_counter() - t)
    peaks = {}  # peak resident memory of a fresh process that builds one path and runs 3 steps
    for c in configs:
        r = subprocess.run([sys.executable, __file__, "--data", a.data, "--steps", "3", "--batch", str(a.batch),
                            "--threads", str(a.threads), "--only", f"{c[0]}:{c[1]}"], capture_output=True, text=True)
        peaks[c] = json.loads(r.stdout.strip().splitlines()[-1])
    t_base = np.median(times[("base", 0)])
    print(f"batch {a.batch}, {a.steps} steps, threads {a.threads}; mean tokens per batch: prefix [bos]+x {x_tok:.0f}, "
          f"z-dependent suffix {y_tok:.0f}")
    print(f"{'path':<14}{'K/S':>4}{'ms/step':>10}{'x base':>9}{'ideal':>8}{'x ideal':>9}{'peak RSS MiB':>14}"
          f"{'step MiB':>10}{'x base':>8}")
    for c in configs:
        kind, K = c
        t = np.median(times[c])
        ideal = 1.0 if kind == "base" else (x_tok + K * y_tok) / (x_tok + y_tok)
        p, p0 = peaks[c], peaks[("base", 0)]
        print(f"{kind:<14}{K:>4}{1000 * t:>10.1f}{t / t_base:>9.2f}{ideal:>8.2f}{t / t_base / ideal:>9.2f}"
              f"{p['maxrss_mib']:>14.0f}{p['step_mib']:>10.0f}{p['step_mib'] / max(p0['step_mib'], 1e-9):>8.2f}")
    print("ideal = (|x| + K|y|)/(|x| + |y|): one pass over x, K over the y-region; the z-free posterior pass "
          "is counted inside the CVAE's time, so the target is x ideal <= 1.25 for K = 4. hard: the hard-EM "
          "step (ideal counts its K-way pass at full cost). continuous: K/S = posterior samples. step MiB: the "
          "peak resident memory added by 3 training steps over the built model (activations, gradients, "
          "optimizer state).")


if __name__ == "__main__":
    main()
