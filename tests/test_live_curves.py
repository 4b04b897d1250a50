"""Live curves (zfree.train.live_curves): a run's TensorBoard event file holds every numeric key of
every metrics.jsonl row at the same step; ``tensorboard=False`` writes none; the option is no part
of a run's identity (its id, the same-config check)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.tiny import tiny_flat
from zfree.config import TrainConfig
from zfree.core.io import read_jsonl
from zfree.experiment.spec import run_id
from zfree.train.live_curves import EVENT_GLOB, scalars
from zfree.train.run_folder import check_same_config
from zfree.train.training import train_cvae


def _event_scalars(run) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(run))
    ea.Reload()
    return {tag: [(e.step, e.value) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}


def test_event_file_holds_every_metrics_row_at_its_step(tiny_run, tmp_path):
    pytest.importorskip("tensorboard")
    data, base = tiny_run
    run = tmp_path / "run"
    train_cvae(TrainConfig.from_flat(tiny_flat(data, base, device="cpu")), run, progress=False)
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 2, 4] and len(list(run.glob(EVENT_GLOB))) == 1
    want: dict[str, list[tuple[int, float]]] = {}
    for r in rows:  # TensorBoard stores float32: the row's value rounded to it
        for tag, v in scalars(r).items():
            want.setdefault(tag, []).append((r["step"], float(np.float32(v))))
    got = _event_scalars(run)
    assert set(got) == set(want) and "loss/val/reconstruction_loss" in got
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    study = EventMultiplexer().AddRunsFromDirectory(str(tmp_path))  # what `tensorboard --logdir` lists
    assert list(study.Runs()) == ["run"]
    for tag, events in got.items():
        assert [s for s, _ in events] == [s for s, _ in want[tag]], tag
        assert all(v == w or (math.isnan(v) and math.isnan(w)) for (_, v), (_, w) in zip(events, want[tag])), tag


def test_tensorboard_off_writes_no_event_file_and_is_no_part_of_a_runs_identity(tiny_run, tmp_path):
    data, base = tiny_run
    flat = tiny_flat(data, base, device="cpu", steps=2, eval_every=2)
    run = tmp_path / "run"
    train_cvae(TrainConfig.from_flat({**flat, "tensorboard": False}), run, progress=False)
    assert (run / "summary.json").exists() and not list(run.glob(EVENT_GLOB))
    assert run_id({**flat, "tensorboard": False}) == run_id({**flat, "tensorboard": True})
    check_same_config(run, TrainConfig.from_flat({**flat, "tensorboard": True}))  # no ResumeRefusedError


def test_scalars_are_the_numeric_keys_but_step():
    row = {"step": 3, "a": 1.5, "b": 2, "c": True, "d": None, "e": "x", "f": float("nan"), "g": [1]}
    got = scalars(row)
    assert list(got) == ["a", "b", "c", "f"] and got["c"] == 1.0 and math.isnan(got["f"])
