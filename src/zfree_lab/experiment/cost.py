"""The cost model of an estimate: a run's and a grid's wall seconds from what a probe measured
(``zfree_lab.experiment.probe.Probe``; the model is described in ``zfree_lab.experiment.estimate``).
Pure arithmetic on the configs, except ``train_scoring_seconds`` (reads the reference's record). The
memory a model's size alone rules out is ``zfree_lab.experiment.memory_floor``."""

from __future__ import annotations

import json
import math
from pathlib import Path

from zfree.config import TrainConfig
from zfree_lab.experiment.probe import Probe
from zfree_lab.experiment.spec import Point

#: seconds a study's run spends starting its papermill kernel and notebook beyond what a probe's
#: ``zfree train`` child measures (leaderboard study: notebook written 4-6 s after the run's own wall_s)
KERNEL_START_S = 5.0
#: an aggressive-encoder run's cost in K-way steps per step (He et al. 2019's inner posterior steps):
#: its forward tokens over a plain run's, measured 11.3x [11.0, 11.7] on the synthetic leaderboard
#: (distribution beta 0.3, 3 seeds: analysis/results/leaderboard-aggressive-distribution.json)
AGGRESSIVE_STEP_FACTOR = 11.3


def _n_evals(steps: int, every: int) -> int:
    return 1 + len(set(range(every, steps + 1, every)) | {steps})


def run_seconds(params: dict, pr: Probe, n_val: int) -> float:
    """Estimated wall seconds of one run (module docstring): setup + kernel start + steps x step +
    evaluated rows x row; a control's or oracle's steps and rows at the probe's ``given_*`` times,
    except an oracle's row over n label values, at the K-way row's time per value x n (its evaluation
    scores every value: SmolLM2, 7 values, 1.29-1.33 s a row against 0.345 s for the control's and
    0.733 s for K = 4; docs/results/real-models.md),
    a hard-EM step at one given step + a third of a K-way step, an aggressive-encoder run's steps at
    ``AGGRESSIVE_STEP_FACTOR`` K-way steps each; where the run decodes, the probe's samples seconds
    per evaluation and multi-reference seconds once."""
    c = TrainConfig.from_flat(params)
    o, a = c.optim, c.aid
    given = c.model.latent_source != "posterior"
    soft = pr.step_s * o.batch_size / pr.batch_size
    one = (pr.step_s if pr.given_step_s is None else pr.given_step_s) * o.batch_size / pr.batch_size
    row = pr.given_eval_row_s if given and pr.given_eval_row_s is not None else pr.eval_row_s
    values = c.model.n_latent
    if given and values > 1 and pr.n_latent > 0:  # a label oracle (or its null): each row scores every value
        row = max(row, pr.eval_row_s * values / pr.n_latent)
    rows = min(o.eval_rows or n_val, n_val)
    evals = _n_evals(o.steps, o.eval_every) * rows
    hard = 0
    if a.aid == "hard_em_then_soft":
        hard = min(a.hard_em_max_steps, o.steps)
        evals += (hard // max(1, a.handover_check_every)) * min(a.handover_rows or n_val, n_val)
    step_time = o.steps * one if given else hard * (one + soft / 3) + (o.steps - hard) * soft
    if a.aid == "aggressive_encoder":
        step_time *= AGGRESSIVE_STEP_FACTOR
    decode = 0.0
    if o.decode_rows:  # the probe measured 0 where this data or latent decodes nothing
        samples = pr.given_samples_s if given and pr.given_samples_s is not None else pr.samples_s
        decode = _n_evals(o.steps, o.eval_every) * samples + (
            pr.given_decode_s if given and pr.given_decode_s is not None else pr.decode_s)
    return pr.setup_s + KERNEL_START_S + step_time + evals * row + decode


def grid_seconds(points: list[Point], pr: Probe, n_val: int, workers: int) -> float:
    """The grid's wall seconds: each point, in order, on the first free of ``workers`` workers. A
    point that needs b on the training rows (``needs_example_b``) and starts before the first such
    point has scored and cached them pays ``pr.train_scoring_s`` as well."""
    free = [0.0] * max(1, workers)
    scored = math.inf  # when the training rows' scores are in the cache
    for p in points:
        i = free.index(min(free))
        start, secs = free[i], run_seconds(p.params, pr, n_val)
        if pr.train_scoring_s and start < scored and TrainConfig.from_flat(p.params).objective.needs_example_b:
            secs += pr.train_scoring_s
            scored = min(scored, start + pr.setup_s + KERNEL_START_S + pr.train_scoring_s)
        free[i] += secs
    return max(free)


def train_scoring_seconds(points: list[Point]) -> float:
    """``Probe.train_scoring_s`` for ``points``: the training rows x the seconds a row the
    preparation's validation scoring took (``base_dir/reference/reference.json``: ``scoring_s``
    over its rows, written by ``zfree_lab.experiment.sources.write_reference``); 0 when no point needs
    b on training rows or the rate is not recorded."""
    if not any(TrainConfig.from_flat(p.params).objective.needs_example_b for p in points):
        return 0.0
    params = points[0].params
    rj = Path(params["base_dir"]) / "reference" / "reference.json"
    try:
        meta = json.loads(rj.read_text())
        rate = float(meta["scoring_s"]) / int(meta["n_rows"])
        n_train = sum(1 for _ in open(Path(params["data_dir"]) / "train.jsonl", encoding="utf-8"))
    except (OSError, KeyError, TypeError, ValueError, ZeroDivisionError):
        return 0.0
    return rate * n_train

