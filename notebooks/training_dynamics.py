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
# # Training dynamics: the collapse moment
#
# For the chosen runs: the share of the objective of each term, KL, ρ_recon and alignment over
# the evaluation steps. From a zero latent injection every latent value gives the same loss, so
# the posterior gets gradient only from the KL (DESIGN §1): the KL typically falls below the
# collapse line (0.05 nats, dotted vertical per run) within the first evaluations.

# %% tags=["parameters"]
sweep_dir = "../runs/study-default"  # a folder written by `zfree sweep` or `zfree study`
run_ids = ""  # comma-separated run ids; empty: every run (at most max_runs)
max_runs = 8

# %%
from IPython.display import Markdown, display

from zfree.report.gains_report import NO_STRATEGY, left_out
from zfree.report.plotting import plot_training_curves
from zfree.report.report import show, training_metrics
from zfree.experiment.results import load_sweep

sweep = load_sweep(sweep_dir)
curves = training_metrics(sweep, run_ids, max_runs)
show(plot_training_curves(curves))
if not any("structure/alignment_nmi" in m and m["structure/alignment_nmi"].notna().any() for m in curves.values()):
    display(Markdown(left_out("The alignment-NMI panel", NO_STRATEGY)))
