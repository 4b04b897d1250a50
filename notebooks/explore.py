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
# # Explore finished sweeps, launch small ones
#
# Dropdowns (figure, source, weighting, latent kind) and sliders (β, reconstruction weight w)
# redraw the figures of the other notebooks from a sweep folder; a control the data cannot
# change is hidden or disabled with a note. The launch panel shows every config field its runs
# change against the template (the study's first run), offers β around the study's own β and β*,
# lets you choose the aid and the step
# budget, and runs a small sweep (a β range × weightings × seeds) into `<sweep_dir>/launched`
# on the local process pool, so the study's own runs and report stay as they were; the explorer
# shows both folders (source: study, launched) and refreshes as each run finishes. `stop` ends
# the workers and keeps the finished runs. Open with `make lab`. Papermill runs this notebook
# with `interactive = False`, which skips the widget cells.

# %% tags=["parameters"]
sweep_dir = None  # a study or sweep folder; None: $ZFREE_STUDY (make lab STUDY=DIR), else the newest under runs/
interactive = True  # False: no widgets (batch runs)
steps = 50  # for runs launched from the panel
workers = 2

# %%
from pathlib import Path

from zfree.experiment.results import choose_study, load_sweep

sweep_dir = choose_study(sweep_dir)  # one line, offering `make smoke`, when there is none
print(f"study: {sweep_dir.resolve()}")
launched_dir = Path(sweep_dir) / "launched"  # the panel's runs, beside the study's own
sweep = load_sweep(sweep_dir)
sweep.runs[["run_id", "weighting", "latent_kind", "aid", "beta", "recon_weight", "kl_prior_loss",
            "baseline_normalized_reconstruction_loss", "alignment_nmi", "task_correctness"]].round(4)

# %%
if interactive:
    from zfree.report.widgets import SweepExplorer

    explorer = SweepExplorer([sweep_dir, launched_dir])
    display(explorer.widget)

# %%
if interactive:
    from zfree.config import TrainConfig
    from zfree.experiment.study_notes import study_notes
    from zfree.report.report import launch_beta_range
    from zfree.report.widgets import LaunchPanel

    # the template: the first finished run's config (same data and base run), else the defaults
    template = sweep.config(sweep.runs["run_id"].iloc[0]) if len(sweep.runs) else TrainConfig().to_flat()
    # β offered around the study's own β and predicted β* (theory's, or the study's notes on real data)
    stars = [*sweep.critical_betas().values(), *(r["beta_star"] for r in study_notes(sweep_dir).get(
        "predicted_boundaries", []))]
    panel = LaunchPanel(template, launched_dir, explorer=explorer, workers=workers, steps=steps,
                        log_beta=launch_beta_range(sweep.runs["beta"], stars))
    display(panel.widget)
