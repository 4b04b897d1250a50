"""Training steps of real-size models on one device (issue 56, item 5): step time, peak memory, tokens/s and
MFU of the z-free control's step, the K = 4 soft step and the hard-EM step, at batch 8 and in throughput mode
(a larger batch), for a model folder (SmolLM2) or a random-initialised Llama-architecture model built on the
device from a config (no weights to carry: ``--llama 1b`` ~1.2B, ``8b`` ~8.0B parameters, ``smollm2``
SmolLM2-135M's shape, ``tiny`` for a CPU dry run). Random weights time the same as trained ones.

    python analysis/benchmarks/bench_large_step.py --llama 8b --precision bf16 --out OUT    # on a GPU
    python analysis/benchmarks/bench_large_step.py --llama tiny --device cpu --steps 1 --out OUT  # dry run

Each step is the loop's (``zfree.objective.objectives.step_objective`` under ``tf32_matmuls``, backward,
AdamW over what trains) at the e2e-smollm2 preset's settings: LoRA rank 8 (the body frozen: ``bf16`` stores
it in bfloat16, ``zfree.models.precision``), K = 4, the optimal posterior, the hard E-step on the first 3
tokens of y. Rows: E2E pairs through the model's tokenizer (``--data``, a model folder with one), else
synthetic rows of random token ids with |[bos] x sep| = ``--x-len`` and |y eos| = ``--y-len``.

- seconds per step: mean of ``--steps`` steps after ``--warmup`` steps, synchronised at both ends;
- peak memory: ``torch.cuda.max_memory_allocated`` over the timed steps (CPU: not measured, nan);
- tokens/s: the batch's real tokens (sum of |[bos] x sep| + |y eos|) per second (the data's rate, whatever K);
- FLOPs: counted over one step by torch's formulas (``flop_registry``, as FlopCounterMode; the CPU's SDPA
  kernel has none); MFU = counted FLOP/s / the chip's dense peak (bf16: 989 TFLOP/s on an H100/H200; fp32
  steps run their products on TF32 tensor cores: 494);
- host syncs: CUDA's sync debug mode over one step (``torch.cuda.set_sync_debug_mode``), the warnings counted.

Writes one JSON line per (kind, batch) to ``OUT/large_steps.jsonl`` and appends a table to ``OUT/large_steps.txt``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_step_flops import KINDS, SplitFlops  # noqa: E402

from zfree.config import TrainConfig  # noqa: E402
from zfree.data.batching import EncodedPair, collate, encode_pairs, pad_id_of  # noqa: E402
from zfree.data.pairs import load_pairs  # noqa: E402
from zfree.models.head import verify_head  # noqa: E402
from zfree.models.precision import tf32_matmuls  # noqa: E402
from zfree.objective.objectives import step_objective  # noqa: E402
from zfree_lab.run.run_setup import build_cvae, store_frozen_body  # noqa: E402

#: Llama-architecture shapes (SmolLM2-135M's, Llama 3.2 1B's and Llama 3.1 8B's; ``tiny`` for the CPU dry run)
LLAMA = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True),
    "smollm2": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, head_dim=64, vocab_size=49152, tie_word_embeddings=True,
                    rope_theta=100000.0),
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False),
}
#: dense peak TFLOP/s by a substring of the device name; fp32 steps use TF32 (zfree.models.precision.tf32_matmuls)
PEAK_TFLOPS = {"H200": {"bf16": 989.0, "fp32": 494.0}, "H100": {"bf16": 989.0, "fp32": 494.0},
               "A100": {"bf16": 312.0, "fp32": 156.0}}


def build_backbone(a, dev: torch.device):
    """(backbone in float32 on ``dev``, tokenizer or None): a model folder, or a random Llama of ``--llama``."""
    if a.model:
        from zfree.models.loading import load_causal_lm

        return load_causal_lm(a.model, device=str(dev), dtype="float32")
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**{"rope_theta": 500000.0, **LLAMA[a.llama]}, max_position_embeddings=4096, bos_token_id=1,
                      eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    with torch.device(dev):
        model = LlamaForCausalLM(cfg)
    return model.float().eval(), None


def make_rows(a, tok, vocab: int, n: int) -> list[EncodedPair]:
    """``n`` encoded rows: E2E pairs through ``tok`` when given, else random ids of the stated lengths."""
    if tok is not None and a.data and Path(a.data).exists():
        return encode_pairs(tok, load_pairs(Path(a.data))[:n])
    g = np.random.default_rng(0)
    rows = []
    for i in range(n):
        P = max(3, a.x_len + int(g.integers(-a.jitter, a.jitter + 1)))
        S = max(2, a.y_len + int(g.integers(-a.jitter, a.jitter + 1)))
        ids = g.integers(3, vocab, P + S).tolist()
        rows.append(EncodedPair(f"r{i}", tuple([1] + ids[1:P]), tuple(ids[P:] + [2])))
    return rows


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def run_kind(a, kind: str, batch_size: int, dev: torch.device) -> dict:
    phase, fields = KINDS[kind]
    K = 1 if kind == "control" else a.k
    cfg = TrainConfig().replace(device=str(dev), precision=a.precision, weighting="distribution", lora_rank=a.lora,
                                batch_size=batch_size, hard_em_estep_tokens=3, **{**fields, "n_latent": K})
    backbone, tok = build_backbone(a, dev)
    vocab = int(backbone.get_output_embeddings().weight.shape[0])
    model = build_cvae(cfg, backbone)
    store_frozen_body(model, cfg.optim)
    rows = make_rows(a, tok, vocab, max(batch_size * 4, 64))
    if kind == "control":
        model.set_given({r.id: 0 for r in rows})
    verify_head(model.backbone)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    g = np.random.default_rng(1)
    pad = pad_id_of(tok) if tok is not None else 0
    batches = [collate([rows[i] for i in g.integers(0, len(rows), batch_size)], pad_id=pad).to(dev)
               for _ in range(a.warmup + a.steps + 2)]

    def one(b):
        with tf32_matmuls(dev):
            loss = step_objective(phase, model, b, cfg, 1, 2.9656, None, None).total
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    for b in batches[: a.warmup]:
        one(b)
    split = SplitFlops(vocab)
    with split:
        one(batches[a.warmup])
    flops = sum(split.parts.values())
    syncs = float("nan")
    if dev.type == "cuda":
        torch.cuda.set_sync_debug_mode("warn")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            one(batches[a.warmup + 1])
            sync(dev)
        torch.cuda.set_sync_debug_mode("default")
        syncs = sum("synchroniz" in str(w.message).lower() for w in caught)
        torch.cuda.reset_peak_memory_stats(dev)
    timed = batches[a.warmup + 2:]
    sync(dev)
    t = time.perf_counter()
    for b in timed:
        one(b)
    sync(dev)
    dt = (time.perf_counter() - t) / len(timed)
    tokens = float(np.mean([float((b.prefix_len + b.target_len).sum()) for b in timed]))
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    peak = next((v[a.precision] for k, v in PEAK_TFLOPS.items() if k in name), float("nan"))
    out = {"model": a.model or f"llama-{a.llama} (random)", "params_b": sum(p.numel() for p in model.backbone.parameters()) / 1e9,
           "kind": kind, "batch": batch_size, "precision": a.precision, "device": name, "lora_rank": a.lora,
           "K": K, "s_per_step": dt, "tokens_per_batch": tokens, "tokens_s": tokens / dt,
           "gflop_per_step": flops / 1e9, "tflop_s": flops / dt / 1e12, "mfu": flops / dt / (peak * 1e12),
           "peak_gib": torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else float("nan"),
           "syncs_per_step": syncs, "steps": len(timed), "torch": torch.__version__}
    del model, opt, backbone, batches
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="", help="a model folder (else --llama)")
    ap.add_argument("--llama", default="1b", choices=sorted(LLAMA))
    ap.add_argument("--data", default="data/e2e/train.jsonl", help="pairs for a model folder with a tokenizer")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    ap.add_argument("--kinds", default="control,soft,hard_em")
    ap.add_argument("--batches", default="8,64", help="batch sizes: 8 and the throughput mode's")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--lora", type=int, default=8)
    ap.add_argument("--x-len", type=int, default=40, help="|[bos] x sep| of synthetic rows")
    ap.add_argument("--y-len", type=int, default=30, help="|y eos| of synthetic rows")
    ap.add_argument("--jitter", type=int, default=4, help="synthetic lengths vary by up to this many tokens")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", default=".", help="folder for large_steps.jsonl and large_steps.txt")
    a = ap.parse_args()
    dev = torch.device("cuda" if a.device == "auto" and torch.cuda.is_available() else
                       ("cpu" if a.device == "auto" else a.device))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for bs in (int(b) for b in a.batches.split(",")):
        for kind in a.kinds.split(","):
            try:
                r = run_kind(a, kind, bs, dev)
            except torch.OutOfMemoryError as e:  # a row that does not fit is a result too
                r = {"model": a.model or f"llama-{a.llama} (random)", "kind": kind, "batch": bs,
                     "precision": a.precision, "error": f"out of memory: {str(e).splitlines()[0][:120]}"}
                torch.cuda.empty_cache()
            rows.append(r)
            print(json.dumps(r), flush=True)
            with open(out / "large_steps.jsonl", "a") as f:
                f.write(json.dumps(r) + "\n")
    lines = [f"{'model':<28} {'prec':<5} {'kind':<8} {'batch':>5} {'s/step':>8} {'tok/s':>9} {'TFLOP/s':>8} "
             f"{'MFU':>6} {'peak GiB':>8} {'syncs':>5}"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['model']:<28} {r['precision']:<5} {r['kind']:<8} {r['batch']:>5} {r['error']}")
            continue
        lines.append(f"{r['model']:<28} {r['precision']:<5} {r['kind']:<8} {r['batch']:>5} {r['s_per_step']:>8.4f} "
                     f"{r['tokens_s']:>9.0f} {r['tflop_s']:>8.2f} {100 * r['mfu']:>5.1f}% {r['peak_gib']:>8.2f} "
                     f"{r['syncs_per_step']:>5}")
    with open(out / "large_steps.txt", "a") as f:
        f.write("\n".join(lines) + "\n\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
