"""Throughput of zfree's scorer against the limit no scorer can beat, measured side by side.

Not a test: run it, read the ratios.

    OMP_NUM_THREADS=1 python analysis/benchmarks/bench_scoring.py [--quick]

Model: a random 4-layer, 256-wide GPT-2 (4 heads, vocabulary --vocab, default 8192), fp32 on CPU.
Workloads (token ids, uniform total lengths, x/y split uniform with |y| >= 1):
  short  total length 8-32 (the synthetic benchmark's regime)
  text   total length 8-256
Methods, all scoring exactly the same real tokens (tokens/s counts real tokens, prefix + S):
  zfree     ``score_encoded(model, encoded, pad_id=0)`` with its defaults, as a user runs it
            (sorting, batching, padding, the per-example and per-token DataFrames included);
  ideal_rows    the transformer body over the same rows grouped into equal-length batches (no
                padding, no mask, tensors prepared outside the clock) plus the output head and
                log-sum-exp on the y positions only;
  ideal_packed  the same number of real tokens and scored positions re-cut into rows of one
                length (sum(n^2)/sum(n), so attention FLOPs match), full budget-sized batches:
                what ideal_rows would be without its many small batches on a ragged workload;
  limit         the faster of the two ideals;
  unsorted  batched in input order under the same token budget, padded, masked, same head path;
  naive     one example at a time: full logits, log_softmax, pick the y positions.
Each method is timed best-of --repeats, interleaved, after a warm-up. Peak memory is the peak
resident-set growth over the pre-call level (sampled every 2 ms after malloc_trim).

Whole CLI (``--cli``, after the tables): the same short workload written as a model folder (the
GPT-2 saved with a word-level tokenizer over its ids) and a JSONL file, then
  score_file    ``zfree.reference.scoring.score_file`` in this process (load, verify the head,
                read and tokenize, hash, score; no cache), best of --repeats;
  zfree score   the ``zfree score --no-cache`` command in a fresh process (interpreter, imports,
                everything above, writing the parquet files), best of --repeats;
  and the fixed costs inside them, each timed alone: interpreter + imports + model load in a
  fresh process (transformers imports its modeling code lazily, at the first load), model load
  (with the head check) in this process, the head check alone, the weights hash, tokenization; against ideal_rows /
  limit on the same rows (tokens/s counts real tokens including the tokenizer's bos and eos).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import threading
import time

import numpy as np
import psutil
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from zfree.data.batching import EncodedPair, collate
from zfree.reference.scoring import plan_batches, score_encoded

BUDGET = 8192  # zfree's default max_batch_tokens, used by every batched method


def workload(n_rows: int, lo: int, hi: int, vocab: int, seed: int) -> list[EncodedPair]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n_rows):
        n = int(rng.integers(lo, hi + 1))
        p = int(rng.integers(1, n))  # prefix >= 1, y >= 1
        ids = rng.integers(5, vocab, n).tolist()
        out.append(EncodedPair(f"r{i}", tuple(ids[:p]), tuple(ids[p:])))
    return out


def head_lse(model, h, tokens):
    W = model.get_output_embeddings().weight
    logits = torch.nn.functional.linear(h.float(), W)  # (N, vocab), y positions only
    return logits.gather(-1, tokens[:, None]).squeeze(-1) - logits.logsumexp(-1)


def prepare_ideal(encoded):
    """Equal-length batches (exact length groups, cut by the budget), tensors built up front."""
    n = np.array([len(e.prefix_ids) + len(e.target_ids) for e in encoded])
    order = np.argsort(n, kind="stable")
    batches = []
    for length in np.unique(n):
        rows = order[n[order] == length]
        per = max(1, BUDGET // int(length))
        for s in range(0, len(rows), per):
            chunk = [encoded[k] for k in rows[s : s + per]]
            ids = torch.tensor([e.prefix_ids + e.target_ids for e in chunk])
            r = torch.cat([torch.full((len(e.target_ids),), i) for i, e in enumerate(chunk)])
            pos = torch.cat([torch.arange(len(e.prefix_ids) - 1, len(e.prefix_ids) + len(e.target_ids) - 1) for e in chunk])
            batches.append((ids, r, pos, ids[r, pos + 1]))
    return batches


def prepare_packed(encoded, vocab: int):
    """The same real tokens and scored positions re-cut into rows of one length (no padding, full
    budget-sized batches), that length chosen as sum(n^2)/sum(n) so attention FLOPs match too."""
    n = np.array([len(e.prefix_ids) + len(e.target_ids) for e in encoded])
    n_y = sum(len(e.target_ids) for e in encoded)
    length = int(round((n**2).sum() / n.sum()))
    rows = int(n.sum()) // length
    y_per_row = max(1, round(n_y / n.sum() * length))
    ids = torch.randint(5, vocab, (rows, length), generator=torch.Generator().manual_seed(0))
    batches, per = [], max(1, BUDGET // length)
    for s in range(0, rows, per):
        chunk = ids[s : s + per]
        r = torch.arange(len(chunk)).repeat_interleave(y_per_row)
        pos = torch.arange(length - 1 - y_per_row, length - 1).repeat(len(chunk))
        batches.append((chunk, r, pos, chunk[r, pos + 1]))
    return batches, rows * length, length


@torch.inference_mode()
def run_ideal(model, batches):
    out = []
    for ids, r, pos, tgt in batches:
        h = model.base_model(input_ids=ids, use_cache=False).last_hidden_state
        out.append(head_lse(model, h[r, pos], tgt))
    return out


@torch.inference_mode()
def run_unsorted(model, encoded):
    b = []
    i = 0
    while i < len(encoded):
        j, T = i + 1, len(encoded[i].prefix_ids) + len(encoded[i].target_ids)
        while j < len(encoded):
            Tj = max(T, len(encoded[j].prefix_ids) + len(encoded[j].target_ids))
            if Tj * (j - i + 1) > BUDGET:
                break
            T, j = Tj, j + 1
        batch = collate(encoded[i:j], pad_id=0)
        h = model.base_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                             use_cache=False).last_hidden_state
        pred = batch.target_mask[:, 1:]
        lp = head_lse(model, h[:, :-1][pred], batch.input_ids[:, 1:][pred])
        b.extend(-s.mean().item() for s in lp.split(batch.target_len.tolist()))
        i = j
    return np.array(b)


@torch.inference_mode()
def run_naive(model, encoded):
    b = []
    for e in encoded:
        ids = torch.tensor([e.prefix_ids + e.target_ids])
        lp = torch.log_softmax(model(input_ids=ids, use_cache=False).logits[0], -1)
        P, L = len(e.prefix_ids), len(e.target_ids)
        b.append(-lp[torch.arange(P - 1, P + L - 1), ids[0, P : P + L]].mean().item())
    return np.array(b)


def peak_rss_growth_mib(fn) -> float:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    proc, peak, stop = psutil.Process(), [0], threading.Event()
    base = proc.memory_info().rss

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.002)

    t = threading.Thread(target=sample)
    t.start()
    try:
        fn()
    finally:
        stop.set()
        t.join()
    return max(0, peak[0] - base) / 2**20


def bench(name, model, encoded, repeats: int, vocab: int):
    n_tok = sum(len(e.prefix_ids) + len(e.target_ids) for e in encoded)
    n_y = sum(len(e.target_ids) for e in encoded)
    ideal_rows = prepare_ideal(encoded)
    packed, packed_tok, packed_len = prepare_packed(encoded, vocab)
    methods = {"zfree": lambda: score_encoded(model, encoded, pad_id=0),
               "ideal_rows": lambda: run_ideal(model, ideal_rows),
               "ideal_packed": lambda: run_ideal(model, packed),
               "unsorted": lambda: run_unsorted(model, encoded),
               "naive": lambda: run_naive(model, encoded)}
    tokens = {m: packed_tok if m == "ideal_packed" else n_tok for m in methods}
    ref = score_encoded(model, encoded, pad_id=0).per_example["b"].to_numpy()  # warm-up and agreement check
    for m in ("unsorted", "naive"):
        err = np.abs(methods[m]() - ref).max()
        assert err < 1e-4, f"{m} disagrees with zfree by {err}"
    methods["ideal_rows"]()
    methods["ideal_packed"]()
    best = {m: float("inf") for m in methods}
    for _ in range(repeats):
        for m, fn in methods.items():
            t0 = time.perf_counter()
            fn()
            best[m] = min(best[m], time.perf_counter() - t0)
    mem = {m: peak_rss_growth_mib(fn) for m, fn in methods.items() if m != "naive"}
    lengths = np.sort([len(e.prefix_ids) + len(e.target_ids) for e in encoded])
    plan = plan_batches(lengths, BUDGET)
    padded = sum((s.stop - s.start) * int(lengths[s.stop - 1]) for s in plan)
    tps = {m: tokens[m] / t for m, t in best.items()}
    limit = max(tps["ideal_rows"], tps["ideal_packed"])
    print(f"\n== {name}: {len(encoded)} rows, {n_tok} real tokens ({n_y} scored), best of {repeats}; "
          f"zfree plan: {len(plan)} batches, padding {padded / n_tok - 1:.1%} of real tokens; "
          f"ideal_packed: rows of {packed_len} tokens")
    print(f"{'method':13s} {'tokens/s':>10s} {'x limit':>8s} {'x zfree':>8s} {'peak MiB':>9s}")
    for m in methods:
        print(f"{m:13s} {tps[m]:10.0f} {tps[m] / limit:8.3f} {tps[m] / tps['zfree']:8.3f} "
              f"{mem.get(m, float('nan')):9.1f}")
    z = tps["zfree"]
    print(f"zfree / limit (best ideal) = {z / limit:.3f}; zfree / ideal_rows = {z / tps['ideal_rows']:.3f}; "
          f"zfree / ideal_packed = {z / tps['ideal_packed']:.3f}; zfree / unsorted = {z / tps['unsorted']:.2f}x; "
          f"zfree / naive = {z / tps['naive']:.2f}x; peak MiB zfree / unsorted = "
          f"{mem['zfree'] / max(mem['unsorted'], 1e-9):.2f}")


def bench_cli(model, encoded, repeats: int, vocab: int) -> None:
    """The whole-CLI measure (module docstring): a model folder and a JSONL file under a temp dir."""
    import json
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from zfree.core.io import sha256_state_dict
    from zfree.data.batching import encode_pairs
    from zfree.data.pairs import load_pairs
    from zfree_lab.run.tokenizer import build_digit_tokenizer
    from zfree.models.head import head_is_exact
    from zfree.models.loading import load_causal_lm
    from zfree.reference.scoring import score_file

    root = Path(tempfile.mkdtemp(prefix="zfree-bench-cli-"))
    model.config.update(dict(bos_token_id=1, eos_token_id=3, pad_token_id=0))
    model.save_pretrained(root / "m")
    tok = build_digit_tokenizer(vocab - 5)  # id 5 + d for symbol d: the workload's ids are its symbols
    tok.save_pretrained(root / "m")
    with open(root / "pairs.jsonl", "w") as f:
        for e in encoded:
            f.write(json.dumps({"id": e.id, "x": " ".join(str(t - 5) for t in e.prefix_ids),
                                "y": " ".join(str(t - 5) for t in e.target_ids)}) + "\n")
    enc = encode_pairs(tok, load_pairs(root / "pairs.jsonl"))  # + bos, + eos: what the CLI scores
    n_tok = sum(len(e.prefix_ids) + len(e.target_ids) for e in enc)
    ideal = prepare_ideal(enc)
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads()), "HF_HUB_OFFLINE": "1"}
    cli = [sys.executable, "-m", "zfree_lab.cli", "score", "--model", str(root / "m"), "--data", str(root / "pairs.jsonl"),
           "--out", str(root / "out"), "--no-cache", "--device", "cpu"]
    bare = [sys.executable, "-c", "import sys, pandas, pyarrow; from zfree.reference.scoring import load_scoring_model; "
            "load_scoring_model(sys.argv[1], device='cpu')", str(root / "m")]  # what any transformers scorer pays
    timers = {"zfree score": lambda: subprocess.run(cli, env=env, check=True, capture_output=True),
              "score_file": lambda: score_file(root / "m", root / "pairs.jsonl", device="cpu", cache=False),
              "ideal_rows": lambda: run_ideal(model, ideal),
              "interpreter+imports+load": lambda: subprocess.run(bare, env=env, check=True, capture_output=True)}
    loaded = load_causal_lm(root / "m", device="cpu")[0]
    fixed = {"model load + head check": lambda: load_causal_lm(root / "m", device="cpu"),
             "head check alone": lambda: head_is_exact(loaded, refresh=True),
             "weights hash": lambda: sha256_state_dict(loaded.state_dict()),
             "read + tokenize": lambda: encode_pairs(tok, load_pairs(root / "pairs.jsonl"))}
    best = {m: float("inf") for m in {**timers, **fixed}}
    for _ in range(repeats):
        for m, fn in {**timers, **fixed}.items():
            t0 = time.perf_counter()
            fn()
            best[m] = min(best[m], time.perf_counter() - t0)
    lim = n_tok / best["ideal_rows"]
    print(f"\n== whole CLI, short pairs: {len(enc)} rows, {n_tok} real tokens with bos and eos, best of {repeats}")
    print(f"{'method':22s} {'s':>8s} {'tokens/s':>10s} {'x ideal_rows':>13s}")
    for m in ("zfree score", "score_file", "ideal_rows"):
        print(f"{m:22s} {best[m]:8.3f} {n_tok / best[m]:10.0f} {n_tok / best[m] / lim:13.3f}")
    floor = best["interpreter+imports+load"]
    print(f"zfree score without interpreter + imports + model load ({floor:.2f} s): "
          f"{n_tok / (best['zfree score'] - floor) / lim:.3f} x ideal_rows")
    print("fixed costs, each alone: " + "; ".join(f"{m} {1000 * best[m]:.0f} ms" for m in
                                                 ("interpreter+imports+load", *fixed)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--short-rows", type=int, default=1500)
    ap.add_argument("--text-rows", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="small sizes, one repeat (a smoke run)")
    ap.add_argument("--cli", action="store_true", help="also the whole-CLI measure (zfree score in a fresh process)")
    ap.add_argument("--cli-only", action="store_true", help="only the whole-CLI measure")
    a = ap.parse_args()
    if a.quick:
        a.short_rows, a.text_rows, a.repeats = 200, 30, 1
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=a.vocab, n_positions=256, n_layer=4, n_embd=256, n_head=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(cfg).eval()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()} (OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS')}), {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, "
          f"vocab {a.vocab}, fp32 CPU, batch budget {BUDGET} tokens. MFU not measured (no GPU).")
    if not a.cli_only:
        bench("short pairs (total 8-32)", model, workload(a.short_rows, 8, 32, a.vocab, 0), a.repeats, a.vocab)
        bench("text-like (total 8-256)", model, workload(a.text_rows, 8, 256, a.vocab, 1), a.repeats, a.vocab)
    if a.cli or a.cli_only:
        bench_cli(model, workload(a.short_rows, 8, 32, a.vocab, 0), a.repeats, a.vocab)


if __name__ == "__main__":
    main()
