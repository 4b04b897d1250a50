"""The GPU session's script (issue 56, item 5: analysis/benchmarks/gpu_session.sh) in its CPU dry run: every
stage runs its steps on tiny random Llama models and writes the tables a lent GPU would fill."""

from __future__ import annotations

import pytest

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # ~80 s: the slow tier (make test-slow)
def test_the_gpu_session_script_dry_runs_on_the_cpu(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "PYTHONPATH": str(ROOT / "src")}
    res = subprocess.run(["bash", "analysis/benchmarks/gpu_session.sh", "--tiny"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    log = (tmp_path / "run.log").read_text()
    assert log.rstrip().endswith("done") and "skip" not in log and log.count("rc 0") == 4, log[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "large_steps.jsonl").read_text().splitlines()]
    assert len(rows) == 6 + 6 + 2 + 1 and not [r for r in rows if "error" in r]
    assert {(r["kind"], r["precision"]) for r in rows} >= {(k, p) for k in ("control", "soft", "hard_em")
                                                           for p in ("fp32", "bf16")}
    assert all(r["s_per_step"] > 0 and r["gflop_per_step"] > 0 and r["tokens_s"] > 0 for r in rows)
    assert (tmp_path / "large_steps.txt").read_text().count("s/step") == 4
