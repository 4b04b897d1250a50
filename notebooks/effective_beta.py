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
# # Effective β per example
#
# Dividing the objective by w·|S| gives β_eff(x, y) = β·|S|/w (DESIGN §1): plain β·|S|,
# distribution β·|S|·c_base (seed 000), example β·|S|·(b + ε) (seed 002). Theory: z is worth
# using on an example iff β_eff < 1. Left and middle: how β_eff spreads against the z-free
# surprisal b and the length |S|; right: which examples do use z (per-example KL) against their
# β_eff. One run per weighting, at the β nearest the parameter.

# %% tags=["parameters"]
sweep_dir = "../runs/study-default"  # a folder written by `zfree sweep` or `zfree study`
beta = 0.1  # per weighting, the run with the nearest β is shown

# %%
import numpy as np

from zfree.plotting import plot_effective_beta
from zfree.results import load_sweep

sweep = load_sweep(sweep_dir)
runs = sweep.runs
nearest = runs.loc[(np.log(runs["beta"]) - np.log(beta)).abs().groupby([runs[c] for c in ("weighting", "latent_kind", "aid")]).idxmin()]
pe = sweep.per_example[sweep.per_example["run_id"].isin(nearest["run_id"])]
fig = plot_effective_beta(pe)

# %%
pe.groupby(["weighting", "beta"])[["beta_eff", "kl"]].describe().round(3)
