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
# # Train one CVAE
#
# One run of the shared discrete CVAE (docs/concepts/problem.md) under the objective of docs/concepts/weightings.md.
# The parameters cell takes any flat `zfree.config.TrainConfig` field (the others keep their defaults);
# papermill overrides it. The run folder (docs/reference/artifacts.md) is the output; this notebook only shows it.

# %% tags=["parameters"]
out_dir = "runs/train_cvae_example"  # the run folder
progress = True  # tqdm bar
data_dir = '../data/synth/default'  # relative to notebooks/
base_dir = '../data/base/default'
# any other flat TrainConfig field (docs/reference/config.md) may be set here; the others keep their defaults.
# A study runs this notebook with the cell generated from the config at use (every field, at its default).

# %%
# Build and validate the config first: a bad parameter fails here, before any work.
from zfree.config import TrainConfig

cfg = TrainConfig.from_flat({k: globals()[k] for k in TrainConfig.flat_fields() if k in globals()})
cfg

# %%
from zfree_lab.run.training import train_cvae

summary = train_cvae(cfg, out_dir, progress=progress)

# %%
import pandas as pd

from zfree.core.io import read_jsonl
from zfree_lab.report.plotting import plot_training_curves
from zfree_lab.report.report import show

metrics = pd.DataFrame(read_jsonl(f"{out_dir}/metrics.jsonl"))
show(plot_training_curves({f"{cfg.objective.weighting} β={cfg.objective.beta:g}": metrics}))

# %%
pd.Series({k: v for k, v in summary.items() if "/" in k}).to_frame("final")
