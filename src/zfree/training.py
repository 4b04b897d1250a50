"""CVAE training: build from the base run, train under the objective (optionally with a
symmetry-breaking aid), evaluate, checkpoint, resume, and write the run folder of DESIGN §5
(config.json, metrics.jsonl, summary.json, per_example.parquet, checkpoint/).

A run folder with ``summary.json`` is finished and never rewritten. A run folder with a
``checkpoint/`` from the same config resumes exactly where it stopped (CPU: the same summary as
an uninterrupted run, timing keys aside).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata as md
import json
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_model, save_model
from tqdm.auto import tqdm

from zfree.config import TrainConfig
from zfree.data.batching import Batch, collate, encode_pair, pad_id_of
from zfree.data.pairs import load_pairs
from zfree.io import append_jsonl, atomic_write_json, atomic_write_parquet, atomic_write_text, read_json, read_jsonl
from zfree.losses import (ObjectiveBreakdown, assemble_objective, inter_latent_jsd, masked_mean_token_nll,
                          reconstruction_weight, token_weights, weighted_mean_token_nll)
from zfree.losses import assemble_gaussian_objective
from zfree.metrics import evaluate
from zfree.models.base import load_base
from zfree.models.continuous import ContinuousCVAE
from zfree.models.discrete import DiscreteCVAE
from zfree.reference import resolve_reference
from zfree.scoring import context_length

TIMING_KEYS = ("wall_s",)  # the only summary keys that differ between a resumed and an uninterrupted run


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


#: warn when one latent value is the posterior's argmax on at least this share of validation rows
INDEX_COLLAPSE_SHARE = 0.9

#: top-level parameter names of the posterior q(z | x, y) (both CVAEs): what the frozen-decoder
#: warm phase trains
POSTERIOR_SIDE = ("posterior_head", "pool_query", "encoder")


def build_optimizer(model: DiscreteCVAE, cfg: TrainConfig, log=print) -> torch.optim.Optimizer:
    """AdamW with every trainable parameter in exactly one of two groups (checked at start):
    ``backbone`` (lr_backbone, warmed up) and ``new`` (heads and latent embeddings, lr_new)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    backbone = [p for n, p in named if n.startswith("backbone.")]
    new = [p for n, p in named if not n.startswith("backbone.")]
    ids = [id(p) for p in backbone + new]
    if len(ids) != len(set(ids)) or len(ids) != len(named):
        raise RuntimeError("optimizer groups do not partition the trainable parameters")
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    if log:
        log(f"parameters: backbone {sum(p.numel() for p in backbone):,} (from the base model), "
            f"new {sum(p.numel() for p in new):,} ({', '.join(model.new_parameter_names())}), frozen {frozen:,}")
    groups = [{"params": backbone, "lr": cfg.optim.lr_backbone, "name": "backbone"},
              {"params": new, "lr": cfg.optim.lr_new, "name": "new"}]
    if cfg.optim.optimizer == "sgd":
        return torch.optim.SGD(groups, weight_decay=cfg.optim.weight_decay)
    return torch.optim.AdamW(groups, weight_decay=cfg.optim.weight_decay)


@dataclass
class TrainState:
    """Everything besides weights and optimizer moments that a resumed run needs."""

    step: int = 0
    phase: str = "soft"  # "hard" during the hard-EM phase of hard_em_then_soft
    handover_step: int | None = None
    handover_forced: bool = False
    gate: list = field(default_factory=list)  # hand-over diagnostics over training
    restarts: list = field(default_factory=list)
    usage: list = field(default_factory=list)  # posterior-argmax counts since the last restart check
    train_log: dict = field(default_factory=dict)  # running sums of training terms since the last eval


# ---------------------------------------------------------------------------- objective per step


def soft_objective(model: DiscreteCVAE, batch: Batch, cfg: TrainConfig, step: int, c_base: float,
                   b: torch.Tensor | None, base_tok: torch.Tensor | None) -> ObjectiveBreakdown:
    """The true objective J (DESIGN §1) on one batch, with the beta0_warmup aid applied."""
    obj = cfg.objective
    warm = cfg.aid.aid == "beta0_warmup" and step <= cfg.aid.warmup_aid_steps
    o = model(batch, with_distributions=obj.lambda_jsd > 0)
    tok_nll = -o.target_logprobs
    if obj.weighting == "token":
        recon = weighted_mean_token_nll(tok_nll, batch.target_mask, token_weights(base_tok, batch.target_mask,
                                                                                 obj.token_alpha))
    else:
        recon = masked_mean_token_nll(tok_nll, batch.target_mask)
    jsd = None
    if obj.lambda_jsd > 0:
        jsd = inter_latent_jsd(o.next_token_logprobs, torch.softmax(o.prior_logits, -1), o.pos_mask)
    if warm:
        obj = dataclasses.replace(obj, beta=0.0, beta_schedule="constant")
    q_logits = None if model.posterior_head is None else o.posterior_logits  # None: the optimal posterior
    return assemble_objective(obj, recon_per_latent=recon, q_logits=q_logits,
                              p_logits=o.prior_logits.detach() if warm else o.prior_logits,
                              target_len=batch.target_len, step=step, c_base=c_base, b=b, jsd=jsd)


def continuous_objective(model: ContinuousCVAE, batch: Batch, cfg: TrainConfig, step: int, c_base: float,
                         b: torch.Tensor | None, base_tok: torch.Tensor | None) -> ObjectiveBreakdown:
    """J of the continuous CVAE on one batch (DESIGN §1): the per-sample reconstruction is reduced
    like the K discrete values (token weights inside, w outside), the KL is analytic; beta0_warmup
    applies as in ``soft_objective`` (beta = 0, the prior detached)."""
    obj = cfg.objective
    warm = cfg.aid.aid == "beta0_warmup" and step <= cfg.aid.warmup_aid_steps
    o = model(batch)
    tok_nll = -o.target_logprobs  # (B, S, T)
    if obj.weighting == "token":
        recon = weighted_mean_token_nll(tok_nll, batch.target_mask, token_weights(base_tok, batch.target_mask,
                                                                                 obj.token_alpha))
    else:
        recon = masked_mean_token_nll(tok_nll, batch.target_mask)  # (B, S)
    if warm:
        obj = dataclasses.replace(obj, beta=0.0, beta_schedule="constant")
    learned = model.prior == "learned"
    mu_p = (o.prior_mean.detach() if warm else o.prior_mean) if learned else None
    logvar_p = (o.prior_logvar.detach() if warm else o.prior_logvar) if learned else None
    return assemble_gaussian_objective(obj, recon_per_sample=recon, mu_q=o.posterior_mean, logvar_q=o.posterior_logvar,
                                       mu_p=mu_p, logvar_p=logvar_p, target_len=batch.target_len, step=step,
                                       c_base=c_base, b=b)


def hard_em_objective(model: DiscreteCVAE, batch: Batch, cfg: TrainConfig, step: int, c_base: float,
                      b: torch.Tensor | None) -> tuple[ObjectiveBreakdown, torch.Tensor]:
    """Hard EM (mixture-of-experts translation, Shen et al. 2019, "hard-MoE"): the decoder reconstructs
    with one value per example, the best-reconstructing k* = argmin_k nll_k (``hard_em_decoder='best'``,
    winner-take-all; ties: the posterior's argmax) or the posterior's argmax; the posterior is trained
    by cross-entropy toward k*; the router by cross-entropy toward the (detached) posterior. The K-way
    nll that picks k* is computed without gradient and only the decoded value's pass is
    differentiated (``DiscreteCVAE.forward_selected``). The reconstruction weight is the
    weighting's w_i, rescaled to mean 1/c_base over the batch when ``hard_em_recon_scale='c_base'``.
    With ``posterior_features='optimal'`` (no head) the posterior is one-hot on k* (the hard limit of
    the optimal posterior) and the posterior cross-entropy is 0.
    Returns the breakdown and the posterior argmax (batch,)."""
    outer = cfg.objective.token_outer if cfg.objective.weighting == "token" else cfg.objective.weighting

    picked = {}

    def choose(o):  # k* from the detached K-way log-probs; the decoded value: k* or the posterior's argmax
        nll = masked_mean_token_nll(-o.target_logprobs, batch.target_mask)  # (B, K)
        q = torch.softmax(o.posterior_logits.detach(), -1)
        picked["k_star"] = (nll - 1e-7 * q).argmin(-1)
        return picked["k_star"] if cfg.aid.hard_em_decoder == "best" else q.argmax(-1)

    o, tlp_z, _ = model.forward_selected(batch, choose)  # only the decoded value's passes carry gradient
    k_star = picked["k_star"]
    optimal = model.posterior_head is None  # the optimal posterior under hard EM: one-hot on k*
    q_logp = (torch.log(torch.nn.functional.one_hot(k_star, model.n_latent).to(tlp_z.dtype).clamp_min(1e-12))
              if optimal else torch.log_softmax(o.posterior_logits, -1))
    z_hat = q_logp.argmax(-1)
    rec = masked_mean_token_nll(-tlp_z, batch.target_mask)  # (B,)
    w = reconstruction_weight(outer, batch_size=len(batch), c_base=c_base, b=b, epsilon=cfg.objective.epsilon,
                              dtype=rec.dtype)
    if cfg.aid.hard_em_recon_scale == "c_base":  # the distribution scale for every weighting
        w = w / w.mean() / c_base
    ce_q = (torch.zeros_like(rec) if optimal else
            torch.nn.functional.cross_entropy(o.posterior_logits, k_star, reduction="none"))
    ce_p = -(q_logp.detach().exp() * torch.log_softmax(o.prior_logits, -1)).sum(-1)
    contributions = {"hard_reconstruction": (w * rec).mean(), "posterior_ce": ce_q.mean(), "router_ce": ce_p.mean()}
    terms = {"reconstruction_loss": rec.mean(), "posterior_ce": ce_q.mean(), "router_ce": ce_p.mean()}
    br = ObjectiveBreakdown(sum(contributions.values()), terms, contributions, w.detach(),
                            cfg.objective.beta * batch.target_len.to(w.dtype) / w.detach())
    return br, z_hat


@torch.no_grad()
def handover_gate(model: DiscreteCVAE, encoded, b: np.ndarray, cfg: TrainConfig, c_base: float, pad_id: int) -> dict:
    """Hand-over diagnostic: is the best-z state already better than collapse under the *true*
    objective? best = mean_i(w_i * min_k nll_k(i)) + beta * KL, collapsed = mean_i(w_i * b_i),
    with KL = log K (a confident posterior against a uniform router; ``handover_kl='log_k'``) or
    the router's current cost mean_i -log p(k*_i | x_i) (``'router'``). For distribution weighting
    and log K this is oracle_rho + beta * log K < 1 (issue: switch-on)."""
    was = model.training
    model.eval()
    oracle, router_cost = [], []
    for i in range(0, len(encoded), 128):
        batch = collate(encoded[i : i + 128], pad_id=pad_id)
        o = model(batch)
        best = masked_mean_token_nll(-o.target_logprobs, batch.target_mask).min(-1)
        oracle.append(best.values)
        router_cost.append(-torch.log_softmax(o.prior_logits, -1).gather(1, best.indices[:, None]).squeeze(1))
    model.train(was)
    oracle_nll = torch.cat(oracle).double()
    kl = math.log(model.n_latent) if cfg.aid.handover_kl == "log_k" else float(torch.cat(router_cost).mean())
    bb = torch.as_tensor(b, dtype=torch.float64)
    outer = cfg.objective.token_outer if cfg.objective.weighting == "token" else cfg.objective.weighting
    w = reconstruction_weight(outer, batch_size=len(bb), c_base=c_base, b=bb, epsilon=cfg.objective.epsilon,
                              dtype=torch.float64)
    best = float((w * oracle_nll).mean()) + cfg.objective.beta * kl
    collapsed = float((w * bb).mean())
    return {"oracle_rho": float(oracle_nll.mean()) / c_base, "best_objective": best, "collapsed_objective": collapsed,
            "kl_estimate": kl, "pass": best < (1.0 - cfg.aid.handover_margin) * collapsed}


# ---------------------------------------------------------------------------- checkpoints


def _save_checkpoint(out: Path, model, opt, rng: np.random.Generator, state: TrainState) -> None:
    """checkpoint/ = model.safetensors + state.pt + COMPLETE, swapped in by renames."""
    tmp, final, old = out / ".checkpoint.tmp", out / "checkpoint", out / ".checkpoint.old"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_model(model, str(tmp / "model.safetensors"))
    torch.save({"optimizer": opt.state_dict(), "rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state(),
                "state": dataclasses.asdict(state)}, tmp / "state.pt")
    (tmp / "COMPLETE").write_text("ok\n")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def _load_checkpoint(out: Path, model, opt, rng: np.random.Generator) -> TrainState | None:
    for d in (out / "checkpoint", out / ".checkpoint.old"):
        if (d / "COMPLETE").exists() and (d / "state.pt").exists():
            load_model(model, str(d / "model.safetensors"))
            ck = torch.load(d / "state.pt", weights_only=False)
            opt.load_state_dict(ck["optimizer"])
            rng.bit_generator.state = ck["rng"]
            torch.set_rng_state(ck["torch_rng"])
            return TrainState(**ck["state"])
    return None


# ---------------------------------------------------------------------------- the loop


def _config_record(cfg: TrainConfig, c_base: float, ref, data_dir: Path) -> dict:
    from zfree.io import sha256_file

    return {**cfg.to_flat(), "_versions": _versions(), "_c_base": c_base,
            "_data_sha256": {s: sha256_file(data_dir / f"{s}.jsonl") for s in ("train", "val")},
            "_base_model_sha256": ref.meta.get("model_sha256"), "_reference": ref.meta}


def _loaded_base_sha(backbone) -> str:
    from zfree.io import sha256_state_dict

    return sha256_state_dict(backbone.state_dict())


def _token_matrix(batch: Batch, rows: list[np.ndarray]) -> torch.Tensor:
    out = torch.zeros(batch.target_mask.shape, dtype=torch.float32)
    for r, s in enumerate(rows):
        p = int(batch.prefix_len[r])
        out[r, p : p + len(s)] = torch.as_tensor(s, dtype=torch.float32)
    return out


def train_cvae(cfg: TrainConfig, out_dir: Path | str, progress: bool = True, stop_after: int | None = None) -> dict:
    """Train one discrete CVAE and write its run folder; returns the summary.

    c_base and b come from ``cfg.c_base_source`` (entangled_run: the base run's ``reference/``,
    hash-checked; pretrained_source: scored now). ``stop_after`` stops (with a checkpoint) after
    that many steps, for tests of resume. Raises FileNotFoundError / ValueError naming the file or
    field for a bad base run, data folder or a resume folder of another config;
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
    if out.exists() and (out / "config.json").exists():
        old = {k: v for k, v in read_json(out / "config.json").items() if not k.startswith("_")}
        if old != cfg.to_flat():
            diff = sorted(k for k in set(old) | set(cfg.to_flat()) if old.get(k) != cfg.to_flat().get(k))
            raise ValueError(f"{out} holds a run of another config (fields {diff}); choose another folder")
    backbone, tok = load_base(base_dir / "model", device=cfg.optim.device)
    needs_tok = cfg.objective.weighting == "token"
    ref = resolve_reference(cfg.objective.c_base_source, base_dir, data_dir, "val", model=backbone, tokenizer=tok)
    c_base = ref.c_base
    if (out / "config.json").exists():  # a resumed run must continue on the very same base model
        stored = read_json(out / "config.json").get("_base_model_sha256_loaded")
        now = _loaded_base_sha(backbone)
        if stored is not None and stored != now:
            raise ValueError(f"{out} was trained from a base model with sha256 {stored[:12]}..., but "
                             f"{base_dir / 'model'} now has {now[:12]}...; refusing to resume")
    train_ref = None
    if cfg.objective.needs_example_b:  # b (and b_t) on training rows: scored once with the frozen base, cached
        train_ref = resolve_reference("pretrained_source", base_dir, data_dir, "train", model=backbone, tokenizer=tok)
    if cfg.model.latent_kind == "continuous":
        model = ContinuousCVAE(backbone, cfg.model.d_latent, cfg.model.posterior_features, prior=cfg.model.prior,
                               n_samples=cfg.model.n_samples)
    else:
        model = DiscreteCVAE(backbone, cfg.model.n_latent, cfg.model.posterior_features,
                             latent_init_std=cfg.aid.latent_init_std if cfg.aid.aid == "random_init_jsd" else 0.0)
    model.to(cfg.optim.device).train()
    pad = pad_id_of(tok)
    train_pairs = load_pairs(data_dir / "train.jsonl")
    val_pairs = load_pairs(data_dir / "val.jsonl")
    if cfg.optim.eval_rows:
        val_pairs = val_pairs[: cfg.optim.eval_rows]
    max_len = context_length(backbone)  # as the reference scorer: x cut from the left, y never cut
    train = [encode_pair(tok, p, max_length=max_len) for p in train_pairs]  # ValueError names a row whose y does not fit
    val = [encode_pair(tok, p, max_length=max_len) for p in val_pairs]
    for split, enc in (("train", train), ("val", val)):
        cut = sum(e.x_tokens_cut > 0 for e in enc)
        if cut:
            print(f"note: {cut} {split} rows had x cut from the left to fit the context length {max_len} "
                  "(as in the z-free reference)", flush=True)
    val_ids = [p.id for p in val_pairs]
    val_b = np.array(ref.b_of(val_ids))
    val_tok = dict(zip(val_ids, ref.surprisal_of(val_ids))) if needs_tok else None
    meta = read_json(data_dir / "metadata.json") if (data_dir / "metadata.json").exists() else {}
    strategies = meta.get("parameters", {}).get("strategies")

    out.mkdir(parents=True, exist_ok=True)
    if not (out / "config.json").exists():
        atomic_write_json(out / "config.json", {**_config_record(cfg, c_base, ref, data_dir),
                                                "_base_model_sha256_loaded": _loaded_base_sha(backbone)})
    opt = build_optimizer(model, cfg, log=print if progress else None)
    rng = np.random.default_rng(cfg.optim.seed)
    state = _load_checkpoint(out, model, opt, rng)
    if state is None:
        state = TrainState(phase="hard" if cfg.aid.aid == "hard_em_then_soft" else "soft")
        (out / "metrics.jsonl").unlink(missing_ok=True)
    elif (out / "metrics.jsonl").exists():  # drop evaluations after the checkpoint
        rows = [r for r in read_jsonl(out / "metrics.jsonl") if r["step"] <= state.step]
        atomic_write_text(out / "metrics.jsonl", "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    gate_rows = val[: cfg.aid.handover_rows] if cfg.aid.handover_rows else val
    eval_kw = dict(b=val_b, c_base=c_base, objective=cfg.objective, pad_id=pad, tokenizer=tok,
                   strategies=strategies, decode_rows=cfg.optim.decode_rows, seed=cfg.optim.seed,
                   base_token_nll=val_tok)
    done_rows = read_jsonl(out / "metrics.jsonl") if (out / "metrics.jsonl").exists() else []
    t0 = time.time() - (done_rows[-1].get("wall_s", 0.0) if done_rows else 0.0)  # wall time continues on resume

    def do_eval():
        ev = evaluate(model, val, val_pairs, step=state.step, **eval_kw)
        n = state.train_log.pop("_n", 0)
        train_terms = {k: v / n for k, v in state.train_log.items()} if n else {}
        state.train_log = {}
        row = {**ev.metrics, **train_terms, "aid/phase_soft": float(state.phase == "soft"),
               "aid/handover_step": state.handover_step, "wall_s": time.time() - t0}
        append_jsonl(out / "metrics.jsonl", row)
        _save_checkpoint(out, model, opt, rng, state)
        top = ev.metrics.get("latent/max_usage")
        if top is not None and top >= INDEX_COLLAPSE_SHARE and state.step > 0:
            print(f"warning: step {state.step}: one latent value is the posterior's argmax on {top:.0%} of the "
                  "validation rows (index collapse: reads as KL ~ 0 just like a uniform collapse)", flush=True)
        return ev

    ev = do_eval() if state.step == 0 else None
    bar = tqdm(total=cfg.optim.steps, initial=state.step, disable=not progress, mininterval=5,
               desc=f"{cfg.objective.weighting} β={cfg.objective.beta:g}" + ("" if cfg.aid.aid == "none" else f" {cfg.aid.aid}"))
    K = getattr(model, "n_latent", None)  # discrete only (the hard-EM phase)
    not_posterior = [p for n, p in model.named_parameters() if n.split(".")[0] not in POSTERIOR_SIDE]
    while state.step < cfg.optim.steps:
        step = state.step + 1
        warm = min(1.0, step / cfg.optim.warmup_backbone) if cfg.optim.warmup_backbone else 1.0
        lr_bb = cfg.aid.hard_em_lr_backbone if state.phase == "hard" else cfg.optim.lr_backbone
        opt.param_groups[0]["lr"] = lr_bb * warm
        idx = rng.integers(0, len(train), cfg.optim.batch_size)
        batch = collate([train[i] for i in idx], pad_id=pad).to(cfg.optim.device)
        b = base_tok = None
        if train_ref is not None:
            b = torch.as_tensor(train_ref.b_of(batch.ids), dtype=torch.float32)
            if needs_tok:
                base_tok = _token_matrix(batch, train_ref.surprisal_of(batch.ids))
        if state.phase == "hard":
            br, z_hat = hard_em_objective(model, batch, cfg, step, c_base, b)
            counts = np.bincount(z_hat.cpu().numpy(), minlength=K)
            state.usage = (np.asarray(state.usage) + counts).tolist() if state.usage else counts.tolist()
        elif cfg.model.latent_kind == "continuous":
            br = continuous_objective(model, batch, cfg, step, c_base, b, base_tok)
        else:
            br = soft_objective(model, batch, cfg, step, c_base, b, base_tok)
        if not torch.isfinite(br.total):
            bad = sorted({k for d in (br.terms, br.contributions) for k, v in d.items() if not torch.isfinite(v)})
            atomic_write_json(out / "error.json", {"step": step, "batch_ids": batch.ids, "non_finite_terms": bad})
            raise NonFiniteLossError(f"non-finite loss at step {step}: terms {bad} (see {out / 'error.json'})")
        opt.zero_grad(set_to_none=True)
        br.total.backward()
        if step <= cfg.optim.frozen_decoder_steps:  # frozen-decoder warm phase: the posterior side only
            for p in not_posterior:
                p.grad = None  # AdamW skips a parameter without a gradient (no moments, no decay)
        if cfg.optim.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        opt.step()
        state.step = step
        for k, v in br.log_dict("loss/train").items():
            if not k.startswith("loss_contrib"):
                state.train_log[k] = state.train_log.get(k, 0.0) + v
        state.train_log["_n"] = state.train_log.get("_n", 0) + 1
        bar.update(1)
        if step % 10 == 0:
            bar.set_postfix({k.split("/")[-1][:6]: f"{v.item():.3f}" for k, v in br.terms.items()}, refresh=False)
        if state.phase == "hard":
            _hard_phase_checks(model, cfg, state, step, gate_rows, val_b[: len(gate_rows)], c_base, pad)
        if step % cfg.optim.eval_every == 0 or step == cfg.optim.steps:
            ev = do_eval()
        elif cfg.optim.checkpoint_every and step % cfg.optim.checkpoint_every == 0:
            _save_checkpoint(out, model, opt, rng, state)
        if stop_after is not None and step >= stop_after and step < cfg.optim.steps:
            _save_checkpoint(out, model, opt, rng, state)
            bar.close()
            return {"stopped_at": step}
    bar.close()
    if ev is None:  # resumed exactly at the end
        ev = evaluate(model, val, val_pairs, step=state.step, **eval_kw)
    return _finish(out, cfg, model, ev, state, time.time() - t0)


def _hard_phase_checks(model, cfg, state: TrainState, step, gate_rows, gate_b, c_base, pad) -> None:
    K = model.n_latent
    if cfg.aid.restart_dead_every and step % cfg.aid.restart_dead_every == 0 and state.usage:
        share = np.asarray(state.usage, float) / max(1, sum(state.usage))
        dead = [k for k in range(K) if share[k] < cfg.aid.restart_dead_share / K]
        if dead:
            donor = int(share.argmax())
            model.restart_values(dead, donor)
            state.restarts.append({"step": step, "dead": dead, "donor": donor})
        state.usage = []
    if step % cfg.aid.handover_check_every == 0 or step >= cfg.aid.hard_em_max_steps:
        g = handover_gate(model, gate_rows, gate_b, cfg, c_base, pad)
        state.gate.append({"step": step, **g})
        if g["pass"] or step >= cfg.aid.hard_em_max_steps:
            state.phase, state.handover_step, state.handover_forced = "soft", step, not g["pass"]


def _finish(out: Path, cfg: TrainConfig, model, ev, state: TrainState, wall: float) -> dict:
    atomic_write_parquet(out / "per_example.parquet", ev.per_example)
    rows = read_jsonl(out / "metrics.jsonl")
    init = rows[0] if rows else {}
    gate_pass = [g["step"] for g in state.gate if g["pass"]]
    summary = {**ev.metrics, **cfg.to_flat(), "steps": cfg.optim.steps,
               "wall_s": rows[-1].get("wall_s", wall) if rows else wall,
               "init/task/correctness": init.get("task/correctness"),
               "init/structure/probe_accuracy": init.get("structure/probe_accuracy"),
               "init/loss/val/baseline_normalized_reconstruction_loss":
                   init.get("loss/val/baseline_normalized_reconstruction_loss"),
               "latent_used": bool(ev.metrics["latent/measured_use_fraction"] > 0.5),
               "predicted_latent_used": bool(ev.metrics["latent/predicted_use_fraction"] > 0.5),
               "aid/handover_step": state.handover_step, "aid/handover_forced": state.handover_forced,
               "aid/gate_first_pass_step": gate_pass[0] if gate_pass else None,
               "aid/gate": state.gate, "aid/restarts": state.restarts}
    atomic_write_json(out / "summary.json", summary)
    return summary
