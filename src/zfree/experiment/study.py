"""The main job: data -> base run -> CVAE grid (papermill) -> summary.csv -> report.html.

Presets:
  smoke    tiny data, a tiny base model trained on the spot, two short runs (< 2 minutes; tests).
  default  the shipped benchmark and base run: each of plain, distribution, example and token
           weighting once without an aid (z collapses where theory predicts use) and once with the
           switch-on recipe: distribution, example and token inside their predicted boundary (z
           switches on), plain at beta = 1 outside it (z ends unused); <= 10 minutes on 2 cores.
  aided    the aids issue: the best aid on both sides of the prediction and the aids that fail.
  full     the complete phase diagram (hours).
  e2e      real text: data/e2e with its shipped base data/e2e/base at a third of each weighting's
           predicted boundary: distribution and example with the aid, every weighting without;
           the z-free controls and the oracles of n_sentences, first_slot, complete and their joint;
           labels' NMI/probe, per-value samples and the multi-reference evidence.
Rerunning any preset skips finished work. Your own model and data: ``zfree.experiment.own_study``.
"""

from __future__ import annotations

import dataclasses

from pathlib import Path

from zfree.config import BaseTrainConfig
from zfree.core.paths import SHIPPED_E2E
from zfree.data.synth import DataConfig
from zfree.experiment.pipeline import run_experiment
from zfree.experiment.spec import BaseSource, DataSource, ExperimentSpec
from zfree.objective.remedies import HARD_EM_RECIPE, SWITCH_ON_RECIPE, remedy_fields  # noqa: F401 (re-exported)
from zfree.core.weightings import WEIGHTINGS as WEIGHTING_REGISTRY

# the aids issue's recipes live with the other remedies (zfree.objective.remedies)
_AIDED_RUN = {"steps": 1200, "eval_every": 300, "eval_rows": 500, "decode_rows": 200}
#: the best aid's runs: one evaluation fewer (1200 steps took 618-639 s with evaluations every 300)
_BEST_RUN = {**_AIDED_RUN, "eval_every": 400}
#: the default preset's aided runs: SWITCH_ON_RECIPE for 600 steps (the hand-over gate decides
#: when the true objective takes over; forced at step 400), evaluated every 200 steps
_QUICK_AID = {**SWITCH_ON_RECIPE, "steps": 600, "eval_every": 200, "eval_rows": 500, "decode_rows": 200}
_QUICK_PLAIN = {"steps": 100, "eval_every": 50, "eval_rows": 300, "decode_rows": 100}
#: the full preset's aided runs: the best aid with the phase-boundary sweep's schedule (hand-over
#: forced by step 450, then 250 soft steps under the true objective; 276-482 s a run there)
_PHASE_AID = {**HARD_EM_RECIPE, "hard_em_max_steps": 450, "steps": 700, "eval_every": 350, "eval_rows": 500,
              "decode_rows": 100}
_PHASE_PLAIN = {"steps": 250, "eval_every": 125, "eval_rows": 500, "decode_rows": 100}
_WEIGHTINGS = [w.grid_fields for w in WEIGHTING_REGISTRY.values()]  # plain, distribution, example, token

#: the E2E preset's runs (real text, labels instead of strategies):
#: the shipped base memorized its train split (train NLL 1.13 vs val 2.48 nats/token), so at the
#: prototype's rates (backbone 1e-4, heads 1e-3, 250 steps) neither a label oracle nor the aid
#: learned anything (first_slot oracle 78.02 vs control 78.00 nats/example). The aided runs take
#: the switch-on recipe's rates (backbone 3e-4, latent embeddings 1e-2, the optimal posterior) for
#: 400 steps, with the hard-EM E-step on the first 3 tokens of y (k* = the value that best predicts
#: how the sentence opens): aided distribution z gain 0.74 nats/example over its control, KL 0.91,
#: 3 codes (``zfree study --preset e2e``: analysis/results/study-e2e-gains.csv). Betas: a third of each
#: weighting's predicted boundary beta* (``zfree.experiment.spec.predicted_boundary`` on the shipped
#: E2E reference: plain 0.0333, distribution 0.0129, example 0.0136; token as distribution)
_E2E_AID = {**SWITCH_ON_RECIPE, "n_latent": 4, "hard_em_estep_tokens": 3, "hard_em_max_steps": 240,
            "handover_rows": 200, "steps": 400, "eval_every": 200, "eval_rows": 300, "decode_rows": 3}
_E2E_PLAIN = {"steps": 100, "eval_every": 50, "eval_rows": 300, "decode_rows": 3}
_E2E_BETAS = {"plain": 0.0111, "distribution": 0.0043, "example": 0.0045, "token": 0.0043}
#: the labels whose oracles measure what z could carry on E2E, and the richer joint one
E2E_ORACLES = ("n_sentences", "first_slot", "complete", "n_sentences*first_slot")

# --- the remedies leaderboard --------------------------------------------------------
#: the seeds of every leaderboard cell
LEADERBOARD_SEEDS = (0, 1, 2)
#: every remedy of the synthetic leaderboard's cells inside the predicted boundary
LEADERBOARD_REMEDIES = ("switch_on", "none", "free_bits", "ae+free_bits", "cyclical", "optimus", "gaussian", "bn_vae",
                        "delta_vae")
#: outside the boundary (z should stay unused: a remedy that switches z on there pays more than it gains)
LEADERBOARD_OUTSIDE = ("switch_on", "none", "free_bits")
#: equal compute: every run of a leaderboard the same steps, batch and rates (the switch-on
#: recipe's: backbone 3e-4, heads and latent embeddings 1e-2; on E2E the default 3e-5 / 1e-3 let
#: nothing learn, not even a label oracle), so one z-free control per cell and seed serves every
#: remedy; extra passes counted in forward tokens and wall time (zfree.train.compute); an amortized
#: posterior (the aggressive encoder trains it; switch_on brings its optimal one); evaluated at step
#: 0 and the end. Remedies are listed longest first (the workers finish together) and the oracle
#: takes the first one's recipe
_LB_RATES = {"lr_backbone": SWITCH_ON_RECIPE["lr_backbone"], "lr_new": SWITCH_ON_RECIPE["lr_new"]}
_LB_TRAIN = {"steps": 400, "batch_size": 32, "eval_every": 400, "eval_rows": 300, "decode_rows": 100,
             "posterior_features": "mean_first", **_LB_RATES}
#: betas relative to each weighting's predicted boundary beta* on the shipped benchmark
#: (``spec.predicted_boundary``: plain 0.111, distribution 0.652): inside at ~beta*/3, outside at ~3 beta*
#: the CPU tier (~45 min on 2 cores): every remedy but the aggressive encoder at distribution
#: weighting; at plain weighting the seeds' aid, the baseline, free bits, Optimus and the three
#: Gaussian entries (gaussian, bn_vae, delta_vae; the ~45 min were measured before delta_vae joined,
#: 51 runs of today's 57). The aggressive encoder's inner loops make a run ~10x as long (one seed
#: measured alone at distribution beta = 0.3: 4270 inner steps before its phase ended at step 100,
#: 11.7x the forward tokens and 9.5x the wall time of `none`; README): two CPU-tier runs beside the
#: other studies had not finished after 14 minutes and were stopped. Every remedy x weighting is in the full grid
#: (analysis/sweeps/leaderboard_full_slurm.yaml)
_LB_PLAIN = ("switch_on", "none", "free_bits", "optimus", "gaussian", "bn_vae", "delta_vae")
_LB_CELLS = [({"weighting": "plain", "beta": 0.03}, _LB_PLAIN),
             ({"weighting": "distribution", "beta": 0.3}, LEADERBOARD_REMEDIES),
             ({"weighting": "distribution", "beta": 2.0}, LEADERBOARD_OUTSIDE)]
#: E2E (beta* distribution 0.0129): inside at the e2e preset's beta/3 of beta*, the remedies that
#: apply to its discrete latent; the E2E recipe's E-step on the first 3 tokens for switch_on
_LB_E2E_TRAIN = {"steps": 400, "batch_size": 32, "eval_every": 400, "eval_rows": 300, "decode_rows": 3,
                 "posterior_features": "mean_first", "n_latent": 4, **_LB_RATES}
#: (the aggressive encoder is in the synthetic CPU tier and the full grid only: its inner loops would
#: take ~1 h per E2E run here)
_LB_E2E_REMEDIES = ("switch_on_e2e", "none", "free_bits", "optimus")
_LB_E2E_CELLS = [({"weighting": "distribution", "beta": _E2E_BETAS["distribution"]}, _LB_E2E_REMEDIES)]


def _leaderboard_variants(cells, steps: int) -> list[dict]:
    """One grid variant per (cell, remedy): the cell's weighting/beta with the remedy's fields
    (``zfree.objective.remedies.remedy_fields`` at ``steps``)."""
    out = []
    for cell, names in cells:
        for name in names:
            fields = remedy_fields(name, steps=steps)
            out.append({**cell, **fields})
    return out

PRESETS: dict[str, ExperimentSpec] = {
    "smoke": ExperimentSpec(
        "smoke", description="tiny data, a tiny base model trained on the spot, two short runs", grid={"weighting": ["plain", "distribution"], "beta": [0.3]},
        train={"steps": 12, "batch_size": 16, "eval_every": 6, "eval_rows": 60, "decode_rows": 16,
               "warmup_backbone": 5},
        data=DataSource("synthetic", DataConfig(n_min=3, n_max=6, n_train=600, n_val=60, n_test=20)),
        base=BaseSource("trained", BaseTrainConfig(n_layer=1, n_embd=32, n_head=2, max_steps=150, eval_every=75,
                                                   warmup_steps=20, lr=3e-3, max_minutes=1.0))),
    # both sides of the prediction: every weighting collapses without an aid where
    # theory predicts use; with the aid, distribution, example and token switch on there, and
    # plain at beta = 1, where theory predicts no use, ends with z unused. The aided runs first, so
    # the two workers finish together (<= 10 minutes on 2 cores)
    "default": ExperimentSpec(
        "default", grid={"variant": [
            {"weighting": "distribution", "beta": 0.3, **_QUICK_AID},
            {"weighting": "example", "epsilon": 0.05, "beta": 0.3, **_QUICK_AID},
            # alpha 0.5 keeps every token supervised: at alpha = 1 the tokens the base model already
            # predicts get weight ~0 and the aided run's decoders drifted on them (rho_recon 3.2)
            {"weighting": "token", "token_outer": "distribution", "token_alpha": 0.5, "beta": 0.3, **_QUICK_AID},
            {"weighting": "plain", "beta": 1.0, **_QUICK_AID},
            {"weighting": "plain", "beta": 0.03, **_QUICK_PLAIN},
            {"weighting": "distribution", "beta": 0.3, **_QUICK_PLAIN},
            {"weighting": "example", "epsilon": 0.05, "beta": 0.3, **_QUICK_PLAIN},
            {"weighting": "token", "token_outer": "distribution", "token_alpha": 0.5, "beta": 0.3, **_QUICK_PLAIN},
        ]}, train={"batch_size": 64}),
    # the aids issue: the best aid on both sides of the prediction, the prototype's recipe, and the
    # aids that failed in the prototype (kept so the report shows them failing)
    "aided": ExperimentSpec(
        "aided", grid={"variant": [
            {"weighting": "distribution", "beta": 0.3, **HARD_EM_RECIPE, **_BEST_RUN},
            {"weighting": "distribution", "beta": 0.3, **HARD_EM_RECIPE, **_BEST_RUN, "seed": 1},
            # the posterior that minimizes the objective for the current decoders (no amortized head)
            {"weighting": "distribution", "beta": 0.3, **HARD_EM_RECIPE, **_BEST_RUN, "posterior_features": "optimal"},
            {"weighting": "plain", "beta": 1.0, **HARD_EM_RECIPE, **_BEST_RUN},
            {"weighting": "distribution", "beta": 0.3, "aid": "hard_em_then_soft", "hard_em_max_steps": 600,
             "handover_check_every": 50, "handover_rows": 500, **_AIDED_RUN},
            {"weighting": "distribution", "beta": 0.3, "aid": "beta0_warmup", "warmup_aid_steps": 100,
             "steps": 300, "eval_every": 100, "eval_rows": 500},
            {"weighting": "distribution", "beta": 0.3, "aid": "random_init_jsd", "latent_init_std": 0.02,
             "lambda_jsd": 0.1, "steps": 300, "eval_every": 100, "eval_rows": 500},
        ]}, train={"batch_size": 64}),
    # the complete phase diagram (issue: notebook suite): 4 weightings x 5 betas x {discrete,
    # continuous, discrete + the best aid} = 60 runs; the aided runs first (the longest), so the two
    # workers finish together
    "full": ExperimentSpec(
        "full", grid={"variant": [{"latent_kind": "discrete", **_PHASE_AID}, {"latent_kind": "discrete", **_PHASE_PLAIN},
                                  {"latent_kind": "continuous", **_PHASE_PLAIN}],
                      "weighting": _WEIGHTINGS, "beta": [0.03, 0.1, 0.3, 0.6, 1.0]},
        train={"batch_size": 64}),
    # the real-text benchmark: E2E with its shipped base, every weighting with and without
    # the aid (the aided runs first, so the two workers finish together)
    "e2e": ExperimentSpec(
        "e2e", grid={"variant": [{**w, "beta": _E2E_BETAS[w["weighting"]], **_E2E_AID} for w in _WEIGHTINGS[1:3]]
                     + [{**w, "beta": _E2E_BETAS[w["weighting"]], **_E2E_PLAIN} for w in _WEIGHTINGS]},
        train={"batch_size": 32}, data=DataSource("folder", path=SHIPPED_E2E),
        base=BaseSource("folder", path=SHIPPED_E2E / "base"), oracles=E2E_ORACLES),
    # the remedies leaderboard: every remedy at equal steps and batch, inside the predicted
    # boundary for plain and distribution weighting and outside it for distribution, 3 seeds each,
    # with each seed's z-free control and the strategy oracle
    "leaderboard": ExperimentSpec(
        "leaderboard", description="every remedy x {plain, distribution} inside and outside the predicted boundary, "
                                   "3 seeds, equal compute",
        grid={"variant": _leaderboard_variants(_LB_CELLS, _LB_TRAIN["steps"])}, train=dict(_LB_TRAIN),
        seeds=LEADERBOARD_SEEDS),
    "leaderboard-e2e": ExperimentSpec(
        "leaderboard-e2e", description="the discrete remedies on E2E real text at distribution weighting inside "
                                       "the predicted boundary, 3 seeds, equal compute",
        grid={"variant": _leaderboard_variants(_LB_E2E_CELLS, _LB_E2E_TRAIN["steps"])},
        train=dict(_LB_E2E_TRAIN), data=DataSource("folder", path=SHIPPED_E2E),
        base=BaseSource("folder", path=SHIPPED_E2E / "base"), oracles=("first_slot",), seeds=LEADERBOARD_SEEDS),
}


def run_study(preset: str, out_dir: Path | str, *, retrain_base: bool = False, workers: int | None = None,
              progress: bool = True, estimate: bool = False, overrides: dict | None = None) -> Path:
    """Run a preset end to end into ``out_dir`` (``zfree.experiment.pipeline.run_experiment``);
    returns the path of ``report.html``.

    Writes out_dir/{base/reference/reference.json, runs/<id>/, summary.csv, report.ipynb,
    report.html}. Finished runs are skipped; failed runs are listed and do not stop the others.
    Raises ValueError for an unknown preset (listing the valid ones); LockHeldError when another
    process is preparing the same study folder. ``estimate``: measure and print the grid's cost first
    (``zfree.experiment.estimate.plan``). ``overrides``: flat TrainConfig fields set on every run
    (``zfree study --set``).
    """
    if preset not in PRESETS:
        raise ValueError(f"preset={preset!r} is not one of {sorted(PRESETS)}")
    spec = PRESETS[preset] if not overrides else dataclasses.replace(PRESETS[preset], overrides=dict(overrides))
    return run_experiment(spec, out_dir, retrain_base=retrain_base, workers=workers,
                          progress=progress, estimate=estimate).html
