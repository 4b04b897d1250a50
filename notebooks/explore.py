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
# Choose a study in the `study` dropdown (the finished studies under `runs/`, newest first) or type
# a folder in the box beside it: the table, the explorer and the launch panel follow, and no file
# changes (saving this notebook leaves `git status` clean). Dropdowns (figure, source, weighting,
# latent kind) and sliders (β, reconstruction weight w) redraw the figures of the other notebooks;
# a control the data cannot change is hidden or disabled with a note. The launch panel shows every
# config field its runs change against the template (the study's first run), offers β around the
# study's own β and β*, lets you choose the aid and the step budget, and runs a small sweep (a β
# range × weightings × seeds) into `<study>/launched` on the local process pool, so the study's own
# runs and report stay as they were; the explorer shows both folders (source: study, launched) and
# refreshes as each run finishes. `stop` ends the workers and keeps the finished runs. Open with
# `make lab` (`make lab STUDY=DIR` opens on DIR), or `zfree lab [DIR]` from an install. Papermill runs this notebook with
# `interactive = False`, which shows the study's runs and skips the widgets.

# %% tags=["parameters"]
sweep_dir = None  # a study or sweep folder; None: $ZFREE_STUDY (which make lab STUDY sets), else the newest under runs/
interactive = True  # False: no widgets (batch runs)
steps = 50  # for runs launched from the panel
workers = 2

# %%
from zfree_lab.experiment.results import load_sweep
from zfree_lab.experiment.study_folders import choose_study
from zfree_lab.report.explore import ExploreLab, runs_overview

sweep_dir = choose_study(sweep_dir)  # one line, offering `make smoke`, when there is none
if interactive:  # another study: the dropdown or the path box below, not this cell
    lab = ExploreLab(sweep_dir, steps=steps, workers=workers)
    display(lab.widget)
else:
    print(f"study: {sweep_dir.resolve()}")
    display(runs_overview(load_sweep(sweep_dir)))

# %%
if interactive:
    display(lab.panel.widget)
