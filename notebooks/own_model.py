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
# # Your own model and data
#
# The interactive form of `zfree study --model MODEL --data FILE.jsonl --out DIR`
# (`zfree_lab.experiment.own_study`): split the pairs by x, link the model as the base (no copy), score the
# z-free reference with it (pretrained-source setting), place β around each weighting's predicted
# boundary, train the grid, and show the report's tables here. Papermill parameters: `model`,
# `data`, `out` (and `val`, `preset`).

# %% tags=["parameters"]
model = "../data/e2e/base/model"  # a transformers folder, a .gguf file (or a folder holding one), or a hub id
data = "../data/e2e/val.jsonl"  # one JSONL file of {id?, x, y, strategy?, labels?}
val = None  # a separate validation JSONL (None: split from data by x)
out = "../runs/own_model"  # the study folder
preset = "own"  # zfree_lab.experiment.own_study.OWN_PRESETS: own | own_smoke
render = False  # also render report.html (papermill of the report notebooks; slower)

# %% [markdown]
# ## Config: the grid of the preset, editable here

# %%
import dataclasses
from pathlib import Path

import pandas as pd
from IPython.display import Markdown, display

from zfree_lab.experiment.own_study import OWN_PRESETS, run_own_study
from zfree_lab.experiment.sources import link_model, prepare_split, write_reference
from zfree_lab.experiment.spec import own_grid
from zfree_lab.run.locks import STUDY_MARKS, claim_folder

cfg = OWN_PRESETS[preset]
# e.g. cfg = dataclasses.replace(cfg, weightings=("plain", "distribution"), beta_factors=(1 / 3,))
display(pd.Series(dataclasses.asdict(cfg)).to_frame("value"))

# %% [markdown]
# ## The split, the base link and the reference (each skipped when already done)

# %%
out_dir = claim_folder(Path(out).resolve(), "study folder", STUDY_MARKS)  # refused if it holds someone else's files
train_pairs, val_pairs, shared = prepare_split(data, out_dir, val=val, val_size=cfg.val_size)
base = link_model(model, out_dir)
ref = write_reference(base, out_dir)
variants, boundaries = own_grid(cfg, ref)
display(Markdown(f"{len(train_pairs)} train rows, {len(val_pairs)} val rows ({shared} x shared); "
                 f"c_base = {ref.c_base:.4f} nats/token (pretrained source)"))
display(pd.DataFrame(boundaries).set_index("weighting"))

# %% [markdown]
# ## Train the grid and collect the results

# %%
result = run_own_study(model, data, out_dir, val=val, preset=cfg, render=render)

# %%
from zfree_lab.report.labels_report import label_table, notes_markdown, samples_table, samples_view
from zfree_lab.report.report import md_text
from zfree_lab.experiment.results import collect_runs
from zfree_lab.experiment.study_notes import study_notes

runs = collect_runs(out_dir / "runs")
display(Markdown(notes_markdown(study_notes(out_dir).get("notes", []))))
display(label_table(runs))
for _, r in runs.iterrows():
    display(Markdown(f"**{md_text(r['run_id'])}**"))
    display(samples_view(samples_table(r["run_dir"])))
