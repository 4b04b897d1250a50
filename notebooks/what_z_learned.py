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
# ## What z learned
#
# For each run that wrote `latent_meaning.json` (a discrete run with a learned or optimal posterior, or a
# Gaussian run's k-means clusters of its posterior means), the runs with the largest rate first: one
# sentence per latent value, built from the derived properties of y that pass their permutation baseline
# (mutual information with the posterior argmax against 1000 shuffles within strata of what x alone
# predicts, the router's argmax: what z carries beyond x; Bonferroni over the properties)
# and that the posterior itself carries (their mutual information under q, at least a tenth of the
# argmax's: the argmax of a posterior that barely moves is not what z carries),
# the tokens and phrases the value promotes over the other values (teacher-forced on the rows' own y,
# nats) and its length. Descriptive: a property that passes describes a value, it is not shown to cause
# it. The z-free controls and label oracles have no learned z and write none.

# %% tags=["parameters"]
sweep_dir = "../runs/study-default"  # a folder written by `zfree study`
max_runs = 4  # the runs shown, largest rate first

# %%
from pathlib import Path

from IPython.display import Markdown, display

from zfree_lab.experiment.results import collect_runs
from zfree_lab.experiment.folding import nothing_to_show
from zfree_lab.report.meaning_report import show_meaning
from zfree_lab.report.report import md_text, run_label

runs = collect_runs(Path(sweep_dir) / "runs")
shown = 0
if not runs.empty:
    for _, r in runs.sort_values("loss/val/kl_prior_loss", ascending=False).iterrows():
        if shown < max_runs and show_meaning(r["run_dir"], f"Run {md_text(run_label(r, runs))}"):
            shown += 1
if not shown:
    nothing_to_show("No run of this study wrote `latent_meaning.json` (runs before it existed, or only z-free "
                     "controls and oracles).")
