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
# # Making z switch on: the aids, predicted against measured
#
# Every aided run (`aid` ≠ none) next to theory: predicted use (β_eff < 1 + |S|·excess / bayes_nll, the
# base model's excess over the Bayes loss counted where the generator knows it), then the measured
# rate, alignment on the rows where one strategy fits (m = 1), ρ_recon, oracle ρ, the codes
# used, the step at which the hand-over gate first passed and the barrier — the hard phase's
# best-z objective (mean w·min_k nll + β·log K) against the collapsed one (mean w·b) over
# training. Aids that do not work stay in the table with their numbers. "matched acc (m = 1)":
# the accuracy of the best one-to-one matching of latent values to strategies (Hungarian
# algorithm); "switch-on step": the first step the gate passed (NaN: it never passed, and the
# hand-over was forced at the hard phase's budget). Runs whose hard phases coincide (the hard
# phase reconstructs at the distribution scale for every weighting, so distribution and token
# with a distribution outer weight train alike there) draw one gate trace over the other.

# %% tags=["parameters"]
sweep_dir = "../runs/study-aided"  # a folder written by `zfree study` or `zfree sweep`

# %%
from IPython.display import Markdown, display

from zfree_lab.report.gains_report import (NO_STRATEGY, NO_TRUTH, drop_empty, dropped_markdown, has_generator_truth, left_out,
                                       study_gains)
from zfree_lab.experiment.folding import nothing_to_show
from zfree_lab.report.plotting_aids import plot_handover_gate, plot_phase_boundary, plot_use_by_length
from zfree_lab.report.report import (aided_runs, aided_tables, boundary_table, checkmarks, confusion_tables, gate_traces,
                                 show, switch_on_targets)
from zfree_lab.experiment.results import load_sweep

sweep = load_sweep(sweep_dir)
runs = sweep.runs
truth = has_generator_truth(runs)
given = study_gains(sweep_dir, runs)
if given is not None:  # the targets read z's gain over the z-free control where there is one
    runs = runs.merge(given[1][["run_id", "z_gain", "z_gain_lo", "z_gain_hi"]], on="run_id", how="left")
aided = aided_runs(runs)
if aided.empty:
    nothing_to_show("No aided runs in this folder (every run has `aid = none`).")
dropped = []
for part in aided_tables(aided) if not aided.empty else []:
    part, gone = drop_empty(part)
    dropped += gone
    display(part)
display(Markdown(dropped_markdown(dropped, "no run passed the hand-over gate" if truth else
                                  NO_TRUTH + "; a switch-on step only where a gate passed")))

# %% [markdown]
# ## Targets met?
#
# Where theory predicts use: NMI (m = 1) ≥ 0.9, ρ_recon ≤ 0.3, KL within 20% of the analytic
# I(z; y | x), task correctness within 1 point of the base model and, where the study has a z-free
# control, z's gain interval above 0. Where it predicts no use: z ended unused. ✓ met, ✗ not met,
# – not applicable. On real data (no generator truth) the targets are the verdict's rule: use
# measured and z's gain interval above 0.

# %%
if aided.empty:
    nothing_to_show("No aided runs: no targets to judge.")
else:
    targets, gone = drop_empty(switch_on_targets(aided, synthetic=truth).set_index("run"), keep=("z unused", "all met"))
    display(checkmarks(targets))
    display(Markdown(dropped_markdown(gone)))

# %% [markdown]
# ## The barrier: best-z state against collapse during the hard phase

# %%
traces = gate_traces(aided, runs)
if traces.empty:
    nothing_to_show("No hand-over gate recorded (no run with `aid = hard_em_then_soft`).")
else:
    show(plot_handover_gate(traces))

# %% [markdown]
# ## Latent value against strategy on the rows where one strategy fits (m = 1)

# %%
if not truth:
    nothing_to_show(left_out("Latent value against strategy", NO_STRATEGY))
elif aided.empty:
    nothing_to_show("No aided runs: no latent value to set against the strategy.")
for title, table in confusion_tables(aided, runs) if truth else []:
    display(Markdown(f"**{title}**"))
    display(table)

# %% [markdown]
# ## The phase boundary: measured against predicted
#
# For every weighting swept over at least three β values (e.g. `zfree sweep
# analysis/sweeps/phase_boundary.yaml`): the β at which the measured rate falls to half its plateau
# against the same point of the predicted rate (docs/concepts/theory.md, with the base model's excess over the
# Bayes loss). The prediction holds when the two agree within ±25%.

# %%
boundary = sweep.phase_boundary()
if not truth:
    nothing_to_show(left_out("The phase boundary"))
elif boundary.empty:
    nothing_to_show("No weighting has runs at three or more β values here: no boundary to measure.")
else:
    display(boundary_table(boundary))
    show(plot_phase_boundary(runs[runs["weighting"].isin(boundary["weighting"])], sweep.theory_curves(), boundary))

# %% [markdown]
# ## The staircase: use per length under `distribution` weighting
#
# With ragged lengths the distribution weighting predicts β* = 1/(|S| c_base): short examples
# switch on first. Measured use per |S| (KL at least half the example's Bayes rate) against it.

# %%
use = sweep.use_by_length("distribution")
if not truth:
    nothing_to_show(left_out("The staircase", "measured use per |S| is read against each row's Bayes rate, "
                                                "which only the synthetic generator knows"))
elif use.empty:
    nothing_to_show("No `distribution` runs with per-example use here.")
else:
    show(plot_use_by_length(use))
