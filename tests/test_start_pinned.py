"""``analysis/studies/start_pinned.sh`` and the preregistered studies' ``start.sh``: a study is (re)started on
the exact code it runs on — a checkout of the pinned commit plus the patch its DEVIATIONS.md names — and a
checkout that holds anything else is refused (exit 2, one line), so a replaced machine restarts the study on
the same code. Run in a clone of this repository (its history holds the pinned commits); skipped outside git."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PINS = {"factorial-smollm2": "e04a751", "oracle-smollm2": "5019e35"}


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git clone")
    for commit in PINS.values():
        if subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"],
                          capture_output=True).returncode:
            pytest.skip(f"{commit} is not in this clone's history")
    dst = tmp_path_factory.mktemp("pinned") / "repo"
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(ROOT), str(dst)], check=True)
    subprocess.run(["git", "-C", str(dst), "checkout", "-q", "HEAD"], check=True)
    for rel in ("analysis/studies/start_pinned.sh", *(f"analysis/results/{s}/start.sh" for s in PINS),
                "analysis/results/factorial-smollm2/code.patch"):  # the files under test, as they are here
        shutil.copy2(ROOT / rel, dst / rel)
    return dst


def _start(clone: Path, study: str, checkout: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "START_PINNED_CHECK_ONLY": "1"}
    return subprocess.run(["bash", str(clone / "analysis" / "results" / study / "start.sh"), str(checkout),
                           str(checkout.parent / "study")], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("study", sorted(PINS))
def test_a_study_starts_on_its_pinned_code_and_refuses_a_checkout_holding_other_code(clone, tmp_path, study):
    checkout = tmp_path / "ckout"
    first = _start(clone, study, checkout)
    assert first.returncode == 0, first.stderr
    head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert head.startswith(PINS[study])
    if study == "factorial-smollm2":  # the patch's fixes are in the checkout: the preset's fine-tune reaches the study
        assert "def own_base" in (checkout / "src/zfree_lab/experiment/own_study.py").read_text()
        assert (checkout / "src/zfree_lab/run/base_checkpoint.py").is_file()
    again = _start(clone, study, checkout)  # a second start finds the same code
    assert again.returncode == 0, again.stderr
    with open(checkout / "README.md", "a") as f:
        f.write("changed\n")
    refused = _start(clone, study, checkout)
    assert refused.returncode == 2
    assert refused.stderr.strip().count("\n") == 0 and "does not hold" in refused.stderr
    subprocess.run(["git", "-C", str(clone), "worktree", "remove", "--force", str(checkout)], check=True)
