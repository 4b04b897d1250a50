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
# # ρ_recon per example
#
# Per-example ρ_i = ℓ̄_i / b_i (reconstruction under the posterior over the z-free surprisal) per
# weighting and β. Two summaries, both drawn and named: the **mean of ratios** mean_i ρ_i, and
# the **ratio of means** ρ_recon = mean ℓ̄ / mean b, which is seed 000's R_val / c_base. ρ = 1:
# z explains nothing; ρ < 1: z carries information the z-free model lacks.

# %% tags=["parameters"]
sweep_dir = "../runs/study-default"  # a folder written by `zfree sweep` or `zfree study`

# %%
from zfree.plotting import plot_rho_distributions
from zfree.report import rho_table, show
from zfree.results import load_sweep

sweep = load_sweep(sweep_dir)
show(plot_rho_distributions(sweep.per_example))

# %%
rho_table(sweep.per_example)
