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
# ## Labels, notes and what each latent value writes
#
# What z learned by the run that uses it most (a sentence per latent value, descriptive; the
# properties of y against their permutation baseline; the tokens each value promotes). Per label present in the data (`labels` of the rows): NMI and Hungarian accuracy between the
# posterior's argmax and the label, and a held-out linear probe of the label from the posterior
# features, beside the majority-class baseline they must beat; ρ_recon and the rate beside them;
# a warning where a label rests on fewer than 50 rows or one value. Where the study measured it
# (`multiref.csv`) and the data has multiple references (conditional, some x with two or more y), the
# multi-reference evidence per run, beside its z-free control's. Then the notes (what
# could not be measured), the confusion of latent values against each label for the run that uses z most
# (a heatmap where a label has more values than a table shows), and, for a few validation x, the greedy and
# one sampled y under each latent value.

# %% tags=["parameters"]
sweep_dir = "../runs/study-e2e"  # a folder written by `zfree study`

# %%
import json
from pathlib import Path

import pandas as pd
from IPython.display import Markdown, display

from zfree.evaluate.latent_stats import label_confusion
from zfree_lab.report.labels_report import (confusion_is_wide, dashes, label_table, multiple_references, multiref_note,
                                        multiref_table, notes_markdown, samples_table, samples_view)
from zfree_lab.report.meaning_report import show_meaning
from zfree_lab.report.plotting_study import plot_label_confusion
from zfree_lab.report.report import md_text, run_label, show
from zfree_lab.experiment.results import collect_runs

runs = collect_runs(Path(sweep_dir) / "runs")
notes_file = Path(sweep_dir) / "notes.json"
meta = json.loads(notes_file.read_text()) if notes_file.exists() else {}
display(Markdown(notes_markdown(meta.get("notes", []))))
if meta.get("predicted_boundaries"):
    display(Markdown("**Predicted boundaries β\\* per weighting** (median over validation rows of "
                     "`zfree.objective.theory.critical_beta`, the η = 1 rule) and the β run"))
    display(pd.DataFrame(meta["predicted_boundaries"]).set_index("weighting"))
if not runs.empty:
    display(Markdown("**Per label.** An accuracy means something only above its `majority` column: the share "
                     "of the most common value among the evaluated rows, what a constant guess scores."))
    with pd.option_context("display.max_columns", None):  # every label's columns (a wide table scrolls)
        display(label_table(runs))

# %%
multiref = multiref_table(sweep_dir) if multiple_references(sweep_dir) else None  # none: no MR has two references
if multiref is not None:
    display(Markdown("### Multi-reference evidence\n\nPer run: the pairwise BLEU among the latent values' "
                     "outputs for one MR (low: the values write different texts) and how many of the MR's human "
                     "references they cover; beside them, the same for the run's own z-free control over its first "
                     "samples of the same MRs, as many as the run has outputs per MR."))
    with pd.option_context("display.max_columns", None):
        display(dashes(multiref))
    display(Markdown(multiref_note(multiref)))

# %%
if not runs.empty:
    best = runs.sort_values("loss/val/kl_prior_loss", ascending=False).iloc[0]
    show_meaning(best["run_dir"], f"What z learned, run {md_text(run_label(best, runs))} (the largest rate)")
    pe = pd.read_parquet(Path(best["run_dir"]) / "per_example.parquet")
    display(Markdown(f"### Latent values against each label, run {md_text(run_label(best, runs))} (the largest rate)"))
    for col in [c for c in pe.columns if c.startswith("label/")]:
        conf = label_confusion(pe, col.split("/", 1)[1])
        if confusion_is_wide(conf):  # more values than a table shows: a heatmap
            show(plot_label_confusion(conf))
        else:
            display(conf)
    display(Markdown("### Greedy and sampled y under each latent value (full length)"))
    for _, r in runs.sort_values("run_id").iterrows():
        t = samples_table(r["run_dir"])
        if len(t):
            display(Markdown(f"**{md_text(run_label(r, runs))}**"))
            display(samples_view(t))  # left-aligned text, line breaks kept, at full length
