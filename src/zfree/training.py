"""CVAE training: build from the base run, train under the objective, evaluate, write the run
folder of DESIGN §5 (config.json, metrics.jsonl, summary.json, per_example.parquet, checkpoint/).

A run folder with a ``summary.json`` is finished and is never rewritten.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_model
from tqdm.auto import tqdm

from zfree.config import TrainConfig
from zfree.data.batching import collate, encode_pair, pad_id_of
from zfree.data.pairs import load_pairs
from zfree.io import append_jsonl, atomic_write_json, atomic_write_parquet, read_json, sha256_file
from zfree.losses import assemble_objective, masked_mean_token_nll
from zfree.metrics import evaluate
from zfree.models.base import load_base
from zfree.models.discrete import DiscreteCVAE
from zfree.reference import load_reference


class NonFiniteLossError(RuntimeError):
    pass


def _versions() -> dict[str, str]:
    out = {}
    for p in ("zfree", "torch", "transformers", "tokenizers", "numpy", "pandas"):
        try:
            out[p] = md.version(p)
        except md.PackageNotFoundError:
            pass
    return out


def lr_lambdas(cfg: TrainConfig):
    """Backbone: linear warm-up over ``warmup_backbone`` steps; new heads: constant."""
    w = cfg.optim.warmup_backbone
    return [lambda s: min(1.0, (s + 1) / w) if w else 1.0, lambda s: 1.0]


def build_optimizer(model: DiscreteCVAE, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW with every trainable parameter in exactly one of two groups (checked)."""
    backbone = [p for n, p in model.named_parameters() if n.startswith("backbone.") and p.requires_grad]
    new = [p for n, p in model.named_parameters() if not n.startswith("backbone.") and p.requires_grad]
    ids = [id(p) for p in backbone + new]
    assert len(ids) == len(set(ids)) == sum(1 for p in model.parameters() if p.requires_grad)
    return torch.optim.AdamW([
        {"params": backbone, "lr": cfg.optim.lr_backbone, "name": "backbone"},
        {"params": new, "lr": cfg.optim.lr_new, "name": "new"},
    ], weight_decay=cfg.optim.weight_decay)


def train_cvae(cfg: TrainConfig, out_dir: Path | str, progress: bool = True) -> dict:
    """Train one discrete CVAE and write its run folder; returns the summary.

    c_base and b come from the base run's ``reference/`` (entangled-run estimator). Raises
    FileNotFoundError / ValueError naming the file or field for a bad base run or data folder,
    NonFiniteLossError (after saving ``error.json``) if the loss goes non-finite.
    """
    out = Path(out_dir)
    if (out / "summary.json").exists():
        return read_json(out / "summary.json")
    torch.set_num_threads(cfg.optim.threads)
    torch.manual_seed(cfg.optim.seed)
    data_dir, base_dir = Path(cfg.data_dir), Path(cfg.base_dir)
    for f in (data_dir / "train.jsonl", data_dir / "val.jsonl", base_dir / "model"):
        if not f.exists():
            raise FileNotFoundError(f"{f} does not exist (data_dir={cfg.data_dir!r}, base_dir={cfg.base_dir!r})")
    ref = load_reference(base_dir)
    if cfg.objective.c_base_source != "entangled_run":
        raise ValueError(f"c_base_source={cfg.objective.c_base_source!r} is not supported by this trainer yet")
    c_base = ref.c_base
    backbone, tok = load_base(base_dir / "model", device=cfg.optim.device)
    model = DiscreteCVAE(backbone, cfg.model.n_latent, cfg.model.posterior_features).to(cfg.optim.device)
    model.train()
    pad = pad_id_of(tok)
    train_pairs = load_pairs(data_dir / "train.jsonl")
    val_pairs = load_pairs(data_dir / "val.jsonl")
    if cfg.optim.eval_rows:
        val_pairs = val_pairs[: cfg.optim.eval_rows]
    train = [encode_pair(tok, p) for p in train_pairs]
    val = [encode_pair(tok, p) for p in val_pairs]
    val_b = np.array(ref.b_of([p.id for p in val_pairs]))
    train_b = None
    if cfg.objective.needs_example_b:
        raise ValueError(f"weighting={cfg.objective.weighting!r} needs per-example b on training rows; "
                         "not supported by this trainer yet")
    meta = read_json(data_dir / "metadata.json") if (data_dir / "metadata.json").exists() else {}
    strategies = meta.get("parameters", {}).get("strategies")

    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "config.json", {
        **cfg.to_flat(), "_versions": _versions(), "_c_base": c_base,
        "_data_sha256": {s: sha256_file(data_dir / f"{s}.jsonl") for s in ("train", "val")},
        "_base_model_sha256": ref.meta.get("model_sha256"), "_reference": ref.meta})
    (out / "metrics.jsonl").unlink(missing_ok=True)  # an unfinished run restarts from scratch

    opt = build_optimizer(model, cfg)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambdas(cfg))
    rng = np.random.default_rng(cfg.optim.seed)
    eval_kw = dict(b=val_b, c_base=c_base, objective=cfg.objective, pad_id=pad, tokenizer=tok,
                   strategies=strategies, decode_rows=cfg.optim.decode_rows, seed=cfg.optim.seed)

    def do_eval(step, wall):
        ev = evaluate(model, val, val_pairs, step=step, **eval_kw)
        append_jsonl(out / "metrics.jsonl", {**ev.metrics, "wall_s": wall})
        return ev

    t0 = time.time()
    ev = do_eval(0, 0.0)
    init_metrics = ev.metrics
    bar = tqdm(range(1, cfg.optim.steps + 1), desc=f"{cfg.objective.weighting} beta={cfg.objective.beta:g}",
               disable=not progress, mininterval=5)
    for step in bar:
        idx = rng.integers(0, len(train), cfg.optim.batch_size)
        batch = collate([train[i] for i in idx], pad_id=pad).to(cfg.optim.device)
        o = model(batch)
        recon = masked_mean_token_nll(-o.target_logprobs, batch.target_mask)
        br = assemble_objective(cfg.objective, recon_per_latent=recon, q_logits=o.posterior_logits,
                                p_logits=o.prior_logits, target_len=batch.target_len, step=step, c_base=c_base,
                                b=None if train_b is None else torch.as_tensor(train_b[idx]))
        if not torch.isfinite(br.total):
            bad = [k for k, v in {**br.terms, **br.contributions}.items() if not torch.isfinite(v)]
            err = {"step": step, "batch_ids": batch.ids, "non_finite_terms": bad}
            atomic_write_json(out / "error.json", err)
            raise NonFiniteLossError(f"non-finite loss at step {step}: terms {bad} (see {out / 'error.json'})")
        opt.zero_grad(set_to_none=True)
        br.total.backward()
        if cfg.optim.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        opt.step()
        sched.step()
        if step % 10 == 0:
            bar.set_postfix(kl=f"{br.terms['kl_prior_loss'].item():.3f}",
                            rec=f"{br.terms['reconstruction_loss'].item():.4f}", refresh=False)
        if step % cfg.optim.eval_every == 0 or step == cfg.optim.steps:
            ev = do_eval(step, time.time() - t0)
    bar.close()
    wall = time.time() - t0
    atomic_write_parquet(out / "per_example.parquet", ev.per_example)
    (out / "checkpoint").mkdir(exist_ok=True)
    save_model(model, str(out / "checkpoint" / "model.safetensors"), metadata={"config": json.dumps(cfg.to_flat())})
    summary = {**ev.metrics, **cfg.to_flat(), "steps": cfg.optim.steps, "wall_s": wall,
               "init/task/correctness": init_metrics.get("task/correctness"),
               "init/loss/val/baseline_normalized_reconstruction_loss":
                   init_metrics["loss/val/baseline_normalized_reconstruction_loss"],
               "latent_used": bool(ev.metrics["latent/measured_use_fraction"] > 0.5),
               "predicted_latent_used": bool(ev.metrics["latent/predicted_use_fraction"] > 0.5)}
    atomic_write_json(out / "summary.json", summary)
    return summary
