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
from IPython.display import Markdown, display

from zfree.report.plotting_study import plot_loss_fractions, plot_predicted_vs_measured, plot_rate_and_rho_vs_beta
from zfree.report.report import (QUALITY_COLUMNS, USE_COLUMNS, errors_markdown, reference_markdown, run_table,
                                 run_verdicts, show, verdict_markdown)
from zfree.experiment.results import load_sweep

sweep = load_sweep(sweep_dir)
summary = sweep.runs
verdicts = run_verdicts(summary)
display(Markdown("## Verdict: predicted against measured use of z, per run\n\n" + verdict_markdown(verdicts)))
display(Markdown(reference_markdown(sweep.reference)))

# %% [markdown]
# ## Predicted against measured latent use, per run

# %%
display(run_table(summary, USE_COLUMNS).join(verdicts.set_index("run")["verdict"]))
display(run_table(summary, QUALITY_COLUMNS))

# %%
show(plot_rate_and_rho_vs_beta(summary, sweep.theory_curves()))

# %%
show(plot_predicted_vs_measured(summary))

# %% [markdown]
# ## Which term drives the objective

# %%
show(plot_loss_fractions(summary))

# %% [markdown]
# ## Failed runs

# %%
display(Markdown(errors_markdown(sweep.errors)))
