"""The vocabulary's cost in a CVAE training step (issue 24 item 1): step time and peak step memory of
the base step and the discrete CVAE's soft K-way step under each head scheme, side by side in one
process, plus the hard-EM step and the continuous CVAE's S-sample step under the default scheme, for
a tiny body at vocabularies 1k, 50k and 128k and for SmolLM2-135M (vocabulary 49 152) when its
folder is there. Head schemes (``zfree.models.head_chunks``):

  function    chunks of HEAD_CHUNK_ELEMENTS logits, gradient by ``_HeadLogprobs`` (the default)
  checkpoint  the same chunks under ``torch.utils.checkpoint`` (the scheme before the Function)
  whole       ``set_head_chunk(None)``: the (rows x vocab) logits at once (the path before item 1)

  ms/step   median over --steps interleaved steps (forward, backward, AdamW), after a warm-up step
  x base    over the base step under the same head scheme, same model and batches
  ideal     (|x| + K|y|) / (|x| + |y|): one body pass over x, K over the y-region (bench_cvae_step.py);
            the head runs on the K|y| rows only, so where the head dominates (large vocab, tiny body)
            the head's own ideal is K (+ the z-free pass's forward), above this one
  x ideal   x base / ideal
  /ckpt     ms/step over the same step's under the checkpoint scheme (< 1: the Function is faster)
  peak MiB  the high-water mark of live tensor storage created during one step
            (``zfree.core.memory.LiveTensorBytes``: deterministic, allocator- and load-independent;
            the model and optimizer state, built before, are not counted; gradients are); on CUDA
            (``run(..., dev=cuda)``, called by bench_gpu.py) torch.cuda.max_memory_allocated over
            what was allocated before the step; "x base" beside it as for time

Usage: OMP_NUM_THREADS=1 .venv/bin/python analysis/benchmarks/bench_head_chunks.py [--steps 3] [--batch 32]
Side by side in one process; run it on an otherwise idle machine (ratios, not absolute times, are the result).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from pathlib import Path

import numpy as np
import torch

from zfree.config import ObjectiveConfig
from zfree.core.memory import LiveTensorBytes
from zfree.data.batching import EncodedPair, collate
from zfree.models.base import build_synthetic_gpt2, target_logprobs
from zfree.models.continuous import ContinuousCVAE
from zfree.models.discrete import DiscreteCVAE
from zfree.models.head_chunks import HEAD_CHUNK_ELEMENTS, _grad_scheme, set_head_chunk
from zfree.models.nll import masked_mean_token_nll
from zfree.models.precision import body_autocast
from zfree.objective.objectives import assemble_objective

OBJ = ObjectiveConfig(weighting="plain", beta=0.3)
SMOLLM2 = Path(os.environ.get("ZFREE_MODELS") or Path.home() / ".cache/zfree/models") / "smollm2-135m-instruct"
CHUNK = {"elements": HEAD_CHUNK_ELEMENTS}  # --chunk: the chunk of the function and checkpoint schemes


def batches(V: int, n: int, batch: int, x_len: int, y_len: int, pad_id: int = 0):
    rng = np.random.default_rng(0)
    return [collate([EncodedPair(f"r{i}", tuple(rng.integers(5, V, x_len).tolist()),
                                 tuple(rng.integers(5, V, y_len).tolist())) for i in range(batch)], pad_id=pad_id)
            for _ in range(n)]


def step(kind: str, m, opt, b) -> None:
    if kind == "base":
        loss = masked_mean_token_nll(-target_logprobs(m, b), b.target_mask).mean()
    elif kind == "continuous":
        o = m(b)
        loss = masked_mean_token_nll(-o.target_logprobs, b.target_mask).mean() + 0.3 * (o.posterior_mean ** 2).mean()
    elif kind == "hard":  # objectives.hard_em_objective's passes: K-way E-step without gradient, one with
        sel = m.forward_selected(b, "best")
        loss = masked_mean_token_nll(-sel.selected_logprobs, b.target_mask).mean() + \
            torch.nn.functional.cross_entropy(sel.out.posterior_logits, sel.z)
    else:
        o = m(b)
        r = masked_mean_token_nll(-o.target_logprobs, b.target_mask)
        loss = assemble_objective(OBJ, recon_per_latent=r, q_logits=o.posterior_logits, p_logits=o.prior_logits,
                                  target_len=b.target_len).total
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def make(kind: str, K: int, backbone):
    m = backbone if kind == "base" else ContinuousCVAE(backbone, 16, n_samples=K) if kind == "continuous" \
        else DiscreteCVAE(backbone, K)
    return m, torch.optim.AdamW(m.parameters(), 1e-5)


def measured_step(kind: str, m, opt, b, dev: torch.device, precision: str) -> float:
    """One step's peak MiB of memory created during it: live tensor storage on the CPU
    (``LiveTensorBytes``), ``torch.cuda.max_memory_allocated`` over what was allocated before on CUDA
    (autograd's CUDA backward runs on another thread, which a dispatch mode does not see)."""
    if dev.type != "cuda":
        with LiveTensorBytes() as mem, body_autocast(precision, dev):
            step(kind, m, opt, b)
        return mem.peak_mib
    torch.cuda.synchronize(dev)
    before = torch.cuda.memory_allocated(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    with body_autocast(precision, dev):
        step(kind, m, opt, b)
    torch.cuda.synchronize(dev)
    return (torch.cuda.max_memory_allocated(dev) - before) / 2**20


@contextlib.contextmanager
def head_scheme(scheme: str):
    """Run the head under ``scheme`` (module docstring): function, checkpoint or whole."""
    prev = set_head_chunk(None if scheme == "whole" else CHUNK["elements"])
    try:
        with _grad_scheme("function" if scheme == "whole" else scheme):
            yield
    finally:
        set_head_chunk(prev)


def run(name: str, build, bs, K: int, n_steps: int, whole: bool, kinds=("soft", "hard", "continuous"),
        dev: torch.device = torch.device("cpu"), precision: str = "fp32", schemes=("function", "checkpoint")) -> dict:
    """Print the table of one model (module docstring); returns {(kind, K, scheme): (ms, peak MiB)}.
    The base step and the soft step run under every scheme of ``schemes`` (+ whole with ``whole``),
    the other kinds under the first scheme only."""
    schemes = tuple(schemes) + (("whole",) if whole else ())
    paths = [("base", 1, sc) for sc in schemes] + [("soft", K, sc) for sc in schemes if "soft" in kinds] + \
        [(k, K, schemes[0]) for k in kinds if k != "soft"]
    models = {}
    for p in paths:
        torch.manual_seed(0)
        models[p] = make(p[0], p[1], build().to(dev))
    bs = [b.to(dev) for b in bs]
    times, peaks = {p: [] for p in paths}, {}
    for i, b in enumerate(bs):  # step 0: warm-up (optimizer state, head check) and the memory measure
        for p in paths:
            with head_scheme(p[2]):
                if i == 0:
                    with body_autocast(precision, dev):
                        step(p[0], *models[p], b)  # builds AdamW's state outside the measure
                    peaks[p] = measured_step(p[0], *models[p], b, dev, precision)
                    continue
                _sync(dev)
                t = time.perf_counter()
                with body_autocast(precision, dev):
                    step(p[0], *models[p], b)
                _sync(dev)
                times[p].append(time.perf_counter() - t)
    x_tok = float(np.mean([float((b.prefix_len - 1).sum()) for b in bs]))
    y_tok = float(np.mean([float(b.target_len.sum()) for b in bs]))
    V = models[paths[0]][0].get_output_embeddings().weight.shape[0]
    print(f"\n== {name} on {dev.type} {precision}: vocab {V}, batch {len(bs[0])}, {n_steps} timed steps; tokens per batch: prefix {x_tok:.0f}, "
          f"suffix {y_tok:.0f}; chunk {CHUNK['elements']} logits ({CHUNK['elements'] // V} rows)")
    print(f"{'path':<12}{'K/S':>4}{'head':>11}{'ms/step':>10}{'x base':>8}{'ideal':>7}{'x ideal':>9}{'/ckpt':>7}"
          f"{'peak MiB':>10}{'x base':>8}")
    ms = {p: float(np.median(times[p])) for p in paths}
    for p in paths:
        kind, k, sc = p
        base = ("base", 1, sc)
        ideal = 1.0 if kind == "base" else (x_tok + k * y_tok) / (x_tok + y_tok)
        ck = ms.get((kind, k, "checkpoint"))
        print(f"{kind:<12}{k:>4}{sc:>11}{1000 * ms[p]:>10.1f}{ms[p] / ms[base]:>8.2f}{ideal:>7.2f}"
              f"{ms[p] / ms[base] / ideal:>9.2f}{(f'{ms[p] / ck:.2f}' if ck else '-'):>7}"
              f"{peaks[p]:>10.1f}{peaks[p] / peaks[base]:>8.2f}")
    return {p: (1000 * ms[p], peaks[p]) for p in paths}


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--K", type=int, default=4)
    ap.add_argument("--vocabs", default="1000,50257,128256")
    ap.add_argument("--smollm2", default=str(SMOLLM2), help="a SmolLM2 transformers folder ('' to skip)")
    ap.add_argument("--smollm2-batch", type=int, default=8)
    ap.add_argument("--no-whole", action="store_true", help="skip the whole-head rows")
    ap.add_argument("--chunk", type=int, default=HEAD_CHUNK_ELEMENTS, help="logits per chunk")
    ap.add_argument("--kinds", default="soft,hard,continuous", help="CVAE steps of the tiny body")
    a = ap.parse_args()
    CHUNK["elements"] = a.chunk
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 1))
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, CPU fp32; |x| = |y| = 20")
    for V in [int(v) for v in a.vocabs.split(",") if v]:
        run("tiny body (2 layers, width 64)", lambda: build_synthetic_gpt2(V, n_layer=2, n_embd=64, n_head=4),
            batches(V, a.steps + 1, a.batch, 20, 20), a.K, a.steps, not a.no_whole, kinds=tuple(a.kinds.split(",")))
    folder = Path(a.smollm2) if a.smollm2 else None
    if folder is None or not (folder / "config.json").exists():
        print(f"\nSmolLM2: skipped (no transformers folder at {a.smollm2!r}; zfree model fetch smollm2-135m-instruct makes one)")
        return
    from zfree.models.loading import load_causal_lm

    lm, tok = load_causal_lm(folder, device="cpu", dtype="float32")
    V = lm.get_output_embeddings().weight.shape[0]
    run(f"SmolLM2-135M ({folder.name})", lambda: __import__("copy").deepcopy(lm).train(),
        batches(V, a.steps + 1, a.smollm2_batch, 20, 20, pad_id=tok.pad_token_id or 0), a.K, a.steps, False,
        kinds=("soft",))  # no whole head: 4 copies of a 135M model with AdamW state fit in memory, 6 may not


if __name__ == "__main__":
    main()
