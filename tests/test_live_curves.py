"""Live curves (zfree_lab.run.live_curves): a run's TensorBoard event file holds every numeric key of
every metrics.jsonl row at the same step; ``tensorboard=False`` writes none; the option is no part
of a run's identity (its id, the same-config check)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.tiny import tiny_flat
from zfree.config import TrainConfig
from zfree.core.io import read_jsonl
from zfree_lab.run.live_curves import EVENT_GLOB, scalars
from zfree_lab.run.run_folder import check_same_config
from zfree_lab.run.training import train_cvae
from zfree_lab.experiment.spec import run_id


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


def _wandb_history(run_file) -> list[tuple[int, dict]]:
    """(step, {key: value}) of every history record of a W&B offline ``.wandb`` file: its 7-byte header
    (``:W&B``, magic 0xBEE1, version 0), then LevelDB's log format (32 KiB blocks of records, each
    a 7-byte header: CRC32C, little-endian length, type 1 full / 2 first / 3 middle / 4 last), each
    whole record one ``wandb_internal_pb2.Record``."""
    import json

    from wandb.proto import wandb_internal_pb2 as pb

    raw = run_file.read_bytes()
    assert raw[:4] == b":W&B" and raw[4:6] == b"\xe1\xbe", raw[:7]
    records, part, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(raw):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(raw[pos + 4: pos + 6], "little"), raw[pos + 6]
        if length == 0 and kind == 0:
            break
        part += raw[pos + 7: pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            records.append(part)
            part = b""
    out = []
    for data in records:
        r = pb.Record()
        r.ParseFromString(data)
        if r.WhichOneof("record_type") == "history":
            row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            out.append((r.history.step.num, {k: v for k, v in row.items() if not k.startswith("_")}))
    return out


def test_wandb_offline_run_holds_every_metrics_row_at_its_step_and_is_log_only(tiny_run, tmp_path):
    pytest.importorskip("wandb")
    data, base = tiny_run
    flat = tiny_flat(data, base, device="cpu")
    run = tmp_path / "study" / "runs" / "distribution_beta0.3_abc"
    train_cvae(TrainConfig.from_flat({**flat, "wandb": "offline", "tensorboard": False}), run, progress=False)
    rows = read_jsonl(run / "metrics.jsonl")
    files = list((run / "wandb").glob("offline-run-*/run-distribution_beta0-3_abc.wandb"))
    assert len(files) == 1 and not list(run.glob(EVENT_GLOB))
    history = _wandb_history(files[0])
    assert [s for s, _ in history] == [r["step"] for r in rows] == [0, 2, 4]
    for (_, logged), r in zip(history, rows):
        want = scalars(r)
        assert set(logged) == set(want) and "loss/val/reconstruction_loss" in logged
        assert all(logged[k] == want[k] or (math.isnan(want[k]) and logged[k] in ("NaN", None) or
                                            isinstance(logged[k], float) and math.isnan(logged[k]))
                   for k in want), r["step"]
    assert run_id({**flat, "wandb": "offline"}) == run_id(flat)


def test_wandb_offline_without_the_package_is_a_one_line_config_error(tiny_run, tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_wandb(name, *a, **k):
        if name == "wandb":
            raise ImportError("No module named 'wandb'")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    data, base = tiny_run
    from zfree.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"wandb='offline' needs the wandb package"):
        train_cvae(TrainConfig.from_flat({**tiny_flat(data, base, device="cpu"), "wandb": "offline"}),
                   tmp_path / "run", progress=False)


def test_wandb_file_is_complete_when_close_returns_even_if_the_service_closes_it_late(tmp_path, monkeypatch):
    """W&B's finish() only tells its service process to close the run's files (a message with no reply),
    so a reader right after finish() could see a file still without its records (issue 61: the test above
    flaked under load). Here the service hears that message late: never before the service is joined."""
    pytest.importorskip("wandb")
    from wandb.sdk.lib.service.service_connection import ServiceConnection

    from zfree_lab.run.live_curves import LiveCurves, open_wandb

    monkeypatch.setattr(ServiceConnection, "inform_finish", lambda self, run_id: None)
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    curves = LiveCurves(wandb_run=open_wandb(run, {"steps": 4}))
    rows = [{"step": s, "loss": 1.0 / (s + 1), "kl": float(s)} for s in (0, 2, 4)]
    for r in rows:
        curves.log(r["step"], r)
    curves.close()
    (file,) = (run / "wandb").glob("offline-run-*/run-r.wandb")
    assert _wandb_history(file) == [(r["step"], scalars(r)) for r in rows]
