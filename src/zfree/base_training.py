"""Train the z-free (entangled) base model p_theta(y | x): a small GPT-2 with the loss on the
y-region only (y tokens and the end token), then write its z-free reference."""

from __future__ import annotations

import math
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from zfree.config import BaseTrainConfig
from zfree.data.batching import collate, encode_pair, pad_id_of
from zfree.data.pairs import load_pairs
from zfree.data.tokenizer import build_digit_tokenizer
from zfree.io import atomic_write_json, read_json
from zfree.losses import masked_mean_token_nll
from zfree.models.base import build_synthetic_gpt2, target_logprobs
from zfree.reference import build_reference
from zfree.scoring import score_encoded
from zfree.theory import analytic_c_base


def train_base(data_dir: Path | str, out_dir: Path | str, cfg: BaseTrainConfig = BaseTrainConfig(),
               threads: int = 2, progress: bool = True, init_from: Path | str | None = None) -> dict:
    """Train the base model on ``data_dir/train.jsonl``; stop at ``cfg.target_ratio`` x the analytic
    c_base on val, ``cfg.max_steps`` or ``cfg.max_minutes``. Writes ``out_dir/model`` (HF format with
    tokenizer), ``out_dir/train_log.json`` and ``out_dir/reference/``. Refuses to overwrite an
    existing ``out_dir/model`` (FileExistsError)."""
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    if (out_dir / "model").exists():
        raise FileExistsError(f"{out_dir / 'model'} exists; choose another --out or remove it yourself")
    torch.set_num_threads(threads)
    meta = read_json(data_dir / "metadata.json")
    tok = build_digit_tokenizer(meta["parameters"]["vocab_size"])
    train = [encode_pair(tok, p) for p in load_pairs(data_dir / "train.jsonl")]
    data_cfg = None
    if cfg.data_source == "fresh":
        from zfree.config import DataConfig
        from zfree.data.synth import sample_pairs

        params = {k: v for k, v in meta["parameters"].items() if k in DataConfig.__dataclass_fields__}
        data_cfg = DataConfig(**params)
        fresh_rng = np.random.default_rng([1000 + cfg.seed])
    val_pairs = load_pairs(data_dir / "val.jsonl")
    val = [encode_pair(tok, p) for p in val_pairs]
    analytic = analytic_c_base(val_pairs)
    max_len = max(len(e.prefix_ids) + len(e.target_ids) for e in train + val)
    if init_from is not None:  # continue training a finished base model (a second, lower-rate phase)
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(init_from, local_files_only=True, dtype=torch.float32)
    else:
        model = build_synthetic_gpt2(len(tok), n_positions=max(64, max_len), n_layer=cfg.n_layer, n_embd=cfg.n_embd,
                                     n_head=cfg.n_head, seed=cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / cfg.warmup_steps) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / cfg.max_steps)))))
    rng = np.random.default_rng(cfg.seed)
    pad = pad_id_of(tok)
    history, t0, step, ratio = [], time.time(), 0, float("inf")
    bar = tqdm(total=cfg.max_steps, desc="base model", disable=not progress, mininterval=2)
    model.train()
    while step < cfg.max_steps:
        if data_cfg is not None:
            rows = [encode_pair(tok, p) for p in sample_pairs(data_cfg, fresh_rng, cfg.batch_size)]
        else:
            rows = [train[i] for i in rng.integers(0, len(train), cfg.batch_size)]
        batch = collate(rows, pad_id=pad)
        nll = masked_mean_token_nll(-target_logprobs(model, batch), batch.target_mask)
        loss = nll.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        bar.update(1)
        elapsed = time.time() - t0
        if step % cfg.eval_every == 0 or elapsed > cfg.max_minutes * 60:
            model.eval()
            c = score_encoded(model, val, pad_id=pad).c_base
            model.train()
            ratio = c / analytic
            history.append({"step": step, "wall_s": elapsed, "train_loss": loss.item(), "val_c_base": c,
                            "ratio_to_analytic": ratio})
            bar.set_postfix(val_c_base=f"{c:.4f}", ratio=f"{ratio:.3f}")
            if ratio <= cfg.target_ratio or elapsed > cfg.max_minutes * 60:
                break
    bar.close()
    model.eval()
    tmp = out_dir / ".model.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(out_dir / "model")
    log = {"config": asdict(cfg), "data_dir": str(data_dir), "steps": step, "init_from": str(init_from) if init_from else None, "wall_s": time.time() - t0,
           "threads": threads, "command": " ".join(["zfree"] + sys.argv[1:]) if sys.argv else "",
           "c_base_analytic": analytic, "final_ratio": ratio, "history": history,
           "torch": torch.__version__, "n_params": sum(p.numel() for p in model.parameters())}
    atomic_write_json(out_dir / "train_log.json", log)
    build_reference(out_dir, data_dir)
    return log
