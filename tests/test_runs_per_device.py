"""Many runs on one accelerator: a run records its device memory, the estimate fits runs per device from
the probe's, ``--workers`` counts runs per CUDA device, and each local worker gets one device. CUDA is
simulated (this machine has none): the device counts and the probe's reading are given, the arithmetic
and the process set-up are real."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from zfree.config import TrainConfig
from zfree.core.errors import ConfigError
from zfree_lab.run.run_folder import TIMING_KEYS, device_memory
from zfree_lab.experiment import estimate as est
from zfree_lab.experiment import devices, executor
from zfree_lab.experiment.own_study import OWN_PRESETS
from zfree_lab.experiment.spec import expand_grid

GB = est.GB
SMALL = {"steps": 4, "batch_size": 8, "eval_every": 2, "n_latent": 3}


def _probe(device_peak: int, device_total: int = 140 * GB):
    return est.Probe(setup_s=10.0, step_s=0.05, eval_row_s=0.01, peak_rss=3 * GB, batch_size=8,
                     device_peak=device_peak, device_total=device_total)


def test_a_cpu_run_records_no_device_memory_and_the_keys_are_timings():
    assert device_memory(torch.device("cpu")) == {}
    # a resumed run's device peak differs from an uninterrupted one's, like its wall time
    assert {"compute/device_peak_bytes", "compute/device_total_bytes"} <= set(TIMING_KEYS)


@pytest.mark.parametrize("asked,devices,expected", [(9, 1, 9), (20, 1, 11), (9, 2, 18), (20, 2, 22)])
def test_runs_per_device_are_what_its_memory_holds(asked, devices, expected):
    # 10 GB reserved + 0.5 GB of context: floor(0.85 x 140 / 10.5) = 11 a device
    w, said = est.fit_device(_probe(10 * GB), asked, devices)
    assert w == expected
    assert f"{expected // devices} on each of {devices} device(s)" in said[0]
    assert ("11 fit" in said[0]) == (asked > 11)


def test_a_run_that_no_device_holds_is_refused_in_one_line_naming_its_need():
    with pytest.raises(ConfigError) as e:
        est.fit_device(_probe(130 * GB), 4, 1)
    msg = str(e.value)
    assert "\n" not in msg and "130.5 GB of device memory" in msg and "140.0 GB" in msg and "micro_batch" in msg


def test_a_cpu_probe_leaves_the_workers_as_asked():
    assert est.fit_device(_probe(0, 0), 5, 2) == (5, [])
    assert est.fit_device(_probe(10 * GB), 5, 0) == (5, [])


def test_plan_on_a_device_counts_workers_per_device_and_says_why(tmp_path, monkeypatch):
    """The probe ran on CUDA: the plan runs ``workers`` a device on both devices, capped by the device's
    memory, and by the host's memory (fit_memory) where that is smaller."""
    monkeypatch.setattr(est, "probe", lambda point, work, micro_batch=None, ceiling=None, deadline=None:
                        _probe(30 * GB))  # 30.5 GB a run: floor(0.85 x 140 / 30.5) = 3 a device
    monkeypatch.setattr(est, "memory_limit", lambda: 128 * GB)
    monkeypatch.setattr(est, "device_count", lambda: 2)
    points = expand_grid({**TrainConfig().to_flat(), **SMALL}, {"beta": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]})
    plan = est.plan(OWN_PRESETS["own"], lambda s: points, tmp_path, workers=5)
    assert plan.workers == 6  # 3 a device x 2 devices (5 a device asked)
    assert any("device memory: 6 run(s) at once, 3 on each of 2 device(s)" in line for line in plan.lines)
    # the host holds fewer: 0.85 x 16 GB - this process over 3 GB a run
    monkeypatch.setattr(est, "memory_limit", lambda: 16 * GB)
    small = est.plan(OWN_PRESETS["own"], lambda s: points, tmp_path, workers=5)
    assert small.workers < 6 and any(line.startswith("memory:") for line in small.lines)


def test_workers_mean_runs_per_cuda_device(monkeypatch):
    monkeypatch.setattr(devices, "cuda_devices", lambda: ["0", "1"])
    assert devices.runs_at_once(3, "auto") == 6
    assert devices.runs_at_once(3, "cuda") == 6
    assert devices.runs_at_once(3, "cuda:1") == 3  # pinned to one device
    assert devices.runs_at_once(3, "cpu") == 3
    monkeypatch.setattr(devices, "cuda_devices", lambda: [])
    assert devices.runs_at_once(3, "auto") == 3


def test_cuda_devices_follow_cuda_visible_devices(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert devices.cuda_devices() == ["3", "5"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert devices.cuda_devices() == ["0", "1"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert devices.cuda_devices() == []


def test_each_local_worker_takes_the_next_device():
    """The pool's initializer, in a child process of its own (it ignores SIGINT and ties the process to
    its parent): workers started one after another get devices a, b, a, b; with one device none is set."""
    code = """
import json, multiprocessing, os
from zfree_lab.experiment.executor import _worker_init
slot, seen = multiprocessing.Value("i", 0), []
for _ in range(4):
    _worker_init(os.getppid(), slot, ("a", "b"))
    seen.append(os.environ["CUDA_VISIBLE_DEVICES"])
os.environ.pop("CUDA_VISIBLE_DEVICES")
_worker_init(os.getppid(), multiprocessing.Value("i", 0), ("a",))
seen.append(os.environ.get("CUDA_VISIBLE_DEVICES"))
print(json.dumps(seen))
"""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == ["a", "b", "a", "b", None]


def test_a_probe_record_without_device_fields_still_loads():
    rec = {k: v for k, v in _probe(0, 0).__dict__.items() if k not in ("device_peak", "device_total")}
    assert est.Probe(**rec).device_peak == 0
