"""Replay a trained run step by step and compare its packed and padded training steps (README, "the packed step").

    .venv/bin/python analysis/results/oracle-routes-synth/trace_steps.py RUN/config.json DATA_DIR OUT_RUN TRACE_CSV [START]

retrains the run of RUN/config.json (its seed, batches and steps; ``--set data_dir=DATA_DIR``, evaluations every
300 steps) into OUT_RUN and, before each step from START (default 1200), computes the step's objective on the
step's own batch (drawn from a copy of the run's generator state, so the run's own draws are untouched) with the
packed rows (``zfree.models.packing``, "on") and with the padded passes ("off"): the reconstruction loss
(nats/token) and every parameter's gradient; and every 25 steps from START - 200 the model's loss (nats/token,
``forward_given`` in eval mode, no gradient) on 256 fixed training rows and the first 256 validation rows, both
ways. One row per step to TRACE_CSV (written to TRACE_CSV.part as the replay goes, renamed when it ends): step, loss_packed, loss_padded, grad_rel_max (the largest
|g_packed - g_padded| / |g_padded| over the parameters, Frobenius norms) and its parameter, grad_norm_packed,
repeated_rows (rows drawn twice in the batch), packed (whether "on" took the packed rows: ``DiscreteCVAE.packs``), train_rows_loss, val_rows_loss (packed) and their _padded values, logged (the loop's own reconstruction loss of the step); on the last step also
train_rows_loss_after and val_rows_loss_after, the same rows read after its update (the weights the run ends with). The extra passes draw no
random numbers (no dropout on the benchmark's bases), so the run ends where the original did (its step-1800
validation loss is the original's to the last digit). For a run with a given z (control, label oracle).
"""

from __future__ import annotations

import csv
import os
import sys

import numpy as np
import torch

import zfree.models.packing as packing
import zfree_lab.run.training as training
from zfree.data.batching import collate
from zfree.objective.objectives import GIVEN, step_objective

FIELDS = ["step", "packed", "loss_packed", "loss_padded", "grad_rel_max", "grad_rel_max_param", "grad_norm_packed",
          "repeated_rows", "train_rows_loss", "train_rows_loss_padded", "val_rows_loss", "val_rows_loss_padded", "logged", "train_rows_loss_after", "val_rows_loss_after"]


def _loss_grad(run, cfg, batch, step: int, mode: str):
    prev = packing.set_packing(mode)
    try:
        run.model.zero_grad(set_to_none=True)
        br = step_objective(GIVEN, run.model, batch, cfg, step, run.data.c_base, None, None)
        br.total.backward()
        grads = {n: p.grad.detach().clone() for n, p in run.model.named_parameters() if p.grad is not None}
        run.model.zero_grad(set_to_none=True)
    finally:
        packing.set_packing(prev)
    return float(br.terms["reconstruction_loss"].detach()), grads


def _rows_loss(run, rows: list, mode: str) -> float:
    prev = packing.set_packing(mode)
    run.model.eval()
    tot = n = 0.0
    try:
        with torch.no_grad():
            for lo in range(0, len(rows), 64):
                b = collate(rows[lo:lo + 64], pad_id=run.data.pad_id)
                lp = run.model.forward_given(b, zfree_metrics=False).selected_logprobs
                tot, n = tot - float(lp.sum()), n + float(b.target_len.sum())
    finally:
        run.model.train()
        packing.set_packing(prev)
    return tot / n


def main(config: str, data_dir: str, out_run: str, trace_csv: str, start: int = 1200, every: int = 25) -> int:
    orig, fixed = training._take_step, {}
    part = f"{trace_csv}.part"  # renamed to TRACE_CSV once the run has finished (a stopped replay leaves no table)
    fh = open(part, "w", newline="")
    writer = csv.DictWriter(fh, FIELDS)
    writer.writeheader()

    def take(loop, step: int):
        run, cfg = loop.run, loop.cfg
        if not fixed:
            pick = np.random.default_rng(11).choice(len(run.data.train), 256, replace=False)
            fixed.update(train=[run.data.train[i] for i in pick], val=list(run.data.val[:256]))
        rec = {"step": step}
        if step >= start:
            state = run.rng.bit_generator.state
            idx = run.rng.integers(0, len(run.data.train), cfg.optim.batch_size)
            run.rng.bit_generator.state = state
            batch = collate([run.data.train[i] for i in idx], pad_id=run.data.pad_id)
            prev = packing.set_packing("on")
            rec["packed"] = run.model.packs(batch, zfree_metrics=False)
            packing.set_packing(prev)
            lp, gp = _loss_grad(run, cfg, batch, step, "on")
            lf, gf = _loss_grad(run, cfg, batch, step, "off")
            assert gp.keys() == gf.keys(), sorted(set(gp) ^ set(gf))
            rel = {n: float((gp[n] - gf[n]).norm() / (gf[n].norm() + 1e-30)) for n in gf}
            worst = max(rel, key=rel.get)
            rec.update(loss_packed=lp, loss_padded=lf, grad_rel_max=rel[worst], grad_rel_max_param=worst,
                       grad_norm_packed=float(torch.sqrt(sum((g ** 2).sum() for g in gp.values()))),
                       repeated_rows=int(len(idx) - len(set(idx.tolist()))))
        if step % every == 0 and step >= start - 200:
            for k in ("train", "val"):
                rec[f"{k}_rows_loss"], rec[f"{k}_rows_loss_padded"] = (_rows_loss(run, fixed[k], m) for m in ("on", "off"))
        out = orig(loop, step)
        rec["logged"] = float(out[1].terms["reconstruction_loss"].detach())
        if step == cfg.optim.steps:
            rec.update(train_rows_loss_after=_rows_loss(run, fixed["train"], "on"),
                       val_rows_loss_after=_rows_loss(run, fixed["val"], "on"))
        writer.writerow(rec)
        fh.flush()
        return out

    training._take_step = take
    from zfree_lab.cli import main as cli
    try:
        rc = cli(["train", "--config", config, "--set", f"data_dir={data_dir}", "--set", "eval_every=300",
                  "--out", out_run])
    finally:
        training._take_step = orig
        fh.close()
    if rc == 0:
        os.replace(part, trace_csv)
    return rc


if __name__ == "__main__":
    if len(sys.argv) not in (5, 6):
        sys.exit(__doc__)
    sys.exit(main(*sys.argv[1:5], *(int(a) for a in sys.argv[5:])))
