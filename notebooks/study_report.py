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
# # zfree report
#
# A conditional VAE p(y | x, z) warm-started from a strong z-free model p(y | x): does the latent
# z get used, and where does information-preference theory say it should be? Every run below
# shows **predicted use** (theory: z pays for itself on an example iff β_eff = β·|S|/w < η·(1 + |S|·excess /
# bayes_nll), η = 1 on the synthetic benchmark, the best label's measured exchange rate on real data; the
# base model's excess over the Bayes loss counts only where the generator knows that loss, and a base short
# of Bayes-optimal lets z pay above β_eff = 1) next to **measured
# use**, and, where the study trained a z-free control, **z's gain** D_control − D_run (nats per
# example, 95 % bootstrap interval over the evaluated rows of one seed: the within-seed interval): a run
# uses z only when its use is measured *and* that interval lies above 0. Two further readings keep a
# distortion gain apart from a better model: **z switched on** (inside one model, another row's z costs
# the decoder nats) and the **net gain** (the control's D minus the CVAE's marginal NLL, the rate paid).
# With several seeds (`zfree study --seeds 0-2`, or `seeds:` in a sweep's spec) each claim is tested over seeds, the unit of evidence.
# ρ_recon = R_val / c_eval is a ratio of means.

# %% tags=["parameters"]
sweep_dir = "../runs/study-default"  # a folder written by `zfree study` or `zfree sweep`

# %%
from IPython.display import Markdown, display

from zfree_lab.report.answers import answers_markdown
from zfree_lab.report.gains_report import (available_gain_markdown, available_gain_table, drop_empty, dropped_markdown,
                                       gain_verdict_markdown, gain_verdicts, has_generator_truth, measured_eta,
                                       runs_c_base_markdown, study_gains)
from zfree_lab.report.leaderboard_report import leaderboard_table, method_markdown, winner_markdown
from zfree_lab.report.plan_report import PHASE_NOTE, oracle_cut_markdown, plan_section, read_plan
from zfree_lab.report.seed_report import read_seed_gains, seed_section
from zfree_lab.report.table_view import turned_when_wide
from zfree_lab.report.plotting_study import (plot_gains, plot_leaderboard, plot_loss_fractions, plot_predicted_vs_measured,
                                         plot_rate_and_rho_vs_beta)
from zfree_lab.report.report import (QUALITY_COLUMNS, USE_COLUMNS, errors_markdown, reference_markdown, run_table,
                                 run_verdicts, show, verdict_markdown)
from zfree_lab.experiment.leaderboard import read_leaderboard
from zfree_lab.experiment.results import load_sweep
from zfree_lab.experiment.study_folders import count_runs
from zfree_lab.experiment.folding import nothing_to_show
from zfree_lab.experiment.study_notes import study_notes

sweep = load_sweep(sweep_dir)
summary = sweep.runs
NO_RUN = "No CVAE run in this study (only label oracles, their z-free controls and null oracles): no run whose use to read."  # a study of label oracles alone
truth = has_generator_truth(summary)
given = study_gains(sweep_dir, summary)  # (oracles, gains) against the z-free control; None without controls
eta = measured_eta(given[0]) if given else None
verdicts = gain_verdicts(summary, given[1], eta) if given else run_verdicts(summary)
if given and not summary.empty:  # the four answers first, from the tables the sections below show
    display(Markdown(answers_markdown(verdicts, given[0], summary["seed"].nunique() if "seed" in summary else 1,
                                      summary.get("steps"), study_notes(sweep_dir).get("base_near_uniform"),
                                      summary.get("aid"))))
opening, phases = plan_section(sweep_dir, summary)  # estimate.json, timings.json and the runs' steps
if opening:
    display(Markdown(opening))
if phases is not None:
    display(phases)
    display(Markdown(PHASE_NOTE))
if given:
    cut = oracle_cut_markdown(read_plan(sweep_dir)[0], given[0])  # where the budget cut label oracles: which cut
    display(Markdown("## What z could gain: the label oracles\n\n"
                     "Each oracle is the z-free control's recipe with z := the row's label: ΔR = D_control − D_oracle "
                     "(nats per example) is what a latent carrying that label could buy, H(label | x) what it costs in "
                     "rate, η = ΔR/H the exchange rate theory needs; the fine-tuning gain D_base − D_control is what the "
                     "control's own training bought over the frozen base model on the same rows.\n\n"
                     + (cut if cut and given[0].empty else
                        available_gain_markdown(given[0]) + ("\n\n" + cut if cut else ""))))
    if len(given[0]):
        display(turned_when_wide(available_gain_table(given[0])))  # a few labels: one column each
    display(Markdown("## Verdict: z's gain over the z-free control, per run\n\n" + gain_verdict_markdown(verdicts, eta)))
    over_seeds = seed_section(read_seed_gains(sweep_dir))  # seed_gains.csv: the paired gains over seeds, per cell
    if over_seeds is not None:
        display(Markdown(over_seeds[0]))
        if over_seeds[1] is not None:
            display(over_seeds[1])
else:
    display(Markdown("## Verdict: predicted against measured use of z, per run\n\n*No z-free control in this "
                     "folder (an older study or a sweep): judged on measured use alone.*\n\n" + verdict_markdown(verdicts)))
display(Markdown(runs_c_base_markdown(summary, sweep.reference) if not truth else reference_markdown(sweep.reference)))

# %%
if given:
    gained = summary.merge(given[1][["run_id", "z_gain", "z_gain_lo", "z_gain_hi"]], on="run_id", how="left")
    show(plot_gains(gained, given[0], eta[0] if eta else None))  # rate: runs_table's mean KL, as gains.csv's

# %%
board = read_leaderboard(sweep_dir)  # leaderboard.csv: written only for a study with seeds or several remedies
if board is not None and len(board):
    display(Markdown("## Remedies leaderboard\n\n" + method_markdown(board)))
    display(leaderboard_table(board))
    show(plot_leaderboard(board))
    display(Markdown(winner_markdown(board)))

# %% [markdown]
# ## Predicted against measured latent use, per run

# %%
if summary.empty:  # a study of label oracles alone (their controls and nulls are not CVAE runs)
    nothing_to_show(NO_RUN)
else:
    display(run_table(summary, USE_COLUMNS).join(verdicts.set_index("run")["verdict"]))
    quality, dropped = drop_empty(run_table(summary, QUALITY_COLUMNS))
    display(quality)
    display(Markdown(dropped_markdown(dropped)))

# %%
if not summary.empty:
    show(plot_rate_and_rho_vs_beta(summary, sweep.theory_curves()))

# %%
if not summary.empty:
    show(plot_predicted_vs_measured(summary))

# %% [markdown]
# ## Which term drives the objective

# %%
if summary.empty:
    nothing_to_show(NO_RUN)
else:
    show(plot_loss_fractions(summary))

# %% [markdown]
# ## Failed runs

# %%
display(Markdown(errors_markdown(sweep.errors, finished=sum(count_runs(sweep.sweep_dir / "runs").values()))))  # controls, oracles too
