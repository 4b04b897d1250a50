# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Making z switch on: the aids, predicted against measured
#
# Every aided run (`aid` ≠ none) next to theory: predicted use (β_eff < 1), then the measured
# rate, alignment on the rows where one strategy fits (m = 1), ρ_recon, oracle ρ, the codes
# used, the step at which the hand-over gate first passed and the barrier — the hard phase's
# best-z objective (mean w·min_k nll + β·log K) against the collapsed one (mean w·b) over
# training. Aids that do not work stay in the table with their numbers.

# %% tags=["parameters"]
sweep_dir = "../runs/study-aided"  # a folder written by `zfree study` or `zfree sweep`

# %%
import json

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import Markdown, display

from zfree.io import read_json
from zfree.metrics import confusion
from zfree.results import load_sweep

sweep = load_sweep(sweep_dir)
runs = sweep.runs
aided = runs[runs["aid"].fillna("none") != "none"] if "aid" in runs else runs.iloc[:0]
if aided.empty:
    display(Markdown("No aided runs in this folder (every run has `aid = none`)."))

# %%
if not aided.empty:
    cols = {"aid": "aid", "weighting": "weighting", "beta": "β", "n_latent": "K", "posterior_features": "posterior",
            "lr_new": "lr new", "seed": "seed",
            "predicted_use_fraction": "predicted use", "measured_use_fraction": "measured use",
            "kl_prior_loss": "KL [nats]", "bayes_rate": "analytic I(z;y|x)", "alignment_nmi_unambiguous": "NMI (m=1)",
            "hungarian_accuracy_unambiguous": "matched acc (m=1)",
            "baseline_normalized_reconstruction_loss": "ρ_recon", "oracle_rho": "oracle ρ", "codes_used": "codes used",
            "task_correctness": "task correct", "base_task_correctness": "base task correct",
            "gate_first_pass_step": "switch-on step", "handover_step": "hand-over step", "steps": "steps",
            "wall_s": "wall [s]"}
    table = aided[[c for c in cols if c in aided]].rename(columns=cols)
    display(table.round(3))

# %% [markdown]
# ## The barrier: best-z state against collapse during the hard phase

# %%
if not aided.empty:
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for _, r in aided.iterrows():
        gate = read_json(f"{r['run_dir']}/summary.json").get("aid/gate") or []
        if gate:
            g = pd.DataFrame(gate)
            ax.plot(g["step"], g["best_objective"] / g["collapsed_objective"], marker=".",
                    label=f"{sweep.label(r)} K={r.get('n_latent')} {r.get('posterior_features')} ({r['run_id'][-8:]})")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xlabel("step (hard phase)")
    ax.set_ylabel("best-z objective / collapsed objective")
    ax.set_title("hand-over gate: below 1 the soft objective prefers z")
    if ax.lines[1:]:
        ax.legend(fontsize=7)
    fig.tight_layout()

# %% [markdown]
# ## Latent value against strategy on the rows where one strategy fits (m = 1)

# %%
for _, r in aided.iterrows():
    pe = pd.read_parquet(f"{r['run_dir']}/per_example.parquet")
    if "n_consistent" in pe and pe["strategy"].notna().all():
        display(Markdown(f"**{sweep.label(r)}** (`{r['run_id']}`)"))
        display(confusion(pe))

# %% [markdown]
# ## The phase boundary: measured against predicted
#
# For every weighting swept over at least three β values (e.g. `zfree sweep
# analysis/sweeps/phase_boundary.yaml`): the β at which the measured rate falls to half its plateau
# against the same point of the predicted rate (DESIGN §1, with the base model's excess over the
# Bayes loss). The target: within ±25%.

# %%
from zfree.plotting import plot_phase_boundary, plot_use_by_length

boundary = sweep.phase_boundary()
if boundary.empty:
    display(Markdown("No weighting has runs at three or more β values here: no boundary to measure."))
else:
    display(boundary.round(3))
    pb_runs = runs[runs["weighting"].isin(boundary["weighting"])]
    plot_phase_boundary(pb_runs, sweep.theory_curves(), boundary)
    plt.show()

# %% [markdown]
# ## The staircase: use per length under `distribution` weighting
#
# With ragged lengths the distribution weighting predicts β* = 1/(|S| c_base): short examples
# switch on first. Measured use per |S| (KL at least half the example's Bayes rate) against it.

# %%
use = sweep.use_by_length("distribution")
if use.empty:
    display(Markdown("No `distribution` runs with per-example use here."))
else:
    plot_use_by_length(use)
    plt.show()
