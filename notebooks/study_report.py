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
# # zfree study report
#
# A conditional VAE p(y | x, z) warm-started from a strong z-free model p(y | x): does the latent
# z get used, and where does information-preference theory say it should be? Every run below
# shows **predicted use** (theory: z pays for itself on an example iff β_eff = β·|S|/w < 1) next to
# **measured use**. ρ_recon = R_val / c_base is a ratio of means (seed 000); 1 means z explains
# nothing.

# %% tags=["parameters"]
sweep_dir = "../runs/study-default"  # a folder written by `zfree study` or `zfree sweep`

# %%
import numpy as np
from IPython.display import Markdown, display

from zfree.plotting import plot_loss_fractions, plot_predicted_vs_measured, plot_rate_and_rho_vs_beta
from zfree.results import load_sweep

sweep = load_sweep(sweep_dir)
summary, ref = sweep.runs, sweep.reference
display(Markdown(
    "**No reference found** (no base/reference nor the runs' base_dir)." if ref is None else
    f"**Reference (entangled run).** c_base = {ref['c_base']:.4f} nats/token on {ref['n_rows']} validation rows; "
    f"analytic (Bayes-optimal) c_base = {ref['c_base_analytic']:.4f}; ratio {ref['c_base'] / ref['c_base_analytic']:.3f}."
    if ref.get("c_base_analytic") else f"**Reference.** c_base = {ref['c_base']:.4f} nats/token."))

# %% [markdown]
# ## Predicted against measured latent use, per run

# %%
cols = ["weighting", "latent_kind", "aid", "beta", "beta_eff_median", "predicted_use_fraction", "measured_use_fraction",
        "kl_prior_loss", "baseline_normalized_reconstruction_loss", "oracle_rho", "codes_used", "q_max_mean",
        "alignment_nmi", "alignment_nmi_unambiguous", "task_correctness", "base_task_correctness", "steps", "wall_s"]
view = summary[[c for c in cols if c in summary]].copy()
view["verdict"] = np.where(summary["predicted_latent_used"] & ~summary["latent_used"], "collapsed where theory predicts use",
                  np.where(summary["latent_used"], "z used", "z unused (as predicted)"))
display(view.round(4))

# %%
fig = plot_rate_and_rho_vs_beta(summary, sweep.theory_curves())

# %%
fig = plot_predicted_vs_measured(summary)

# %% [markdown]
# ## Which term drives the objective

# %%
fig = plot_loss_fractions(summary)

# %% [markdown]
# ## Failed runs

# %%
display(Markdown("None." if not sweep.errors else
                 "\n".join(f"- `{e['run_id']}`: {e['error'][:300]}" for e in sweep.errors)))
