"""The main job: data -> base run -> CVAE grid (papermill) -> summary.csv -> report.html.

The presets are data: one YAML spec each in ``analysis/studies/presets/`` (``zfree study --help``
lists them, ``zfree_lab.experiment.catalog``), each file commented with what it runs and why:

  smoke    tiny data, a tiny base model trained on the spot, two short runs (< 2 minutes; tests).
  default  the shipped benchmark and base run: each weighting without and with the switch-on recipe,
           on both sides of the predicted boundary (<= 10 minutes on 2 cores).
  aided    the aids issue: the best aid on both sides of the prediction and the aids that fail.
  full     the complete phase diagram (hours).
  e2e      real text: data/e2e with its shipped base at a third of each weighting's predicted boundary.
  leaderboard, leaderboard-e2e   the remedies at equal compute, 3 seeds.

``PRESETS`` holds those whose data and base are ready to run; the presets of your own model and data
(``base: {kind: pretrained}``) are ``zfree_lab.experiment.own_study.OWN_PRESETS``. Rerunning any preset
skips finished work.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from zfree_lab.experiment.pipeline import run_experiment
from zfree_lab.experiment.spec import ExperimentSpec
from zfree_lab.experiment.spec_file import shipped_presets

#: the presets that run as they are: name -> its spec (``analysis/studies/presets/<name>.yaml``)
PRESETS: dict[str, ExperimentSpec] = {n: s for n, s in shipped_presets().items() if s.base.kind != "pretrained"}


def run_study(preset: str, out_dir: Path | str, *, retrain_base: bool = False, workers: int | None = None,
              progress: bool = True, estimate: bool = False, overrides: dict | None = None,
              seeds: tuple[int, ...] | None = None, started: float | None = None, render: bool = True) -> Path:
    """Run a preset end to end into ``out_dir`` (``zfree_lab.experiment.pipeline.run_experiment``);
    returns the path of ``report.html`` (the study folder with ``render=False``: ``zfree study --no-report``,
    the tables written, no report).

    Writes out_dir/{base/reference/reference.json, runs/<id>/, summary.csv, report.ipynb,
    report.html}. Finished runs are skipped; failed runs are listed and do not stop the others.
    Raises ValueError for an unknown preset (listing the valid ones); LockHeldError when another
    process is preparing the same study folder. ``estimate``: measure and print the grid's cost first
    (``zfree_lab.experiment.estimate.plan``). ``overrides``: flat TrainConfig fields set on every run
    (``zfree study --set``). ``seeds``: every run, control and oracle once per seed (``zfree study
    --seeds``; replaces the preset's own), paired by seed in ``seed_gains.csv``. ``started``: when the
    command began, as ``run_experiment``.
    """
    if preset not in PRESETS:
        raise ValueError(f"preset={preset!r} is not one of {sorted(PRESETS)}")
    spec = PRESETS[preset] if not overrides else dataclasses.replace(PRESETS[preset], overrides=dict(overrides))
    if seeds is not None:
        spec = dataclasses.replace(spec, seeds=tuple(seeds))
    done = run_experiment(spec, out_dir, retrain_base=retrain_base, workers=workers, progress=progress,
                          estimate=estimate, started=started, render=render)
    return done.html if render else done.out
