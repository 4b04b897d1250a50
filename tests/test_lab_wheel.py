"""``zfree lab`` from a wheel install, in a real browser (issue 60; slow tier, run by ``make test-lab``):
the wheel built and installed with its ``lab`` extra in a fresh venv (``tests.test_wheel``), a study
written by that install with ``--out DIR``, then ``zfree lab DIR`` typed in an empty folder. Driven
through Playwright and the system Chromium as a researcher would: explore.ipynb (copied out of the
wheel into ./zfree-lab) opens, its kernel starts, the explorer shows the study given and a figure,
and a one-run launch from the panel ends ``done: 1/1 ok`` with the run in ``DIR/launched``.

Only the command line and the wheel are used, never the clone's modules. Needs what
tests/lab_page.py needs (Playwright for Python, Chromium at ``$ZFREE_CHROMIUM`` or
/usr/bin/chromium) and what tests/test_wheel.py needs (torch==2.13.0 installable). A failing test
leaves ``failure-<test>.png`` beside the server's log (``lab.log``) in its tmp folder; ``ZFREE_SCREENSHOTS=DIR`` keeps a
screenshot of the explorer and of the launch panel.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.lab_page import CHROMIUM, Lab, browser_or_skip, free_port, lab_settings, open_notebook, run_all
from tests.test_wheel import _check, _run, install_wheel_venv

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]  # the build, two installs, a study, a lab
#: the finished runs the explorer counts in a smoke study: its grid, plain and distribution at one β
#: (analysis/studies/presets/smoke.yaml; its z-free controls and oracles are not counted)
SMOKE_RUNS = 2


def _wait_for_server(proc: subprocess.Popen, url: str, log: Path, timeout_s: float = 300) -> None:
    """Poll ``url`` until it answers 200; RuntimeError with the server's log if the process ends or
    ``timeout_s`` passes first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"zfree lab exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        time.sleep(1)
    raise RuntimeError(f"zfree lab did not answer {url} within {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")


@contextlib.contextmanager
def _shot_on_failure(page, folder: Path, name: str):
    """A screenshot of the whole page as ``folder/failure-<name>.png`` when the block raises."""
    try:
        yield
    except BaseException:
        path = folder / f"failure-{name}.png"
        with contextlib.suppress(Exception):
            page.screenshot(path=str(path), full_page=True)
            print(f"screenshot of the page: {path}; the server's log: {folder / 'lab.log'}")
        raise


@pytest.fixture(scope="module")
def wheel_lab(tmp_path_factory):
    """(Lab on explore.ipynb run in the wheel's ``zfree lab``, the study folder, the tmp folder);
    ``Lab.dirty_after_open``: the notebook tabs marked unsaved once its kernel was up and several
    autosave intervals passed; ``Lab.status_after_open``: whether explore.ipynb's file was then as
    copied ("same") or rewritten ("changed": an autosave of a notebook marked unsaved)."""
    sync_api, shots = browser_or_skip()
    tmp = tmp_path_factory.mktemp("lab-wheel")
    bin_dir, elsewhere, env = install_wheel_venv(tmp, extra="lab")
    study = tmp / "studies" / "smoke"
    _check(_run([bin_dir / "zfree", "study", "--preset", "smoke", "--no-estimate", "--out", study], elsewhere, env),
           "zfree study --preset smoke")
    home = tmp / "home"  # where the researcher types `zfree lab DIR`: empty, no runs/
    home.mkdir()
    port, token = free_port(), "zfree-wheel-test"
    log = tmp / "lab.log"
    lab_env = {**env, "JUPYTER_TOKEN": token, "JUPYTERLAB_SETTINGS_DIR": str(lab_settings(tmp / "lab-settings"))}
    lab_env.pop("ZFREE_STUDY", None)
    with log.open("w") as out:
        proc = subprocess.Popen([str(bin_dir / "zfree"), "lab", str(study), "--no-browser", "--ip", "127.0.0.1",
                                 "--port", str(port)], cwd=home, env=lab_env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_for_server(proc, f"http://127.0.0.1:{port}/api/status?token={token}", log)
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            lab = Lab(page, home / "zfree-lab", proc, shots, sync_api.TimeoutError)
            with _shot_on_failure(page, tmp, "setup"):
                copied = (lab.clone / "explore.ipynb").read_bytes()
                open_notebook(page, f"http://127.0.0.1:{port}/lab/tree/explore.ipynb?token={token}",
                              kernel_timeout_s=180)  # autosaves have passed
                lab.dirty_after_open = page.locator(".lm-TabBar-tab.jp-mod-dirty").count()
                lab.status_after_open = "same" if (lab.clone / "explore.ipynb").read_bytes() == copied else "changed"
                run_all(lab)
            yield lab, study, tmp
            browser.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def test_zfree_lab_from_the_wheel_opens_the_explorer_on_the_study_given(wheel_lab, request):
    lab, study, tmp = wheel_lab
    with _shot_on_failure(lab.page, tmp, request.node.name):
        # the notebooks copied out of the wheel into the folder it was typed in, nothing else there
        assert (lab.clone / "explore.ipynb").is_file() and sorted(p.name for p in lab.clone.parent.iterdir()) == \
            ["zfree-lab"]
        # the contents manager zfree lab names: opening marks nothing unsaved, so nothing is autosaved
        assert (lab.dirty_after_open, lab.status_after_open) == (0, "same")
        lab.text(rf"^study {re.escape(str(study.resolve()))}: {SMOKE_RUNS} finished runs, 0 failed$")
        lab.text(rf"^{SMOKE_RUNS} finished runs, 0 failed; showing {SMOKE_RUNS}$")  # the explorer draws them
        assert lab.figure.get_attribute("src").startswith("data:image/png")
        lab.figure.scroll_into_view_if_needed()
        lab.shot("wheel_explorer", lab.explorer)


def test_a_launch_from_the_wheel_lab_finishes(wheel_lab, request):
    lab, study, tmp = wheel_lab
    with _shot_on_failure(lab.page, tmp, request.node.name):
        lab.set_launch(n_beta=1, steps=4)
        lab.shot("wheel_launch_panel", lab.panel)
        assert lab.launch() == "done: 1/1 ok"
        (summary,) = (study / "launched" / "runs").glob("*/summary.json")
        s = json.loads(summary.read_text())
        assert s["steps"] == 4 and math.isfinite(s["loss/val/kl_prior_loss"]), s
        lab.text(rf"^{SMOKE_RUNS + 1} finished runs, 0 failed; showing {SMOKE_RUNS + 1}$")  # the explorer counts it
        lab.shot("wheel_after_launch")
