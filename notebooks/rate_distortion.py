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
# # The rate-distortion plane
#
# Rate R = KL(q(z|x,y) ‖ p(z|x)) and distortion D = |S|·ℓ̄, both mean nats per sequence over the
# evaluation rows (Alemi et al. 2018, "Fixing a Broken ELBO"). One curve per weighting across β.
# The z-free model sits at R = 0, D = mean |S|·b (|S|·c_base per sequence); each z-free control (same
# training, no latent; where the study has them) at R = 0, D_control, joined by a dashed line to its
# own runs (a run is read against its own control: C1, C2, ... where there are several); on the synthetic
# benchmark the analytic optimum, where z names the strategy, is (log K/m, 0). The Bayes-optimal
# z-free point and that optimum share one iso-ELBO line D + R = const: at β = 1 the ELBO has no
# preference for using z, which is why collapse is the default.

# %% tags=["parameters"]
sweep_dir = "../runs/study-default"  # a folder written by `zfree sweep` or `zfree study`

# %%
from IPython.display import Markdown, display

from zfree_lab.report.gains_report import control_links, drop_empty, dropped_markdown, study_gains
from zfree_lab.report.plotting import plot_rate_distortion
from zfree_lab.report.report import run_table, show
from zfree_lab.experiment.results import load_sweep

sweep = load_sweep(sweep_dir)
runs = sweep.runs
given = study_gains(sweep_dir, runs)
controls = control_links(runs, given[1]) if given is not None else None  # each run's own control
show(plot_rate_distortion(runs, z_free=float(runs["zfree_distortion"].mean()), bayes_rate=float(runs["bayes_rate"].mean()),
                          controls=controls))

# %%
table, dropped = drop_empty(run_table(runs, {"rate": "R [nats]", "distortion": "D [nats]", "zfree_distortion": "z-free D",
                                             "bayes_rate": "log K/m"}))
display(table)
display(Markdown(dropped_markdown(dropped)))
