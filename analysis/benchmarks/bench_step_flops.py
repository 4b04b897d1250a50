"""Counted FLOPs of one training step against the ideal (issue 56, item 3): the z-free control's step, the
K-way soft step and the hard-EM step at the e2e-smollm2 preset's settings (LoRA rank 8, K = 4, the optimal
posterior, the hard E-step on the first 3 tokens of y), side by side with the step as it was before
issue 56 (``--paths old``: the z-free pass over (x, y) and the z-free head on y, i.e. the model's forward
with ``zfree_metrics=True``) and the step before packed rows (``padded``: the x-prefix pass and the decoder's
suffix passes, each padded to the batch's longest; ``new`` packs the rows into one forward where
``zfree.models.packing.packing_problem`` allows, per row segment attention; the hard-EM step in three packed
passes, the prefix once: ``packed_prefix``, then its E-step blocks and the decoded value's block reading its keys
and values, ``packed_suffix``). Counts, not timings: valid on a loaded machine.

    OMP_NUM_THREADS=1 .venv/bin/python analysis/benchmarks/bench_step_flops.py            # tiny shipped base
    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 .venv/bin/python analysis/benchmarks/bench_step_flops.py \\
        --model ~/.cache/zfree/models/smollm2-135m-instruct --data data/e2e/train.jsonl --out FILE

Counted: ``torch.utils.flop_counter.FlopCounterMode`` over one whole step (forward and backward, the
optimizer's update left out: it has no products), or, where its module tracker fails (SmolLM2's chunked
head), the same formulas (``flop_registry``) summed by a dispatch mode of this file; split by op into the output head (a product with an
operand of the vocabulary's size), attention (scaled_dot_product_attention; torch has no FLOP formula for
the CPU kernel, so it reads 0 on the CPU) and the body's other products (linear layers, LoRA, the heads
on the latent). Ideal, per row b with P_b = |[bos] x sep| and S_b = |y eos| (the tokens the decoder
reads and predicts): forward FLOPs = 2 N_body * (body tokens) + 2 d V * (head tokens), N_body the
weights of the decoder layers' linear maps, d the width, V the vocabulary; attention left out on both
sides of the ratio; a step with gradient costs 3x its forward (forward + backward):

  control   3 * F(sum_b P_b + S_b body, sum_b S_b head)                   one pass over (x, y)
  soft      3 * F(sum_b P_b + K S_b, K sum_b S_b)                           the prefix once, K y-regions
  hard_em   3 * F(sum_b P_b + S_b, sum_b S_b) + F(K sum_b e_b, K sum_b e_b) the decoded value's pass with
            gradient, the K E-step passes (e_b = min(S_b, estep_tokens)) without

``x ideal`` = counted (without attention) / ideal: 1 is the ideal reached; padding to the batch's longest
row, the router / posterior heads, LoRA's products and the head's recomputed chunks
(``zfree.models.head_chunks``) make it more. The issue's 3x counts a backward with weight gradients; a
LoRA run's frozen body has none (its backward is the activation gradients, about 1x the forward), so its
step can count below that ideal: ``x frozen`` is against the ideal with a 2x step. ``tok/row`` is the
tokens through the decoder layers per row of the forward (a hook on each layer), against the ideal's and
the padded layout's (the batch's longest prefix once, its longest y-region per decoded value).
``--time N``: also the median seconds of N whole steps (AdamW included) per path, the paths interleaved, and
new / old (``t n/o``) and new / padded (``t n/p``): timings, valid only on an otherwise idle machine (the
issue's CPU criteria: control <= 0.6x today's step, i.e. new / old, K = 4 soft <= 1.5x the control's, printed
below the table beside the ideal's own ratio); ``--clock cpu`` times this process's CPU seconds instead. Prints one table (and writes it with the command
to ``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from zfree.config import TrainConfig
from zfree.data.batching import collate, encode_pairs, pad_id_of
from zfree.data.pairs import load_pairs
from zfree.models.head import verify_head
from zfree.models.loading import load_causal_lm
from zfree.models.routes import decoder_layers
from zfree.objective.objectives import GIVEN, Phase, step_objective
from zfree_lab.run.run_setup import build_cvae, store_frozen_body

#: step kind -> (the objective's phase, the preset's config fields for it)
KINDS = {
    "control": (GIVEN, {"latent_source": "control", "n_latent": 1, "beta": 0.0}),
    "soft": ("discrete", {"posterior_features": "optimal", "beta": 0.003512}),
    "hard_em": (Phase.HARD, {"posterior_features": "optimal", "beta": 0.003512, "aid": "hard_em_then_soft"}),
}
#: path -> (the zfree_metrics the step's forward runs with, the model's packing_mode): "old" as before
#: issue 56, "padded" the step before packed rows (the padded prefix and suffix passes), "new" as it trains now
PATHS = {"new": (False, None), "padded": (False, "off"), "old": (True, "off")}
ATTENTION_OPS = ("_scaled_dot_product", "scaled_dot_product")


class SplitFlops(TorchDispatchMode):
    """torch's FLOP formula of every dispatched op (``flop_registry``), summed by part: head (an operand
    with a dimension of the vocabulary's size), attention, body (every other product)."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab
        self.parts = {"head": 0, "attention": 0, "body": 0}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            n = formula(*args, **kwargs, out_val=out)
            name = str(func._overloadpacket)
            shapes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
            part = ("attention" if any(s in name for s in ATTENTION_OPS) else
                    "head" if any(self.vocab in s for s in shapes) else "body")
            self.parts[part] += n
        return out


def body_linear_weights(backbone) -> int:
    """N_body: the weights of every linear map (Linear, GPT-2's Conv1D) inside the decoder layers, LoRA's
    adapters left out (their base layers counted)."""
    n = 0
    for layer in decoder_layers(backbone):
        for name, mod in layer.named_modules():
            if "lora_" in name:
                continue
            w = getattr(mod, "weight", None)
            if isinstance(w, torch.Tensor) and w.dim() == 2 and type(mod).__name__ in ("Linear", "Conv1D"):
                n += w.numel()
    return n


def ideal_flops(kind: str, batch, n_body: int, d: int, vocab: int, K: int, estep: int, backward: int = 2
                ) -> tuple[float, float, float]:
    """(ideal FLOPs of the step with a backward of ``backward`` x the forward (2: the issue's 3x in all,
    a trained body's weight and activation gradients; 1: a frozen body's activation gradients alone),
    its ideal body tokens, the body tokens of the padded layout: the batch's longest prefix once and its
    longest y-region per decoded value, B (P_max + n L_max), what the step's passes can reach)."""
    P = batch.prefix_len.double()
    S = batch.target_len.double()
    B = float(len(P))
    Pm, Lm = (float(v) for v in batch.max_lengths())
    f = 1 + backward

    def fwd(body, head):
        return 2.0 * n_body * body + 2.0 * d * vocab * head

    if kind == "control":
        return f * fwd(float((P + S).sum()), float(S.sum())), float((P + S).sum()), B * (Pm + Lm)
    if kind == "soft":
        return f * fwd(float((P + K * S).sum()), float(K * S.sum())), float((P + K * S).sum()), B * (Pm + K * Lm)
    e = S.clamp(max=estep) if estep > 0 else S
    grad = fwd(float((P + S).sum()), float(S.sum()))
    nograd = fwd(float(K * e.sum()), float(K * e.sum()))
    Le = min(Lm, estep) if estep > 0 else Lm
    return f * grad + nograd, float((P + S + K * e).sum()), B * (Pm + Lm + K * Le)


def force_zfree_metrics(model, on: bool) -> None:
    """Make every forward of ``model`` run with ``zfree_metrics=on`` whatever the objective passes
    (``on`` True: the step as it was before issue 56)."""
    for name in ("forward", "forward_given", "forward_selected"):
        fn = getattr(model, name, None)
        if fn is not None:
            setattr(model, name, lambda *a, _fn=fn, **k: _fn(*a, **{**k, "zfree_metrics": on}))


def count_step(model, cfg, phase, batch, vocab: int, with_tracker: bool = True) -> dict:
    """Counted FLOPs of one step (forward + backward) and the body tokens of its forward. ``with_tracker``:
    under ``FlopCounterMode`` too, whose total must equal the split's (the same ``flop_registry``
    formulas); its module tracker fails on some models' chunked head (a hidden state that requires grad
    without a grad_fn inside the head's autograd Function), and the split alone counts there."""
    layers = decoder_layers(model.backbone)
    seen = [0]
    hooks = [layer.register_forward_pre_hook(
        lambda m, a, k: seen.__setitem__(0, seen[0] + (a[0] if a else k["hidden_states"]).shape[:2].numel()),
        with_kwargs=True) for layer in layers]
    split = SplitFlops(vocab)
    fc = FlopCounterMode(display=False) if with_tracker else contextlib.nullcontext()
    try:
        with fc, split:
            br = step_objective(phase, model, batch, cfg, 1, 2.0, None, None)
            body_tokens = seen[0] / len(layers)
            model.zero_grad(set_to_none=True)
            br.total.backward()
    finally:
        for h in hooks:
            h.remove()
    total = sum(split.parts.values())
    if with_tracker:
        assert fc.get_total_flops() == total, (fc.get_total_flops(), split.parts)  # the two counters agree
    return {"total": total, **split.parts, "body_tokens": body_tokens}


def count_steps(model, cfg, phase, batches, vocab: int) -> tuple[list[dict], str]:
    """``count_step`` of each batch, with FlopCounterMode where its module tracker works; (counts, counter)."""
    try:
        first = count_step(model, cfg, phase, batches[0], vocab)
        counter = "FlopCounterMode"
    except AssertionError as e:
        if "gradient function" not in str(e):
            raise
        first = count_step(model, cfg, phase, batches[0], vocab, with_tracker=False)
        counter = "flop_registry"
    return [first] + [count_step(model, cfg, phase, b, vocab, counter == "FlopCounterMode")
                      for b in batches[1:]], counter


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def time_steps(built: dict, phase, batches, n: int, clock: str = "wall") -> dict[str, float]:
    """Median seconds of a whole step (forward, backward, AdamW) of each path's model over ``n`` rounds, the
    paths interleaved within a round (so a drift of the machine's speed hits every path alike). Valid on an
    otherwise idle machine only; ``clock`` "cpu": this process's CPU seconds (one thread: less moved by other
    jobs on a shared machine than the wall clock, yet still by their use of the caches and memory bus)."""
    times: dict[str, list[float]] = {p: [] for p in built}
    for i in range(n):
        for path, (model, cfg, opt) in built.items():
            b = batches[i % len(batches)]
            t = CLOCKS[clock]()
            loss = step_objective(phase, model, b, cfg, 1, 2.0, None, None).total
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            times[path].append(CLOCKS[clock]() - t)
    return {p: float(np.median(v)) for p, v in times.items() if v}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="data/base/default/model", help="causal LM folder (or GGUF file)")
    ap.add_argument("--data", default=None, help="pairs (default: data/synth/default/val.jsonl for the default "
                                                 "model, else data/e2e/train.jsonl)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--batches", type=int, default=3, help="batches counted per kind (the ratio's mean)")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--lora", type=int, default=8, help="LoRA rank (0: full fine-tuning)")
    ap.add_argument("--estep-tokens", type=int, default=3)
    ap.add_argument("--kinds", default="control,soft,hard_em")
    ap.add_argument("--paths", default="new,padded,old")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                    help="bf16: the frozen body stored in bf16 and the step autocast (FLOPs unchanged)")
    ap.add_argument("--rows", type=int, default=2000, help="rows the batches are drawn from")
    ap.add_argument("--time", type=int, default=0, help="also time this many rounds of whole steps per path, "
                                                        "interleaved (seconds valid only on an idle machine)")
    ap.add_argument("--clock", default="wall", choices=sorted(CLOCKS),
                    help="--time's clock: wall seconds, or this process's CPU seconds (cpu: for a shared machine)")
    ap.add_argument("--out", default="", help="write the table (with this command) here too")
    a = ap.parse_args()
    torch.set_num_threads(1)
    data = a.data or ("data/synth/default/val.jsonl" if a.model == "data/base/default/model" else "data/e2e/train.jsonl")
    pairs = load_pairs(Path(data))[: a.rows]
    backbone0, tok = load_causal_lm(a.model, device="cpu", dtype="float32")
    enc = encode_pairs(tok, pairs)
    rng = np.random.default_rng(0)
    batches = [collate([enc[i] for i in rng.integers(0, len(enc), a.batch)], pad_id=pad_id_of(tok))
               for _ in range(a.batches)]
    vocab = int(backbone0.get_output_embeddings().weight.shape[0])
    d = int(backbone0.get_input_embeddings().weight.shape[1])
    n_body = body_linear_weights(backbone0)
    rows = []
    for kind in a.kinds.split(","):
        phase, fields = KINDS[kind]
        K = 1 if kind == "control" else a.k
        built = {}
        for path in a.paths.split(","):
            cfg = TrainConfig().replace(device="cpu", precision=a.precision, weighting="distribution",
                                        lora_rank=a.lora, batch_size=a.batch,
                                        hard_em_estep_tokens=a.estep_tokens, **{**fields, "n_latent": K})
            backbone, _ = load_causal_lm(a.model, device="cpu", dtype="float32")
            torch.manual_seed(0)
            model = build_cvae(cfg, backbone)
            store_frozen_body(model, cfg.optim)
            if kind == "control":
                model.set_given({p.id: 0 for p in pairs})
            verify_head(model.backbone)  # its probe row (once per model) is not the step's
            force_zfree_metrics(model, PATHS[path][0])
            model.packing_mode = PATHS[path][1]
            counts, counter = count_steps(model, cfg, phase, batches, vocab)
            ideal = [ideal_flops(kind, b, n_body, d, vocab, K, a.estep_tokens) for b in batches]
            frozen = [ideal_flops(kind, b, n_body, d, vocab, K, a.estep_tokens, backward=1)[0] for b in batches]
            mean = lambda key: float(np.mean([c[key] for c in counts]))  # noqa: E731
            rows.append({"kind": kind, "path": path, "gflop": mean("total") / 1e9, "body": mean("body") / 1e9,
                         "head": mean("head") / 1e9, "attention": mean("attention") / 1e9,
                         "ideal": float(np.mean([i[0] for i in ideal])) / 1e9,
                         "ratio": float(np.mean([(c["total"] - c["attention"]) / i[0] for c, i in zip(counts, ideal)])),
                         "ratio_frozen": float(np.mean([(c["total"] - c["attention"]) / i for c, i in zip(counts, frozen)])),
                         "tok_row": mean("body_tokens") / a.batch,
                         "ideal_tok_row": float(np.mean([i[1] for i in ideal])) / a.batch,
                         "layout_tok_row": float(np.mean([i[2] for i in ideal])) / a.batch, "counter": counter})
            print(rows[-1], flush=True)
            if a.time:
                built[path] = (model, cfg, torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4))
        for path, s in time_steps(built, phase, batches, a.time, a.clock).items():  # interleaved: new, old, new, old, ...
            next(r for r in rows if r["kind"] == kind and r["path"] == path)["s_step"] = s
    by = {(r["kind"], r["path"]): r for r in rows}
    lines = [f"model {a.model}: N_body {n_body:,} linear weights, d {d}, V {vocab}; batch {a.batch} of {data} "
             f"(mean of {a.batches} batches), LoRA rank {a.lora}, K {a.k}, E-step tokens {a.estep_tokens}, "
             f"precision {a.precision}, torch {torch.__version__}",
             "GFLOP per step (forward + backward), counted by "
             + " / ".join(sorted({r["counter"] for r in rows}))
             + " (torch.utils.flop_counter's formulas); ideal per the module docstring "
             "(backward = 2x forward); x ideal = (counted - attention) / ideal; x frozen: against the ideal "
             "with a frozen body's backward (1x forward: activation gradients only, as under LoRA); "
             "tok/row: decoder-layer tokens of the forward per row (counted, ideal, padded layout B (P_max + n L_max))",
             f"{'step':<9} {'path':<6} {'counted':>9} {'body':>8} {'head':>8} {'attn':>6} {'ideal':>8} "
             f"{'x ideal':>8} {'x frozen':>8} {'tok/row':>8} {'ideal':>6} {'layout':>6} {'new/old':>8}"
             + (f" {'s/step':>8} {'t n/o':>6} {'t n/p':>6}" if a.time else "")]
    ratio = lambda r, base, key: (f"{r[key] / base[key]:.3f}"  # noqa: E731
                                  if base is not None and r["path"] == "new" and key in r and key in base else "")
    for r in rows:
        old, padded = by.get((r["kind"], "old")), by.get((r["kind"], "padded"))
        rel = ratio(r, old, "gflop")
        timed = (f" {r['s_step']:>8.3f} {ratio(r, old, 's_step'):>6} {ratio(r, padded, 's_step'):>6}"
                 if "s_step" in r else "")
        lines.append(f"{r['kind']:<9} {r['path']:<6} {r['gflop']:>9.3f} {r['body']:>8.3f} {r['head']:>8.3f} "
                     f"{r['attention']:>6.3f} {r['ideal']:>8.3f} {r['ratio']:>8.3f} {r['ratio_frozen']:>8.3f} "
                     f"{r['tok_row']:>8.1f} {r['ideal_tok_row']:>6.1f} {r['layout_tok_row']:>6.1f} {rel:>8}{timed}")
    if a.time and ("control", "new") in by and ("soft", "new") in by and "s_step" in by[("soft", "new")]:
        c, k = by[("control", "new")], by[("soft", "new")]
        lines.append(f"K = {a.k} soft / control (new): {k['s_step'] / c['s_step']:.3f} in {a.clock} seconds; "
                     f"the ideal FLOPs' own ratio {k['ideal'] / c['ideal']:.3f}, tokens per row "
                     f"{k['ideal_tok_row'] / c['ideal_tok_row']:.3f} (batches of the timing may differ: mean of "
                     f"{a.batches} counted)")
    table = "\n".join(lines)
    print(table)
    if a.out:
        cmd = " ".join(shlex.quote(x) for x in [Path(sys.executable).name, *sys.argv])
        for machine, mark in ((tempfile.gettempdir(), "<tmp>"), (str(Path.home()), "~")):  # no machine paths
            cmd, table = cmd.replace(machine, mark), table.replace(machine, mark)
        Path(a.out).write_text(f"$ {cmd}\n{table}\n")


if __name__ == "__main__":
    main()
