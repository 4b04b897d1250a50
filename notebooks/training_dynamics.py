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
# the posterior gets gradient only from the KL (docs/concepts/aids.md): the KL typically falls below the
# collapse line (0.05 nats, dotted vertical per run) within the first evaluations.

# %% tags=["parameters"]
sweep_dir = "../runs/study-default"  # a folder written by `zfree sweep` or `zfree study`
run_ids = ""  # comma-separated run ids; empty: every run (at most max_runs)
max_runs = 8

# %%
from IPython.display import Markdown, display

from zfree_lab.report.gains_report import NO_STRATEGY, left_out
from zfree_lab.experiment.folding import nothing_to_show
from zfree_lab.report.plotting import plot_training_curves
from zfree_lab.report.report import show, training_metrics
from zfree_lab.experiment.results import load_sweep

sweep = load_sweep(sweep_dir)
curves = training_metrics(sweep, run_ids, max_runs)
show(plot_training_curves(curves))
if not any("structure/alignment_nmi" in m and m["structure/alignment_nmi"].notna().any() for m in curves.values()):
    nothing_to_show(left_out("The alignment-NMI panel", NO_STRATEGY))

# %% [markdown]
# The distortion on the training batches every 10 steps (`curve.jsonl` of each run, the z-free controls
# dashed, the label oracles dotted): a gain measured at the end counts only where the control's D has
# flattened, otherwise more steps would lower D_control too.

# %%
from pathlib import Path

import pandas as pd

from zfree_lab.report.plotting_aids import plot_train_distortion
from zfree_lab.run.curve import read_curve

run_curves = {d.name: pd.DataFrame(read_curve(d)) for d in sorted(Path(sweep_dir, "runs").iterdir())
              if (d / "curve.jsonl").exists()}
if run_curves:
    show(plot_train_distortion(dict(list(run_curves.items())[: 3 * max_runs])))

