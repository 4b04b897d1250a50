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
# # The phase diagram: β against the reconstruction weight w
#
# One square per run at (β, w), w the mean reconstruction weight of its objective (docs/concepts/weightings.md):
# `plain` is the row w = 1, `distribution` the row w = 1/c_base (marked on the axis), `example`
# (w = 1/(b + ε) per example, placed at its mean) a reference row. Theory (`zfree.objective.theory`)
# predicts z is used where β_eff = β·|S|/w < 1 + |S|·excess / bayes_nll (the base model's excess over the
# Bayes loss, where the generator knows it: a base short of Bayes-optimal moves the boundary to larger β);
# for a scalar w the β where half of the rows use z is the solid line
# β = (β*/w)·w, a line of constant β/w. Along the dotted lines of constant β/w a scale-invariant
# optimizer (Adam) trains identically, so only β/w matters for scalar weights. Run a grid with
# `zfree sweep analysis/sweeps/beta_vs_recon_weight.yaml --out DIR`.

# %% tags=["parameters"]
sweep_dir = "../runs/sweep-beta-vs-recon-weight"  # a folder written by `zfree sweep` or `zfree study`

# %%
from IPython.display import Markdown, display

from zfree_lab.report.figstyle import variants
from zfree_lab.report.gains_report import left_out, runs_c_base
from zfree_lab.report.plotting import plot_phase_diagram
from zfree_lab.report.report import md_text, show
from zfree_lab.experiment.results import load_sweep

sweep = load_sweep(sweep_dir)
crit = sweep.critical_betas()
display(Markdown(f"{len(sweep.runs)} runs; predicted β* (half of the rows use z): "
                 + ", ".join(f"{md_text(w)} {b:.3g}" for w, b in crit.items()) if crit else
                 f"{len(sweep.runs)} runs. " + left_out("The predicted boundary line and β* marks", "the prediction "
                 "counts the base model's excess over the Bayes loss, which only the synthetic generator knows "
                 "(the labels section lists β* under η = 1 where the study computed it)")))

# %%
for variant, runs in variants(sweep.runs):  # one diagram per aid / latent kind: cells are never mixed
    show(plot_phase_diagram(runs, c_base=runs_c_base(sweep.runs, sweep.reference),  # the runs' own c_base
                            beta_over_w=sweep.critical_beta_over_w(), critical_betas=crit, variant=variant))
