"""Train the z-free (entangled) base model p_theta(y | x): a small GPT-2 with the loss on the
y-region only (y tokens and the end token), then write its z-free reference."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from zfree.config import BaseTrainConfig
from zfree.data.batching import collate, encode_pair, encode_pairs, pad_id_of
from zfree_lab.run.bpe import train_bpe_tokenizer
from zfree_lab.run.e2e import swap_names
from zfree.data.synth import DataConfig, sample_pairs
from zfree.data.pairs import load_pairs
from zfree_lab.run.tokenizer import build_digit_tokenizer
from zfree.core.io import atomic_write_dir, atomic_write_json, read_json, sha256_file
from zfree.core.progress import bar as progress_bar, hf_bars_only_on_a_terminal
from zfree.models.nll import masked_mean_token_nll
from zfree.models.base import build_synthetic_gpt2, target_logprobs
from zfree.models.routes import initial_soft_token
from zfree.models.loading import DTYPES
from zfree.reference.reference import build_reference
from zfree.reference.scoring import score_encoded
from zfree_lab.run.base_checkpoint import TextCheckpoint
from zfree.objective.theory import analytic_c_base


def lm_step(model, opt, sched, batch, inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
    """One language-model step on the y-region: loss = mean over the batch of the masked mean token
    NLL (nats per token) under ``model``, backward, gradient norm clipped to 1, optimizer and
    scheduler step. ``batch``: a ``collate``d ``Batch``; ``inputs_embeds`` (batch, seq, d_model): read
    instead of the ids' embeddings (``slot_inputs``). Returns the (scalar) loss before the step."""
    loss = masked_mean_token_nll(-target_logprobs(model, batch, inputs_embeds), batch.target_mask).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    return loss


def _optimizer(model, cfg: BaseTrainConfig):
    """AdamW and its schedule: linear warm-up over ``cfg.warmup_steps``, then cosine from 1 to 0.1
    of ``cfg.lr`` at ``cfg.max_steps`` (both base trainers)."""
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / cfg.warmup_steps) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / cfg.max_steps)))))
    return opt, sched


def _refuse_existing(out_dir: Path) -> None:
    if (out_dir / "model").exists():
        raise FileExistsError(f"{out_dir / 'model'} exists; choose another --out or remove it yourself")


def _benchmark_meta(data_dir: Path) -> dict:
    """``data_dir/metadata.json``; FileNotFoundError in one line where it is missing, naming the subfolders that
    hold one (``data/synth`` holds the benchmark ``default``)."""
    path = data_dir / "metadata.json"
    if path.is_file():
        return read_json(path)
    if not data_dir.is_dir():
        raise FileNotFoundError(f"data folder {data_dir}: no such folder")
    inside = sorted(str(p.parent) for p in data_dir.glob("*/metadata.json")) if data_dir.is_dir() else []
    hint = f"; these folders in it are: {', '.join(inside)}" if inside else ""
    raise FileNotFoundError(f"data folder {data_dir}: no metadata.json, so not a benchmark folder (`zfree data synth` "
                            f"and `zfree data e2e` write one){hint}")


def _save_model(model, tok, out_dir: Path) -> None:
    """``model`` (in eval mode) and ``tok`` to ``out_dir/model``, written under a temporary name and
    renamed, so a folder named ``model`` is always complete."""
    model.eval()

    def write(tmp: Path) -> None:
        with hf_bars_only_on_a_terminal():
            model.save_pretrained(tmp)  # a text model's config keeps dropout 0: only the module attribute p changed
        tok.save_pretrained(tmp)

    atomic_write_dir(out_dir / "model", write)


def _log_record(cfg: BaseTrainConfig, data_dir: Path, model, *, steps: int, init_from, t0: float, threads: int,
                dtype: str, **extra) -> dict:
    """The ``train_log.json`` record both trainers write (``extra``: each trainer's own keys)."""
    return {"config": asdict(cfg), "data_dir": str(data_dir), "steps": steps,
            "init_from": str(init_from) if init_from else None, "wall_s": time.time() - t0, "threads": threads,
            "command": " ".join(["zfree"] + sys.argv[1:]) if sys.argv else "", **extra,
            "torch": torch.__version__, "n_params": sum(p.numel() for p in model.parameters()), "dtype": dtype}


def train_base(data_dir: Path | str, out_dir: Path | str, cfg: BaseTrainConfig = BaseTrainConfig(),
               threads: int = 2, progress: bool = True, init_from: Path | str | None = None,
               dtype: str = "float32") -> dict:
    """Train the base model on ``data_dir/train.jsonl``; stop at ``cfg.target_ratio`` x the analytic
    c_base on val, ``cfg.max_steps`` or ``cfg.max_minutes``. With ``cfg.ema_decay`` the weights' moving
    average (``_averaged``) is scored, read by the stopping rule and saved instead of the last step's.
    ``cfg.slot="prefix"``: every step and evaluation reads the prefix route's step-0 layout (``slot_inputs``),
    so the val c_base and the stopping rule are the base reading s_0; ``reference/`` stays the base reading
    (x, y) as every base's (a prefix-route run scores its own reference through s_0, ``zfree.reference.prefix``).
    Writes ``out_dir/model`` (HF format with tokenizer), ``out_dir/train_log.json`` and
    ``out_dir/reference/``. Refuses to overwrite an existing ``out_dir/model`` (FileExistsError). A data
    folder whose metadata.json has ``"kind": "e2e"`` (real text) goes to ``train_text_base`` with the E2E
    name swap. ``dtype``: the weights, optimizer and scoring dtype (``"float64"``: the reference mode of the portable golden
    runs, tests/golden_runs.py; saved and scored in float64)."""
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    _refuse_existing(out_dir)
    torch.set_num_threads(threads)
    meta = _benchmark_meta(data_dir)
    if meta.get("kind") == "e2e":  # real text: no generator, no analytic c_base (train_text_base)
        return train_text_base(data_dir, out_dir, cfg, threads=threads, progress=progress, augment=swap_names,
                               init_from=init_from, dtype=dtype)
    tok = build_digit_tokenizer(meta["parameters"]["vocab_size"])
    train = [encode_pair(tok, p) for p in load_pairs(data_dir / "train.jsonl")]
    data_cfg, fresh_rng = _fresh_source(meta, cfg)
    val_pairs = load_pairs(data_dir / "val.jsonl")
    val = [encode_pair(tok, p) for p in val_pairs]
    analytic = analytic_c_base(val_pairs)
    max_len = max(len(e.prefix_ids) + len(e.target_ids) for e in train + val) + (cfg.slot != "none")
    model = _new_or_continued(len(tok), max(64, max_len), cfg, init_from, dtype)
    opt, sched = _optimizer(model, cfg)
    ema = _averaged(model, cfg)  # None without cfg.ema_decay; else what is scored and saved
    rng = np.random.default_rng(cfg.seed)
    pad = pad_id_of(tok)
    history, t0, step, ratio = [], time.time(), 0, float("inf")
    bar = progress_bar(total=cfg.max_steps, desc="base model", progress=progress, mininterval=2)
    model.train()
    while step < cfg.max_steps:
        rows = (_sampled_rows(tok, data_cfg, fresh_rng, cfg.batch_size) if data_cfg is not None
                else [train[i] for i in rng.integers(0, len(train), cfg.batch_size)])
        loss = lm_step(model, opt, sched, *slot_inputs(model, rows, pad, cfg.slot))
        if ema is not None:
            ema.update_parameters(model)
        step += 1
        bar.update(1)
        elapsed = time.time() - t0
        if step % cfg.eval_every == 0 or _over(cfg, elapsed):
            c, extra = _evaluate(model, ema, val, pad, cfg.slot)
            ratio = c / analytic
            history.append({"step": step, "wall_s": elapsed, "train_loss": loss.item(), "val_c_base": c,
                            "ratio_to_analytic": ratio, **extra})
            bar.set_postfix(val_c_base=f"{c:.4f}", ratio=f"{ratio:.3f}")
            if ratio <= cfg.target_ratio or _over(cfg, elapsed):
                break
    bar.close()
    _save_model(model if ema is None else ema.module, tok, out_dir)
    log = _log_record(cfg, data_dir, model, steps=step, init_from=init_from, t0=t0, threads=threads, dtype=dtype,
                      c_base_analytic=analytic, final_ratio=ratio, history=history)
    atomic_write_json(out_dir / "train_log.json", log)
    build_reference(out_dir, data_dir, dtype=dtype)
    return log


def _evaluate(model, ema, val: list, pad: int, slot: str = "none") -> tuple[float, dict]:
    """The val c_base (nats/token) of what ``train_base`` keeps: ``model``, or its moving average ``ema``;
    with the average, ``{"val_c_base_last_step": ...}`` too (the same rows under the last step's weights, the
    comparison that says what the average bought). Under ``slot="prefix"`` each model reads its own initial
    soft token (``slot_inputs``). ``model`` is back in training mode after."""
    def score(m) -> float:
        soft = initial_soft_token(m) if slot == "prefix" else None
        return score_encoded(m, val, pad_id=pad, soft_token=soft).c_base

    scored = (model if ema is None else ema.module).eval()  # nn.Module.eval returns the module
    c = score(scored)
    extra = {} if ema is None else {"val_c_base_last_step": score(model.eval())}
    model.train()
    return c, extra


def slot_inputs(model, rows: list, pad: int, slot: str = "none") -> tuple:
    """``(batch, inputs_embeds)`` of one training step on ``rows`` (``EncodedPair``s). ``slot="none"``: the
    rows as encoded, ``inputs_embeds`` None. ``slot="prefix"``: the prefix route's step-0 layout
    [bos] x, s_0, sep, y: a placeholder id (``pad``) put before each row's separator, and its input embedding
    replaced by s_0 = ``initial_soft_token(model)`` (computed now, no gradient), as ``score_encoded`` reads a
    soft token; S and its tokens unchanged, every later position one on."""
    if slot == "none":
        return collate(rows, pad_id=pad), None
    batch = collate([replace(e, prefix_ids=(*e.prefix_ids[:-1], pad, e.prefix_ids[-1])) for e in rows], pad_id=pad)
    embeds = model.get_input_embeddings()(batch.input_ids)  # (B, T, D)
    at = (batch.prefix_len - 2)[:, None]  # (B, 1): the slot, just before the separator
    is_slot = (torch.arange(embeds.shape[1], device=embeds.device)[None, :] == at)[..., None]
    return batch, torch.where(is_slot, initial_soft_token(model).to(embeds.dtype), embeds)


def _sampled_rows(tok, data_cfg, fresh_rng, n: int) -> list:
    """``n`` rows drawn anew from the benchmark's generator (``cfg.data_source == "fresh"``), encoded."""
    return [encode_pair(tok, p) for p in sample_pairs(data_cfg, fresh_rng, n)]


def _averaged(model, cfg: BaseTrainConfig):
    """``torch.optim.swa_utils.AveragedModel`` keeping the exponential moving average of ``model``'s weights
    and buffers at ``cfg.ema_decay`` (its first update copies them), or None when ``cfg.ema_decay`` is 0."""
    if not cfg.ema_decay:
        return None
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    return AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(cfg.ema_decay), use_buffers=True)


def _fresh_source(meta: dict, cfg: BaseTrainConfig):
    """``(DataConfig, its rng)`` to sample every batch anew (``cfg.data_source == "fresh"``; the rng
    seeded ``[1000 + cfg.seed]``), else ``(None, None)`` (the train split)."""
    if cfg.data_source != "fresh":
        return None, None
    params = {k: v for k, v in meta["parameters"].items() if k in DataConfig.__dataclass_fields__}
    return DataConfig(**params), np.random.default_rng([1000 + cfg.seed])


def _new_or_continued(vocab: int, n_positions: int, cfg: BaseTrainConfig, init_from, dtype: str):
    """A new GPT-2 of ``cfg``'s shape, or the finished base model ``init_from`` (a second phase)."""
    if init_from is not None:
        return AutoModelForCausalLM.from_pretrained(init_from, local_files_only=True, dtype=DTYPES[dtype])
    return build_synthetic_gpt2(vocab, n_positions=n_positions, n_layer=cfg.n_layer, n_embd=cfg.n_embd,
                                n_head=cfg.n_head, seed=cfg.seed, dtype=DTYPES[dtype])


def _over(cfg: BaseTrainConfig, elapsed: float) -> bool:
    """Past the wall-clock budget ``cfg.max_minutes`` (never when it is None: steps alone decide)."""
    return cfg.max_minutes is not None and elapsed > cfg.max_minutes * 60


class _Best:
    """The best val c_base so far, its step and weights; ``since``: evaluations without a new best."""

    def __init__(self):
        self.c, self.step, self.since, self.state = float("inf"), 0, 0, None

    def update(self, model, c: float, step: int) -> None:
        if c < self.c:
            self.c, self.step, self.since = c, step, 0
            self.state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            self.since += 1


TEXT_VOCAB_SIZE = 1500  # byte-level BPE entries: specials + 256 bytes + ~1240 merges (E2E: ~30 tokens per y)
TEXT_DROPOUT = 0.1  # training only; the saved config has dropout 0 (identical to eval mode)
TEXT_EVAL_ROWS = 1000  # validation rows scored at each evaluation (the reference scores all of them)
TEXT_PATIENCE = 4  # evaluations without a new best val c_base before stopping
TEXT_AUGMENT_P = 0.5  # share of training rows passed through ``augment`` (fresh draw per use)


def train_text_base(data_dir: Path | str, out_dir: Path | str, cfg: BaseTrainConfig = BaseTrainConfig(),
                    threads: int = 1, progress: bool = True, vocab_size: int = TEXT_VOCAB_SIZE,
                    augment=None, init_from: Path | str | None = None, dtype: str = "float32",
                    checkpoint_dir: Path | str | None = None) -> dict:
    """Train a base GPT-2 from scratch on real text (``data_dir/train.jsonl``, e.g. E2E) and write
    its z-free reference on ``data_dir/val.jsonl``.

    A byte-level BPE tokenizer (``zfree_lab.run.bpe``) is trained on the train split's x and y. Loss
    on the y-region only (y tokens and the end token), masked mean per example (as ``train_base``),
    with dropout ``TEXT_DROPOUT`` during training. ``augment(pair, rng) -> pair``, when given, rewrites
    a share ``TEXT_AUGMENT_P`` of the training rows of each batch (E2E: ``zfree_lab.run.e2e.swap_names``);
    a rewritten row longer than the context falls back to the original. Every ``cfg.eval_every`` steps the val c_base
    (nats/token) of the first ``TEXT_EVAL_ROWS`` val rows is computed; the best weights are kept,
    and training stops after ``TEXT_PATIENCE`` evaluations without a new best, at ``cfg.max_steps``
    or at ``cfg.max_minutes``. The selection uses val rows, so the shipped c_base is a slightly
    optimistic estimate. ``cfg.target_ratio`` and ``cfg.data_source`` do not apply (no generator).
    ``init_from``: continue from a finished text base model folder (its tokenizer is reused; a
    second phase with a fresh warm-up and cosine schedule).
    Writes ``out_dir/model`` (HF format with tokenizer), ``out_dir/train_log.json`` and
    ``out_dir/reference/``. FileExistsError if ``out_dir/model`` exists. ``dtype`` as ``train_base``'s.
    ``checkpoint_dir``: resumable training (``TextCheckpoint``): the state is written there at every
    evaluation, and a call that finds one of the same arguments continues from it, ending with the
    weights an uninterrupted call ends with (same steps, batches, dropout masks and schedule).
    """
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    _refuse_existing(out_dir)
    if cfg.ema_decay:
        raise ValueError(f"ema_decay={cfg.ema_decay} applies to the synthetic benchmark's base (train_base); "
                         "a text base keeps its best evaluated weights instead")
    if cfg.slot != "none":
        raise ValueError(f"slot={cfg.slot!r} applies to the synthetic benchmark's base (train_base) only")
    torch.set_num_threads(threads)
    t0 = time.time()
    train_pairs, val_pairs = load_pairs(data_dir / "train.jsonl"), load_pairs(data_dir / "val.jsonl")
    ckpt = None if checkpoint_dir is None else TextCheckpoint(checkpoint_dir, {
        "config": asdict(cfg), "init_from": str(init_from), "dtype": dtype,  # the data by content: a moved folder resumes
        "data_sha256": {f: sha256_file(data_dir / f) for f in ("train.jsonl", "val.jsonl")},
        "vocab_size": vocab_size, "augment": getattr(augment, "__name__", None), "torch": torch.__version__})
    resumed = None if ckpt is None else ckpt.latest()
    start = init_from if resumed is None else resumed.model_dir  # a resumed run continues the checkpoint's weights
    tok, model, train, val, n_positions = _text_model(train_pairs, val_pairs, cfg, vocab_size, start, dtype,
                                                      context_from=init_from)
    eval_rows = val[:TEXT_EVAL_ROWS]
    step, history, best, t0 = _text_loop(model, tok, cfg, (train, train_pairs, eval_rows), augment, n_positions,
                                         resumed, ckpt, seed_dropout=init_from is not None, t0=t0, progress=progress)
    model.load_state_dict(best.state)
    _save_model(model, tok, out_dir)
    log = _log_record(cfg, data_dir, model, steps=step, init_from=init_from, t0=t0, threads=threads, dtype=dtype,
                      kind="text", best_step=best.step, best_val_c_base_eval_rows=best.c, eval_rows=len(eval_rows),
                      vocab_size=len(tok), dropout_train=TEXT_DROPOUT, patience=TEXT_PATIENCE,
                      augment=getattr(augment, "__name__", None), augment_p=TEXT_AUGMENT_P if augment else 0.0,
                      history=history, c_base_analytic=None, final_ratio=None)  # no generator: no analytic c_base
    ref = build_reference(out_dir, data_dir, dtype=dtype)
    log["c_base"] = ref.c_base
    log["wall_s_with_reference"] = time.time() - t0
    atomic_write_json(out_dir / "train_log.json", log)
    return log


def _text_loop(model, tok, cfg: BaseTrainConfig, rows, augment, n_positions: int, resumed, ckpt, *,
               seed_dropout: bool, t0: float, progress: bool):
    """``train_text_base``'s steps and evaluations: ``rows`` = (encoded train, train pairs, encoded
    evaluation rows); continues ``resumed`` (a ``Resumed``) when given, writes ``ckpt`` at each
    evaluation that does not end the training. Returns ``(steps, history, best, t0)``."""
    train, train_pairs, eval_rows = rows
    opt, sched = _optimizer(model, cfg)
    rng = np.random.default_rng(cfg.seed)
    pad = pad_id_of(tok)
    history, step, best = [], 0, _Best()
    if resumed is not None:  # the checkpoint's optimizer, schedule, random streams, history and best
        step, history, elapsed = resumed.restore(opt, sched, rng, best)
        t0 = time.time() - elapsed
    elif seed_dropout:  # a fine-tune's dropout masks are seeded (a new model's are by its build)
        torch.manual_seed(cfg.seed)
    bar = progress_bar(total=cfg.max_steps, initial=step, desc="text base model", progress=progress, mininterval=2)
    model.train()
    while step < cfg.max_steps:
        batch = _text_rows(tok, train, train_pairs, rng, cfg.batch_size, augment, n_positions)
        loss = lm_step(model, opt, sched, collate(batch, pad_id=pad))
        step += 1
        bar.update(1)
        elapsed = time.time() - t0
        if step % cfg.eval_every == 0 or _over(cfg, elapsed) or step == cfg.max_steps:
            c = score_encoded(model, eval_rows, pad_id=pad).c_base  # eval mode inside, restored after
            history.append({"step": step, "wall_s": elapsed, "train_loss": loss.item(), "val_c_base": c})
            bar.set_postfix(val_c_base=f"{c:.4f}", best=f"{min(c, best.c):.4f}")
            best.update(model, c, step)
            if best.since >= TEXT_PATIENCE or _over(cfg, elapsed) or step == cfg.max_steps:
                break
            if ckpt is not None:
                ckpt.save(step, model, tok, opt, sched, rng, best, history, elapsed)
    bar.close()
    return step, history, best, t0


def _text_model(train_pairs, val_pairs, cfg: BaseTrainConfig, vocab_size: int, init_from, dtype: str,
                context_from=None):
    """``(tokenizer, model, encoded train, encoded val, context length)`` of ``train_text_base``: a
    new BPE tokenizer and GPT-2 (context: the longest row + 48, in multiples of 32), or those of
    ``init_from``; the model's dropout modules set to ``TEXT_DROPOUT`` (its config keeps 0).
    ``context_from``: the run's own ``init_from`` when ``init_from`` is its checkpoint (the context
    length is the one the run started with)."""
    tok = (AutoTokenizer.from_pretrained(init_from, local_files_only=True) if init_from is not None
           else train_bpe_tokenizer((t for p in train_pairs for t in (p.x, p.y)), vocab_size))
    train, val = encode_pairs(tok, train_pairs), encode_pairs(tok, val_pairs)
    max_len = max(len(e.prefix_ids) + len(e.target_ids) for e in train + val)
    n_positions = 32 * math.ceil((max_len + 48) / 32)  # room for longer (augmented) rows and user data
    model = _new_or_continued(len(tok), n_positions, cfg, init_from, dtype)
    if context_from is not None:  # the finished model's own context
        n_positions = getattr(model.config, "n_positions", None) or model.config.max_position_embeddings
    for m in model.modules():  # dropout during training only (the saved config keeps 0)
        if isinstance(m, torch.nn.Dropout):
            m.p = TEXT_DROPOUT
    return tok, model, train, val, n_positions


def _text_rows(tok, train, train_pairs, rng, batch_size: int, augment, n_positions: int) -> list:
    """One batch of encoded training rows, a share ``TEXT_AUGMENT_P`` rewritten by ``augment`` (a
    rewritten row longer than the context falls back to the original)."""
    picked = rng.integers(0, len(train), batch_size)
    rows = [train[i] for i in picked]
    if augment is not None:
        swap = [j for j in range(len(rows)) if rng.random() < TEXT_AUGMENT_P]
        new = encode_pairs(tok, [augment(train_pairs[picked[j]], rng) for j in swap])
        for j, e in zip(swap, new):
            if len(e.prefix_ids) + len(e.target_ids) <= n_positions:
                rows[j] = e
    return rows
