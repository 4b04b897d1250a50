# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Explore finished sweeps, launch small ones
#
# Dropdowns (figure, weighting, latent kind) and sliders (β, reconstruction weight w) redraw the
# figures of the other notebooks from a sweep folder. The launch panel runs a small sweep (a β
# range × weightings × seeds) into the same folder on the local process pool and refreshes the
# explorer as each run finishes. Open with `make lab`. Papermill runs this notebook with
# `interactive = False`, which skips the widget cells.

# %% tags=["parameters"]
sweep_dir = "../runs/study-default"  # a folder written by `zfree sweep` or `zfree study`
interactive = True  # False: no widgets (batch runs)
steps = 50  # for runs launched from the panel
workers = 2

# %%
from zfree.results import load_sweep

sweep = load_sweep(sweep_dir)
sweep.runs[["run_id", "weighting", "latent_kind", "aid", "beta", "recon_weight", "kl_prior_loss",
            "baseline_normalized_reconstruction_loss", "alignment_nmi", "task_correctness"]].round(4)

# %%
if interactive:
    from zfree.widgets import SweepExplorer

    explorer = SweepExplorer(sweep_dir)
    display(explorer.widget)

# %%
if interactive:
    from zfree.config import TrainConfig
    from zfree.widgets import LaunchPanel

    # the first finished run's config (same data and base run), else the defaults
    template = sweep.config(sweep.runs["run_id"].iloc[0]) if len(sweep.runs) else TrainConfig().to_flat()
    base = {**template, "steps": steps}
    panel = LaunchPanel(base, sweep_dir, explorer=explorer, workers=workers)
    display(panel.widget)
