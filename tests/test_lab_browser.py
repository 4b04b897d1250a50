"""JupyterLab in a real browser (slow tier): in a fresh clone with the notebook filter, start
JupyterLab from the project's environment, open explore.ipynb, run all cells, change the
weighting and β widgets and check the figure changed, launch a one-run sweep from the panel and
wait for "done", save, stop the server; ``git status`` is clean afterwards.

Needs Playwright for Python (the test extra) and a system Chromium at ``$ZFREE_CHROMIUM`` or
/usr/bin/chromium (Debian package ``chromium``; ``playwright install`` is not used). Set
``ZFREE_SCREENSHOTS=DIR`` to keep a screenshot of each explorer figure and of the launch panel.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.test_lab import _git, make_lab_clone
from tests.tiny_sweep import make_tiny_sweep

CHROMIUM = os.environ.get("ZFREE_CHROMIUM", "/usr/bin/chromium")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_lab(clone: Path, port: int, token: str) -> subprocess.Popen:
    args = [str(Path(sys.prefix) / "bin" / "jupyter"), "lab", "--ServerApp.root_dir=notebooks", "--no-browser",
            "--ip=127.0.0.1", f"--port={port}", f"--IdentityProvider.token={token}"]
    if os.geteuid() == 0:
        args.append("--allow-root")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "JUPYTER_CONFIG_PATH": str(clone / "etc" / "jupyter")}  # as `make lab` sets it
    proc = subprocess.Popen(args, cwd=clone, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(120):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=2)
            return proc
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {proc.returncode}")
            time.sleep(1)
    proc.terminate()
    raise RuntimeError("jupyter lab did not answer within 120 s")


def test_explore_notebook_in_jupyterlab(tmp_path_factory, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e .[test])")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set ZFREE_CHROMIUM)")
    shots = Path(os.environ["ZFREE_SCREENSHOTS"]) if os.environ.get("ZFREE_SCREENSHOTS") else None
    if shots:
        shots.mkdir(parents=True, exist_ok=True)
    clone = make_lab_clone(tmp_path, make_tiny_sweep(tmp_path_factory))
    port, token = _free_port(), "zfree-test"
    lab = _start_lab(clone, port, token)
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            page.goto(f"http://127.0.0.1:{port}/lab/tree/explore.ipynb?token={token}")
            page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=120_000)
            page.get_by_text(re.compile(r"\| Idle$")).first.wait_for(timeout=120_000)  # the kernel is up
            news = page.get_by_role("button", name="No", exact=True)  # JupyterLab's news prompt
            if news.count():
                news.first.click()
            page.get_by_role("menuitem", name="Run", exact=True).click()
            page.locator(".lm-Menu-itemLabel").filter(has_text=re.compile(r"^Run All Cells$")).click()
            explorer = page.locator(".widget-vbox").filter(has=page.locator(".widget-output")).first
            figure = explorer.locator(".widget-output img").first
            figure.wait_for(timeout=180_000)

            def changed_after(action) -> bool:
                before = figure.get_attribute("src")
                action()
                try:
                    page.wait_for_function("([el, s]) => el.isConnected && el.src !== s || !el.isConnected",
                                           arg=[figure.element_handle(), before], timeout=60_000)
                except sync_api.TimeoutError:
                    return False
                figure.wait_for(timeout=60_000)
                return figure.get_attribute("src") != before

            def dropdown(label):
                return explorer.locator(".widget-dropdown").filter(has=page.get_by_text(label, exact=True)).locator("select")

            if shots:
                for kind in ("phase", "rate_distortion", "effective_beta", "rho", "dynamics"):
                    changed_after(lambda: dropdown("figure").select_option(kind))
                    explorer.screenshot(path=str(shots / f"explorer_{kind}.png"))
            dropdown("figure").select_option("effective_beta")
            assert changed_after(lambda: dropdown("weighting").select_option("distribution")), "weighting: no redraw"
            beta = explorer.locator(".widget-hslider").filter(has=page.get_by_text("β", exact=True))
            handle = beta.locator(".noUi-handle").first
            assert changed_after(lambda: (handle.focus(), page.keyboard.press("ArrowLeft"))) or \
                changed_after(lambda: (handle.focus(), page.keyboard.press("ArrowRight"))), "β slider: no redraw"

            panel = page.locator(".widget-vbox").filter(has=page.get_by_role("button", name="launch")).last
            panel.locator(".widget-text").filter(has=page.get_by_text("# β", exact=True)).locator("input").fill("1")
            panel.locator("select[multiple]").select_option(["plain"])
            steps = panel.locator(".widget-text").filter(has=page.get_by_text("steps", exact=True)).locator("input")
            steps.fill("4")
            steps.press("Enter")
            page.get_by_text(re.compile(r"^1 run\(s\) into")).wait_for(timeout=30_000)
            if shots:
                panel.screenshot(path=str(shots / "launch_panel.png"))
            panel.get_by_role("button", name="launch").click()
            page.get_by_text(re.compile(r"^done: 1/1 ok$")).wait_for(timeout=600_000)
            if shots:
                page.screenshot(path=str(shots / "after_launch.png"), full_page=True)
            page.keyboard.press("Control+s")
            page.wait_for_timeout(3000)
            browser.close()
    finally:
        lab.terminate()
        lab.wait(timeout=60)
    launched = list((clone / "runs" / "study-default" / "launched" / "runs").glob("*/summary.json"))
    assert len(launched) == 1, launched
    assert _git(clone, "status", "--porcelain") == "", _git(clone, "status")
