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
# the **ratio of means** mean ℓ̄ / mean b over the rows each run evaluated (the ratio the
# distribution-level weighting divides by, R / c_base). The per-run ρ_recon of the first table divides the same R_val by c_base over *all*
# validation rows instead, so the two differ by the evaluated rows' mean b / c_base. ρ = 1: the run
# reconstructs y as the frozen z-free model does; ρ < 1: better, from z *or* from its decoder's own
# training (a fine-tuned decoder lowers ρ with z unused): z's gain over its z-free control (the
# verdict) tells the two apart.

# %% tags=["parameters"]
sweep_dir = "../runs/study-default"  # a folder written by `zfree sweep` or `zfree study`

# %%
from zfree_lab.report.plotting import plot_rho_distributions
from zfree_lab.report.report import rho_table, show
from zfree_lab.experiment.results import load_sweep

sweep = load_sweep(sweep_dir)
show(plot_rho_distributions(sweep.per_example))

# %%
rho_table(sweep.per_example)
