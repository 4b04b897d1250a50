"""CVAE training: the run built from the base run (``zfree_lab.run.run_setup``: ``build_cvae``,
``build_optimizer``, ``setup_run``), then a short loop under the objective
(``zfree.objective.objectives``), with the training-loop plug-ins (``zfree.train.plugins``: the
symmetry-breaking aids and loop-changing remedies), evaluations (``zfree_lab.run.metrics``) and the
run folder of docs/reference/artifacts.md (``zfree_lab.run.run_folder``).

A run folder is locked while a process trains it. A run folder with ``summary.json`` is finished
and never rewritten (returned only for the same config). A run folder with a ``checkpoint/``
(or ``checkpoint.prev/``) from the same config resumes exactly where it stopped (CPU: the same summary as
an uninterrupted run, timing keys aside).

Host round-trips of a step (issue 56, item 4). The step's own code reads nothing back (tests/test_device.py:
the assembly, the update, the logs, and the forward with the accelerator's checks): the running sums stay
device tensors until an evaluation, the finiteness flags are read every ``FINITE_CHECK_EVERY`` steps, the
empty-row check of ``masked_mean_token_nll`` is a device assertion off the CPU, the batch and the given
values are copied from pinned memory without blocking (``batch_to_device``,
``zfree.models.precision.to_device``). What remains, and why:
  - the boolean-mask gathers of the supervised rows before the chunked head (``zfree.models.injection``,
    ``zfree.models.base.target_logprobs_from_hidden``): implicit synchronisations, since the number of
    rows sizes the head's chunks and the batch carries only its maximum lengths on the host;
  - transformers' mask helpers inside the body's forward (e.g. whether the attention mask is all ones);
  - one key/value cache object per decoder pass over the y-region (``prefix_cache``: views of the z-free
    pass's slots, repeated for n > 1 values); a static cache would need fixed shapes per step;
  - torch's AdamW step counters (host scalars unless ``capturable``), the progress bar's postfix (every
    ``max(10, FINITE_CHECK_EVERY)`` steps, only when shown), and the plug-ins' periodic checks (the hand-over
    gate, dead-value restarts), which evaluate;
  - the batch is drawn and collated on the host (numpy), every step.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from zfree.config import TrainConfig
from zfree.core.errors import Interrupted
from zfree_lab.run.locks import check_own_folder, run_folder_lock
from zfree.core.paths import check_out_dir
from zfree.core.progress import bar as progress_bar
from zfree.core.values import check_device
from zfree.data.batching import collate
from zfree_lab.run.latent_meaning import write_latent_meaning
from zfree_lab.run.metrics import evaluate
from zfree.models.precision import acc_dtype, tf32_matmuls
from zfree.objective.objectives import GIVEN, Phase, step_objective
from zfree.reference.reference import check_step0_rho
from zfree.train import accumulate, aids, plugins
from zfree_lab.run import checkpoint, multiref_run, run_folder
from zfree_lab.run.compute import TokenCounter, decoder_body
from zfree_lab.run.curve import TrainCurve
from zfree_lab.run.live_curves import LiveCurves
from zfree_lab.run.run_data import RunData, batch_references
from zfree_lab.run.run_setup import Run, TrainState, clip_gradients, set_learning_rates, setup_run, step_rates

#: warn when one latent value is the posterior's argmax on at least this share of validation rows
INDEX_COLLAPSE_SHARE = 0.9


# ---------------------------------------------------------------------------- evaluation records


def _record_evaluation(out: Path, model, data: RunData, state: TrainState, opt, rng, t0: float,
                       curves: LiveCurves | None = None):
    """Evaluate, append the metrics row (with the mean training terms since the last one; to
    ``curves`` too, TensorBoard's event file), checkpoint, and warn on index collapse. Returns the
    ``metrics.Evaluation``. Raises NonFiniteMetricError (after writing error.json) for a non-finite
    loss metric, before anything is stored or checkpointed."""
    ev = evaluate(model, data.val, data.val_pairs, step=state.step, **data.eval_kw)
    if state.step == 0 and data.reference_file is not None:  # a stored reference is checked, not trusted
        check_step0_rho(ev.metrics["loss/val/baseline_normalized_reconstruction_loss"], data.reference_file,
                        low_precision=next(model.parameters()).dtype in (torch.bfloat16, torch.float16),
                        **({"remedy": "the prefix route's step-0 pass disagrees with its reference (zfree.reference.prefix); "
                                      "remove the run folder's prefix_reference/ to score it again"}
                           if cfg_injection(model) == "prefix" else {}))
    _host_state(state)
    n = state.train_log.pop("_n", 0)
    train_terms = {k: v / n for k, v in state.train_log.items()} if n else {}
    state.train_log = {}
    row = {**ev.metrics, **train_terms, "aid/phase_soft": float(state.phase == Phase.SOFT),
           "aid/handover_step": state.handover_step, "wall_s": time.time() - t0}
    run_folder.check_finite_metrics(out, state.step, row)  # before it is stored or replaces the checkpoint
    run_folder.append_metrics(out, row)
    if curves is not None:
        curves.log(state.step, row)
    t = time.time()
    checkpoint.save_checkpoint(out, model, opt, rng, state)
    state.checkpoint_after_row_s = time.time() - t  # evaluation time by the clock, yet after the row's wall_s
    top = ev.metrics.get("latent/max_usage")
    if top is not None and top >= INDEX_COLLAPSE_SHARE and state.step > 0 and cfg_given(model) is False:
        print(f"warning: step {state.step}: one latent value is the posterior's argmax on {top:.0%} of the "
              "validation rows (index collapse: reads as KL ~ 0 just like a uniform collapse)", flush=True)
    return ev


def cfg_injection(model) -> str:
    """The name of the model's injection route (``zfree.models.routes``; "embedding" without one)."""
    return getattr(getattr(model, "injection", None), "name", "embedding")


def cfg_given(model) -> bool:
    """True for a model whose z is given (the control, a label oracle: no posterior to collapse)."""
    return getattr(model, "posterior_kind", "") == "given"


def _log_train_terms(state: TrainState, br) -> dict:
    """Add this step's training terms (``br.log_tensors``) to the running sums (detached float64
    device tensors, no host copy; ``_host_state`` reads them at evaluation and checkpoint time);
    returns the terms (the training curve sums them too)."""
    terms = br.log_tensors("loss/train")
    for k, v in terms.items():
        state.train_log[k] = state.train_log.get(k, 0.0) + v
    state.train_log["_n"] = state.train_log.get("_n", 0) + 1
    return terms


def _host_state(state: TrainState) -> TrainState:
    """The running sums and usage counts as host floats / ints (one device->host copy each), so
    the state can be checkpointed and the metrics row written. Returns ``state``."""
    state.train_log = {k: v if isinstance(v, (int, float)) else float(v) for k, v in state.train_log.items()}
    if isinstance(state.usage, torch.Tensor):
        state.usage = state.usage.cpu().tolist()
    return state


def _save_checkpoint(run: "Run", state: TrainState) -> None:
    checkpoint.save_checkpoint(run.out, run.model, run.opt, run.rng, _host_state(state))


# ---------------------------------------------------------------------------- one step


def _objective_of(run: Run, cfg: TrainConfig, phase, step: int, dev, acc, **kw):
    """host batch -> the step's objective breakdown on ``dev`` (b and the base-token matrix with it);
    ``w_mean``: the whole step's mean reconstruction weight when the host batch is one chunk of it;
    ``kw``: the plug-ins' keyword arguments of ``step_objective`` (``plugins.Plugin.objective_kw``)."""
    def objective(host, w_mean: float | None = None):
        return step_objective(phase, run.model, batch_to_device(host, dev), cfg, step, run.data.c_base,
                              *batch_references(run.data, host, cfg.objective.weighting, dev, acc),
                              w_mean=w_mean, **kw)
    return objective


def batch_to_device(host, dev: torch.device):
    """The host batch on ``dev``: on CUDA copied from pinned memory without blocking (a copy from
    pageable memory first waits for the device's queued work: a host round-trip per step)."""
    if dev.type != "cuda":
        return host.to(dev)
    fields = ("input_ids", "attention_mask", "target_mask", "prefix_len", "target_len", "decoder_input_ids")
    pinned = dataclasses.replace(host, **{f: getattr(host, f).pin_memory() for f in fields
                                          if getattr(host, f) is not None})
    return pinned.to(dev, non_blocking=True)


def _step_breakdown(run: Run, cfg: TrainConfig, objective, rows: list):
    """(the objective's breakdown, the collated host batch) of one batch of encoded ``rows``: one
    forward pass through the model (its backward pending), or chunk by chunk with their backward
    passes done under gradient accumulation, each chunk given the whole batch's mean weight
    (``accumulate.batch_weight_mean``: the hard phase rescales by it)."""
    host = collate(rows, pad_id=run.data.pad_id)
    if not accumulate.use_accumulation(cfg, len(rows)):
        return objective(host), host
    ref = run.data.train_ref  # b alone (no base-token matrix): the whole step's mean weight needs nothing else
    b = None if ref is None else torch.as_tensor(ref.b_of(host.ids), dtype=torch.float64)
    m = accumulate.batch_weight_mean(cfg, run.data.c_base, b, len(rows))
    return accumulate.accumulated_step(lambda chunk: objective(chunk, w_mean=m), rows, cfg.optim.micro_batch,
                                       run.opt, lambda r: collate(r, pad_id=run.data.pad_id)), host


def _optimizer_step(run: Run, br, cfg: TrainConfig, step: int, mask: aids.FrozenDecoderMask, side: str = "all") -> None:
    """Backward (chunk by chunk under accumulation), the gradients of the side that does not train dropped
    (``side``: ``plugins.trained_side``, or "posterior" for the aggressive inner steps), gradient clipping
    (the router's on its own under ``router_clip='own'``: ``run_setup.clip_gradients``), the update."""
    if not getattr(br, "backward_done", False):
        run.opt.zero_grad(set_to_none=True)
        br.total.backward()
    mask.drop(side)
    clip_gradients(run.opt, cfg.optim.grad_clip, cfg.optim.router_clip)
    run.opt.step()


def _extra_update(ctx: plugins.StepContext, rows: list, side: str) -> torch.Tensor:
    """One extra update of step ``ctx.step`` on ``rows`` (a plug-in's inner loop: the aggressive
    encoder's posterior-only steps) through the step's objective, its loss checked by ``ctx.watch``, the
    gradients of ``side``'s complement dropped; returns the loss (0-dim tensor)."""
    br, host = _step_breakdown(ctx.run, ctx.cfg, ctx.objective, rows)
    ctx.watch.add(br, ctx.step, host)
    _optimizer_step(ctx.run, br, ctx.cfg, ctx.step, ctx.mask, side)
    return br.total


# ---------------------------------------------------------------------------- the loop


def train_cvae(cfg: TrainConfig, out_dir: Path | str, progress: bool = True, stop_after: int | None = None) -> dict:
    """Train one CVAE and write its run folder; returns the summary.

    c_base and b come from ``cfg.c_base_source`` (entangled_run: the base run's ``reference/``,
    hash-checked; pretrained_source: scored now). ``stop_after`` stops (with a checkpoint) after
    that many steps, for tests of resume. The run folder is locked meanwhile (``zfree_lab.run.locks``).
    A finished run folder is returned as is only when it holds this config. Raises
    FileNotFoundError / ValueError naming the file or field for a bad base run or data folder;
    ResumeRefusedError (a ValueError) for a folder of another config, finished or not;
    LockHeldError when another process owns the folder; ConfigError for an unavailable device, or
    for a non-empty folder that is not zfree's (``zfree_lab.run.locks.check_own_folder``: nothing written);
    CheckpointError when no checkpoint of the folder loads (a damaged one falls back to the
    previous one with a warning naming the file); NonFiniteLossError / NonFiniteMetricError
    (after saving ``error.json``, the last good checkpoint kept) if the loss or an evaluation
    goes non-finite.
    """
    check_device(cfg.optim.device)
    check_out_dir(out_dir)
    out = Path(out_dir)
    check_own_folder(out)  # a non-empty folder of someone else's is never written into
    with run_folder_lock(out, "run folder"):
        run_folder.check_same_config(out, cfg)  # a run folder is reused or resumed only for the same run
        if (done := run_folder.finished_summary(out)) is not None:
            return done
        run, counter = setup_run(cfg, out, progress), None
        try:
            dev = next(run.model.parameters()).device
            counter = TokenCounter(decoder_body(run.model), start=run.state.forward_tokens)
            loop = _Loop(cfg, out, run, run.data.gate, aids.FrozenDecoderMask(run.model), dev,
                         acc_dtype(next(run.model.parameters()).dtype), run_folder.FiniteWatch(out, dev), counter)
            return _train_steps(loop, progress, stop_after)
        except KeyboardInterrupt as e:  # Ctrl-C, SIGINT, SIGTERM (zfree_lab.cli): the last checkpoint is kept
            kept = "no checkpoint yet" if run.saved_step is None else f"the checkpoint of step {run.saved_step} is kept"
            raise Interrupted(getattr(e, "signum", 2), f"interrupted at step {run.state.step} ({kept}); "
                                                       f"resume with `zfree train --resume {out}`") from None
        finally:
            if counter is not None:
                counter.remove()
            if run.curves is not None:
                run.curves.close()


@dataclass
class _Loop:
    """What every step of one run uses, built once (``train_cvae``): the config, run folder and run,
    the gate rows (``RunData.gate``: never evaluation rows), the frozen-side mask, the model's device
    and accumulation dtype, the finite-loss watch and the training compute's token counter."""

    cfg: TrainConfig
    out: Path
    run: Run
    gate_rows: list
    mask: aids.FrozenDecoderMask
    dev: torch.device
    acc: torch.dtype
    watch: run_folder.FiniteWatch
    counter: TokenCounter


def _evaluate_paused(counter: TokenCounter, state: TrainState, fn):
    """``fn()`` with the token counter paused, its wall time added to ``state.eval_wall_s``, and
    ``state.forward_tokens`` brought up to date first (so a checkpoint written inside holds it)."""
    state.forward_tokens = counter.total
    t = time.time()
    with counter.paused():
        out = fn()
    state.eval_wall_s += time.time() - t
    return out


def _train_steps(loop: _Loop, progress: bool, stop_after: int | None) -> dict:
    """The loop of ``train_cvae``: steps, progress, evaluations and checkpoints; ``run.saved_step``
    follows the checkpoints written."""
    cfg, out, run, watch, counter = loop.cfg, loop.out, loop.run, loop.watch, loop.counter
    model, data, state = run.model, run.data, run.state

    def record():
        return _evaluate_paused(counter, state, lambda: _record_evaluation(out, model, data, state, run.opt, run.rng,
                                                                           run.t0, run.curves))
    # step 0's evaluation, and the last step's when a run stopped in its final evaluation (its step kept
    # first, below), unless metrics.jsonl already holds that step's row (a resume at that step)
    if state.step == 0 and run.row_step != 0:  # `zfree status` says what a run does before its first step
        run_folder.write_progress(out, 0, cfg.optim.steps, "step-0 evaluation", time.time() - run.t0)
    ev = record() if state.step in (0, cfg.optim.steps) and run.row_step != state.step else None
    run.saved_step = state.step if ev is not None else run.saved_step
    bar = progress_bar(total=cfg.optim.steps, initial=state.step, progress=progress, mininterval=5,
                       desc=f"{cfg.objective.weighting} β={cfg.objective.beta:g}" + ("" if cfg.aid.aid == "none" else f" {cfg.aid.aid}"))
    last_progress = last_saved = time.time()
    curve = TrainCurve(out, None if state.step == 0 else state.step)
    while state.step < cfg.optim.steps:
        step = state.step + 1
        t_step = time.time()
        with tf32_matmuls(loop.dev):  # CUDA: float32 matmuls of the step on TF32 tensor cores (not evaluation's)
            ctx, br = _take_step(loop, step)
        state.step = step
        if step == 1:
            state.first_step_s = time.time() - t_step
        if time.time() - last_progress >= run_folder.PROGRESS_EVERY_S or step == cfg.optim.steps:
            run_folder.write_progress(out, step, cfg.optim.steps, getattr(state.phase, "value", state.phase),
                                      time.time() - run.t0)
            last_progress = time.time()
        curve.add(step, _log_train_terms(state, br), last=step == cfg.optim.steps)
        _show_step(bar, br, step, watch.every)
        for p in run.plugins:  # checks after the update (restarts and the hand-over gate; the aggressive phase's end)
            p.after_update(ctx)
        evaluating = step % cfg.optim.eval_every == 0 or step == cfg.optim.steps
        saving = bool(cfg.optim.checkpoint_every and step % cfg.optim.checkpoint_every == 0
                      or cfg.optim.checkpoint_every_s and time.time() - last_saved >= cfg.optim.checkpoint_every_s)
        stopping = stop_after is not None and stop_after <= step < cfg.optim.steps
        if evaluating or saving or stopping:
            watch.check()  # before anything is written: weights updated from a non-finite loss are never saved
        state.forward_tokens = counter.total
        if step == cfg.optim.steps:  # the final evaluation and outputs can be most of a (real model's) run:
            _save_checkpoint(run, state)  # the last step is kept first, so a run stopped in them resumes there
            run.saved_step = step
        if evaluating:
            ev = record()
        elif saving:
            _save_checkpoint(run, state)
        if evaluating or saving:
            run.saved_step, last_saved = step, time.time()
        if stopping:  # tests of resume
            if not (evaluating or saving):  # (saving twice would leave checkpoint.prev equal to checkpoint)
                _save_checkpoint(run, state)
            bar.close()
            return {"stopped_at": step}
    bar.close()
    return _finish(cfg, out, run, ev, counter)


def _take_step(loop: _Loop, step: int) -> tuple[plugins.StepContext, object]:
    """One optimizer step ``step`` (1-based): its rates, a batch of ``batch_size`` training rows drawn
    with replacement, the step's objective (the hard-EM phase, else the latent kind's true J, the
    plug-ins' options applied), the plug-ins' hooks around the forward pass, the finite-loss watch
    and the update of the side the plug-ins train. Returns (the hooks' context, the breakdown)."""
    run, cfg, watch = loop.run, loop.cfg, loop.watch
    state, data = run.state, run.data
    set_learning_rates(run.opt, step_rates(cfg, state, step, run.plugins))
    idx = run.rng.integers(0, len(data.train), cfg.optim.batch_size)  # batches drawn with replacement
    rows = [data.train[i] for i in idx]
    phase = (Phase.HARD if state.phase == Phase.HARD else GIVEN if cfg.model.latent_source != "posterior"
             else cfg.model.latent_kind)
    kw = {k: v for p in run.plugins for k, v in p.objective_kw(cfg, state, step).items()}
    ctx = plugins.StepContext(run, cfg, step, _objective_of(run, cfg, phase, step, loop.dev, loop.acc, **kw), loop.mask,
                              watch, loop.gate_rows, _extra_update)
    for p in run.plugins:  # the rows as the step trains on them (word dropout)
        rows = p.rows(ctx, rows)
    for p in run.plugins:  # before the forward pass (the aggressive encoder's inner loop)
        p.before_update(ctx, rows)
    br, host = _step_breakdown(run, cfg, ctx.objective, rows)
    for p in run.plugins:  # the breakdown before the update (the hard phase's usage counts)
        p.after_forward(ctx, br)
    watch.add(br, step, host)  # (its row ids) checked now on the CPU, every FINITE_CHECK_EVERY steps elsewhere
    _optimizer_step(run, br, cfg, step, loop.mask, plugins.trained_side(run.plugins, cfg, state, step))
    return ctx, br


def _show_step(bar, br, step: int, every: int) -> None:
    """Advance the progress bar by one step; every ``max(10, every)`` steps, and only with a bar
    shown, its postfix shows the step's terms (a host read)."""
    bar.update(1)
    if not bar.disable and step % max(10, every) == 0:
        bar.set_postfix({k.split("/")[-1][:6]: f"{float(v.detach()) if hasattr(v, 'detach') else float(v):.3f}"
                         for k, v in br.terms.items()}, refresh=False)


def _finish(cfg: TrainConfig, out: Path, run: Run, ev, counter: TokenCounter) -> dict:
    """After the last step: the final evaluation (``ev``, or made now when the run resumed exactly at
    the end), the multi-reference outputs and what z learned (uncounted compute), then summary.json
    with the plug-ins' keys; returns the summary."""
    model, data, state = run.model, run.data, run.state
    if ev is None:  # resumed exactly at the end
        ev = _evaluate_paused(counter, state, lambda: evaluate(model, data.val, data.val_pairs, step=state.step,
                                                               **data.eval_kw))
        run_folder.check_finite_metrics(out, state.step, ev.metrics)
    with counter.paused():
        ev.metrics.update(multiref_run.write_multiref(out, model, data, cfg))  # after the final evaluation only
        write_latent_meaning(out, ev, data.val_pairs, latent_kind=model.latent_kind, tokenizer=data.tokenizer,
                             given=getattr(model, "posterior_kind", "") == "given",
                             strategies=data.eval_kw.get("strategies"), seed=cfg.optim.seed,
                             use_threshold=run_folder.USE_THRESHOLD)
    extra = {k: v for p in run.plugins for k, v in p.summary(cfg, state).items()}
    extra.update({f"aid/gate_{k}": v for k, v in data.gate_record.items() if k != "ids"})  # {} without gate rows
    extra.update(run_folder.device_memory(next(model.parameters()).device))
    return run_folder.write_summary(out, cfg, ev, state, time.time() - run.t0, extra)
