"""A tiny finished sweep (four real CVAE runs of a few steps on the tiny base run), built once
per pytest session under its base temp folder and shared by the plotting/widget/notebook tests."""

from __future__ import annotations

from pathlib import Path

from tests.tiny import make_tiny_run, tiny_flat
from zfree.config import TrainConfig
from zfree_lab.experiment.spec import expand_grid

GRID = {"objective": [{"weighting": "plain"}, {"weighting": "distribution"}, {"weighting": "example", "epsilon": 0.05}],
        "beta": [0.3, 1.0]}


def tiny_base_flat(data: Path, base: Path, **kw) -> dict:
    """``tests.tiny.tiny_flat`` (4 steps, evaluations every 2) on the CPU."""
    return tiny_flat(data, base, **{"device": "cpu", **kw})


def make_tiny_sweep(tmp_path_factory) -> Path:
    """Returns a sweep folder: runs/<run_id>/ for plain, distribution, example x beta {0.3, 1}."""
    from zfree_lab.run.training import train_cvae

    root = tmp_path_factory.getbasetemp() / "tiny_sweep"
    sweep = root / "sweep"
    if (sweep / ".done").exists():
        return sweep
    data, base = make_tiny_run(root)
    for p in expand_grid(tiny_base_flat(data, base), GRID):
        train_cvae(TrainConfig.from_flat(p.params), sweep / "runs" / p.run_id, progress=False)
    (sweep / ".done").touch()
    return sweep
