"""Where a hard-EM step of HARD_EM_RECIPE spends its time (issue 15): 20 steps of
objectives.hard_em_objective timed section by section (zfree_lab.run.training setup, distribution beta 0.3,
batch 64), then the hand-over gate (500 / 100 rows), one evaluation and a soft step.
Usage: OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 .venv/bin/python analysis/benchmarks/profile_hard_step.py
Results: analysis/results/switch_on_variants.md."""
import time, tempfile, torch
from pathlib import Path
from zfree.train import aids
from zfree_lab.run import run_setup, training
from zfree.config import TrainConfig
from zfree.objective.remedies import HARD_EM_RECIPE
from zfree.data.batching import collate
from zfree.models.nll import masked_mean_token_nll
from zfree.models.base import target_logprobs_from_hidden
from zfree.models.injection import suffix_target_logprobs
from zfree.objective.objectives import assemble
from zfree_lab.run.metrics import evaluate
torch.set_num_threads(1)
flat = {**TrainConfig().to_flat(), **HARD_EM_RECIPE, "weighting": "distribution", "beta": 0.3, "batch_size": 64,
        "steps": 1200, "eval_rows": 500, "decode_rows": 200, "data_dir": "data/synth/default", "base_dir": "data/base/default"}
cfg = TrainConfig.from_flat(flat)
run = run_setup.setup_run(cfg, Path(tempfile.mkdtemp()) / "r", False)
m, data, opt = run.model, run.data, run.opt
T = {}
def tic(k, t): T[k] = T.get(k, 0) + time.perf_counter() - t; return time.perf_counter()
N = 20
for step in range(1, N + 1):
    t = time.perf_counter()
    idx = run.rng.integers(0, len(data.train), 64)
    batch = collate([data.train[i] for i in idx], pad_id=data.pad_id)
    b, bt = training._batch_references(data, batch, "distribution")
    t = tic("collate+refs", t)
    h0, cache = m._encode_with_cache(batch); heads = m.heads_from_hidden(h0, batch)
    t = tic("zfree pass (grad) + heads", t)
    t0 = target_logprobs_from_hidden(m.backbone, h0, batch)
    t = tic("zfree target logprobs (unused)", t)
    with torch.no_grad():
        hz, valid = m.decoder_suffix_shared_prefix(batch, cache)
        tlp_all, _ = suffix_target_logprobs(m.backbone, batch, hz, valid)
    t = tic("K-way decoder (no grad)", t)
    k_star = (masked_mean_token_nll(-tlp_all, batch.target_mask)).argmin(-1)
    hz1, valid = m.decoder_suffix_shared_prefix(batch, cache, k_star[:, None])
    tlp_z, _ = suffix_target_logprobs(m.backbone, batch, hz1, valid)
    t = tic("selected decoder (grad)", t)
    rec = masked_mean_token_nll(-tlp_z[:, 0], batch.target_mask)
    br = assemble("hard_em", cfg.objective, recon=rec, target_len=batch.target_len, step=step, c_base=data.c_base, b=b,
                  q_logits=heads.posterior_logits, p_logits=heads.prior_logits, k_star=k_star, recon_scale="c_base")
    t = tic("assemble", t)
    opt.zero_grad(); br.total.backward()
    t = tic("backward", t)
    torch.nn.utils.clip_grad_norm_(m.parameters(), cfg.optim.grad_clip) if cfg.optim.grad_clip > 0 else None
    opt.step()
    t = tic("optimizer", t)
    training._log_train_terms(run.state, br)
    t = tic("log terms", t)
tot = sum(T.values())
t = time.perf_counter(); aids.handover_gate(m, data.val[:500], data.val_b[:500], cfg, data.c_base, data.pad_id); tg = time.perf_counter() - t
t = time.perf_counter(); aids.handover_gate(m, data.val[:100], data.val_b[:100], cfg, data.c_base, data.pad_id); tg1 = time.perf_counter() - t
t = time.perf_counter(); evaluate(m, data.val, data.val_pairs, step=1, **data.eval_kw); te = time.perf_counter() - t
# soft step
t = time.perf_counter()
for step in range(5):
    idx = run.rng.integers(0, len(data.train), 64)
    batch = collate([data.train[i] for i in idx], pad_id=data.pad_id)
    b, bt = training._batch_references(data, batch, "distribution")
    br = training.step_objective("discrete", m, batch, cfg, 500, data.c_base, b, bt)
    opt.zero_grad(); br.total.backward(); opt.step()
ts = (time.perf_counter() - t) / 5
print(f"hard step mean {tot/N*1000:.0f} ms over {N} steps (batch 64, K={m.n_latent})")
for k, v in T.items(): print(f"  {k:34s} {v/N*1000:7.1f} ms  {v/tot:5.1%}")
print(f"gate 500 rows: {tg*1000:.0f} ms (= {tg/(tot/N):.1f} steps; every 50 steps -> {tg/(tot/N)/50:.1%}); gate 100 rows {tg1*1000:.0f} ms")
print(f"evaluate {len(data.val)} rows: {te*1000:.0f} ms (= {te/(tot/N):.1f} hard steps)")
print(f"soft step mean {ts*1000:.0f} ms")
