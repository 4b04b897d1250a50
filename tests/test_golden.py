"""Behaviour pins of the structure redesign (issue 12): the golden runs (``tests/golden_runs.py``:
the smoke study's two runs, one hard-EM, one continuous and one optimal-posterior run) are trained
again and their summary.json and metrics.jsonl must equal tests/golden/*.json.

Comparison: EXACT, every key and every float to the last bit (after a JSON round trip; NaN
spelled 'nan'), timing keys (``training.TIMING_KEYS``) and the machine-specific data_dir/base_dir
aside. The redesign moved code without changing any float reduction order, so no tolerance is
needed on this machine's CPU build of torch; a different torch build or CPU may reorder its own
reductions, and then this test, not the code, is what to regenerate (``python -m tests.golden_runs``).
About 15 s of CPU.
"""

from __future__ import annotations

import json

import pytest

from tests.golden_runs import GOLDEN, generate, normalized


def _diff(a, b, path=""):
    """Paths where two JSON values differ (for a readable failure)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [p for k in sorted(set(a) | set(b)) for p in _diff(a.get(k, "<missing>"), b.get(k, "<missing>"),
                                                                    f"{path}/{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [p for i, (x, y) in enumerate(zip(a, b)) for p in _diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: golden {a!r} != now {b!r}"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return normalized(generate(tmp_path_factory.mktemp("golden")))


@pytest.mark.parametrize("name", sorted(p.stem for p in GOLDEN.glob("*.json")))
def test_golden_run_is_unchanged(runs, name):
    golden = json.loads((GOLDEN / f"{name}.json").read_text())
    diff = _diff(golden, runs[name])
    assert not diff, f"{name}: {len(diff)} differences, first: " + "; ".join(diff[:8])


def test_every_golden_run_is_pinned(runs):
    assert sorted(runs) == sorted(p.stem for p in GOLDEN.glob("*.json"))
