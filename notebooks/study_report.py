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
# # zfree study report
#
# A conditional VAE p(y | x, z) warm-started from a strong z-free model p(y | x): does the latent
# z get used, and where does information-preference theory say it should be? Every run below
# shows **predicted use** (theory: z pays for itself on an example iff β_eff = β·|S|/w < 1) next to
# **measured use**. ρ_recon = R_val / c_base is a ratio of means (seed 000); 1 means z explains
# nothing.

# %% tags=["parameters"]
study_dir = "."  # a folder written by `zfree study`

# %%
import json
from pathlib import Path

import numpy as np
import pandas as pd
from IPython.display import Markdown, display

from zfree.data.pairs import load_pairs
from zfree.io import read_json, read_jsonl
from zfree.plotting import (plot_loss_fractions, plot_predicted_vs_measured, plot_rate_and_rho_vs_beta,
                            plot_training_curves)
from zfree.theory import predict_curve

study = Path(study_dir)
summary = pd.read_csv(study / "summary.csv")
ref = read_json(study / "base" / "reference" / "reference.json")
display(Markdown(
    f"**Reference (entangled run).** c_base = {ref['c_base']:.4f} nats/token on {ref['n_rows']} validation rows; "
    f"analytic (Bayes-optimal) c_base = {ref['c_base_analytic']:.4f}; ratio {ref['c_base'] / ref['c_base_analytic']:.3f}."
    if ref.get("c_base_analytic") else f"**Reference.** c_base = {ref['c_base']:.4f} nats/token."))

# %% [markdown]
# ## Predicted against measured latent use, per run

# %%
cols = ["weighting", "beta", "beta_eff_median", "predicted_use_fraction", "measured_use_fraction",
        "kl_prior_loss", "baseline_normalized_reconstruction_loss", "oracle_rho", "codes_used", "q_max_mean",
        "alignment_nmi", "alignment_nmi_unambiguous", "task_correctness", "base_task_correctness", "steps", "wall_s"]
view = summary[[c for c in cols if c in summary]].copy()
view["verdict"] = np.where(summary["predicted_latent_used"] & ~summary["latent_used"], "collapsed where theory predicts use",
                  np.where(summary["latent_used"], "z used", "z unused (as predicted)"))
display(view.round(4))

# %%
pe = pd.read_parquet(study / "base" / "reference" / "per_example.parquet")
data_file = ref.get("data_file")
pairs = {p.id: p for p in load_pairs(data_file)} if data_file and Path(data_file).exists() else {}
bayes = np.array([pairs[i].bayes_nll if i in pairs else np.nan for i in pe["id"]], float)
betas = np.geomspace(min(summary["beta"].min(), 1e-3) / 2, max(summary["beta"].max(), 1.0) * 2, 60)
curves = pd.concat([
    predict_curve(w, betas, pe["n_tokens"].to_numpy(), bayes, b=pe["b"].to_numpy(), c_base=ref["c_base"]).assign(weighting=w)
    for w in summary["weighting"].unique() if w in ("plain", "distribution")], ignore_index=True) if np.isfinite(bayes).all() else None
fig = plot_rate_and_rho_vs_beta(summary, curves)

# %%
fig = plot_predicted_vs_measured(summary)

# %% [markdown]
# ## Which term drives the objective

# %%
fig = plot_loss_fractions(summary)

# %% [markdown]
# ## Training dynamics (the collapse moment)

# %%
metrics = {}
for _, r in summary.iterrows():
    f = study / "runs" / r["run_id"] / "metrics.jsonl"
    if f.exists():
        metrics[f"{r['weighting']} β={r['beta']:g}"] = pd.DataFrame(read_jsonl(f))
fig = plot_training_curves(metrics)

# %% [markdown]
# ## Failed runs

# %%
errors = [read_json(e) for e in sorted((study / "runs").glob("*/error.json"))]
display(Markdown("None." if not errors else "\n".join(f"- `{e['run_id']}`: {e['error'][:300]}" for e in errors)))
