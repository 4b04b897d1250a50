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
# # Effective β per example
#
# Dividing the objective by w·|S| gives β_eff(x, y) = β·|S|/w (docs/concepts/theory.md): plain β·|S|,
# distribution β·|S|·c_base, example β·|S|·(b + ε) (the weightings' distribution and example levels,
# docs/concepts/weightings.md). Theory: z is worth
# using on an example iff β_eff < η·(1 + |S|·excess / bayes_nll), η = 1 on the synthetic benchmark, where
# the base model's excess over the Bayes loss lifts the threshold above the dashed β_eff = 1 line (a
# base short of Bayes-optimal: the predicted use in the tables counts it; the gray dash-dotted line is that
# threshold's median over the rows, drawn where the generator knows each row's Bayes loss); where a label oracle measured
# an exchange rate η (the available-gain table), the dotted red line is that rule. Left and middle: how β_eff spreads against the z-free
# surprisal b and the length |S|; right: which examples do use z (per-example KL) against their
# β_eff. Per weighting (and aid, where the study has several), the run at the β nearest the
# parameter.

# %% tags=["parameters"]
sweep_dir = "../runs/study-default"  # a folder written by `zfree sweep` or `zfree study`
beta = 0.1  # per weighting, the run with the nearest β is shown

# %%
from zfree_lab.report.gains_report import measured_eta, study_gains
from zfree_lab.report.plotting import plot_effective_beta
from zfree_lab.report.report import runs_at_beta, show
from zfree_lab.experiment.results import load_sweep

sweep = load_sweep(sweep_dir)
chosen = runs_at_beta(sweep.runs, beta)
pe = sweep.per_example[sweep.per_example["run_id"].isin(chosen["run_id"])]
given = study_gains(sweep_dir, sweep.runs)
eta = measured_eta(given[0]) if given is not None else None
show(plot_effective_beta(pe, eta=eta[0] if eta else None))

# %%
keys = [c for c in ("weighting", "latent_kind", "aid") if c in pe and (c == "weighting" or pe[c].nunique() > 1)]
pe.groupby([*keys, "beta"])[["beta_eff", "kl"]].agg(["min", "median", "max"]).round(3)
