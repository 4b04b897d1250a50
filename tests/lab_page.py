"""JupyterLab in a real browser, the pieces tests/test_lab_browser.py (the clone's ``make lab``) and
tests/test_lab_wheel.py (the wheel's ``zfree lab``) share: Playwright and the system Chromium (or
a skip saying which is missing), JupyterLab's user settings (autosave every ``AUTOSAVE_S`` seconds),
a notebook opened until its kernel is up and several autosaves have passed, Run All, and ``Lab``:
the page with explore.ipynb run, and what the tests read on it."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("ZFREE_CHROMIUM", "/usr/bin/chromium")
AUTOSAVE_S = 3  # JupyterLab's autosave interval here (120 s by default)


def browser_or_skip():
    """(playwright.sync_api, the screenshots folder or None): a skip naming what is missing without
    Playwright or Chromium; ``ZFREE_SCREENSHOTS=DIR`` names (and creates) the screenshots folder."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e .[test])")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set ZFREE_CHROMIUM)")
    shots = Path(os.environ["ZFREE_SCREENSHOTS"]) if os.environ.get("ZFREE_SCREENSHOTS") else None
    if shots:
        shots.mkdir(parents=True, exist_ok=True)
    return sync_api, shots


def open_notebook(page, url: str, kernel_timeout_s: float = 120) -> None:
    """Open ``url`` (a notebook in JupyterLab), wait for its cells, for its kernel to be up (idle) and
    for three autosave intervals: whatever opening would write has been written by then."""
    page.goto(url)
    page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=120_000)
    page.get_by_text(re.compile(r"\| Idle$")).first.wait_for(timeout=kernel_timeout_s * 1000)  # the kernel is up
    page.wait_for_timeout(3 * AUTOSAVE_S * 1000)


def run_all(lab: "Lab") -> None:
    """Run > Run All Cells; wait for the explorer's figure and the launch panel."""
    lab.page.get_by_role("menuitem", name="Run", exact=True).click()
    lab.page.locator(".lm-Menu-itemLabel").filter(has_text=re.compile(r"^Run All Cells$")).click()
    lab.figure.wait_for(state="attached", timeout=300_000)
    lab.panel.wait_for(state="attached", timeout=120_000)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lab_settings(folder: Path) -> Path:
    """JupyterLab user settings for the test: autosave every AUTOSAVE_S seconds, no news prompt."""
    for plugin, settings in (("docmanager-extension/plugin", {"autosave": True, "autosaveInterval": AUTOSAVE_S}),
                             ("apputils-extension/notification", {"fetchNews": "false"})):
        f = folder / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(settings))
    return folder


class Lab:
    """The page with explore.ipynb run, and what the tests read on it."""

    def __init__(self, page, clone: Path, proc: subprocess.Popen, shots: Path | None, timeout_error):
        self.page, self.clone, self.proc, self.shots, self.TimeoutError = page, clone, proc, shots, timeout_error
        self.chooser = page.locator(".zfree-chooser")
        self.explorer = page.locator(".zfree-explorer")
        self.panel = page.locator(".zfree-launch")
        self.status = self.panel.locator(".zfree-launch-status")
        self.figure = self.explorer.locator(".widget-output img").first
        self.runs = clone / "runs"
        self.status_after_open: str | None = None  # git status once opened (kernel up, autosaves passed)
        self.dirty_after_open: int | None = None  # notebook tabs marked unsaved then (issue 60: 1, by language_info)
        self.mtime_before_run: int | None = None  # the notebook file's, before Run All (an autosave changes it)

    def text(self, pattern: str, timeout_s: float = 60):
        """Wait for an element whose whole text matches ``pattern``; returns its text."""
        el = self.page.get_by_text(re.compile(pattern)).first
        el.wait_for(state="attached", timeout=timeout_s * 1000)
        return el.text_content()

    def dropdown(self, label: str):
        return self.explorer.locator(".widget-dropdown").filter(
            has=self.page.get_by_text(label, exact=True)).locator("select")

    def choose_study(self, name: str, n_runs: int) -> None:
        """The chooser's dropdown set to runs/<name>; waits for the table to show it."""
        self.chooser.locator("select").select_option(label=f"runs/{name} ({n_runs} run{'s' * (n_runs != 1)})")
        self.text(rf"^study {re.escape(str((self.runs / name).resolve()))}: \d+ finished runs?"
                  rf"( \(\d+ launched\))?, \d+ failed$")

    def changed_after(self, action) -> bool:
        """Whether the explorer's figure is redrawn (another image) after ``action``."""
        before = self.figure.get_attribute("src")
        handle = self.figure.element_handle()
        action()
        return self.changed_from(before, handle)

    def changed_from(self, before: str, handle=None, timeout_s: float = 60) -> bool:
        """Whether the explorer's figure shows another image than ``before`` (its ``src``, a data
        URI) within ``timeout_s``; ``handle``: the img element that showed it (replaced, or its src
        changed, on a redraw)."""
        try:
            self.page.wait_for_function("([el, s]) => !el.isConnected || el.src !== s",
                                        arg=[handle or self.figure.element_handle(), before], timeout=timeout_s * 1000)
        except self.TimeoutError:
            return False
        self.figure.wait_for(state="attached", timeout=60_000)
        return self.figure.get_attribute("src") != before

    def field(self, label: str):
        return self.panel.locator(".widget-text").filter(has=self.page.get_by_text(label, exact=True)).locator("input")

    def set_launch(self, n_beta: int, steps: int, weightings=("plain",)) -> None:
        """The panel's # β (one: the template's β), weightings and steps; waits for the plan to
        count the runs."""
        self.field("# β").fill(str(n_beta))
        self.field("# β").press("Enter")
        self.panel.locator("select[multiple]").select_option(list(weightings))
        self.field("steps").fill(str(steps))
        self.field("steps").press("Enter")
        self.text(rf"^{n_beta * len(weightings)} run\(s\) into")

    def launch(self, until: str = r"(done|failed|stopped): .*", timeout_s: float = 600) -> str:
        """Click launch; wait for a new status line that matches ``until`` (whole); returns it."""
        before = self.status.text_content()
        self.panel.get_by_role("button", name="launch").click()
        return self.wait_status(until, timeout_s, other_than=before)

    def wait_status(self, until: str, timeout_s: float, other_than: str | None = None) -> str:
        """The panel's status line once it matches ``until`` (whole) and differs from ``other_than``."""
        t0 = time.time()
        while time.time() - t0 < timeout_s:
            text = self.status.text_content()
            if text != other_than and re.fullmatch(until, text):
                return text
            time.sleep(0.5)
        raise AssertionError(f"the status line is {self.status.text_content()!r} after {timeout_s:.0f} s, not {until!r}")

    def shot(self, name: str, locator=None) -> None:
        if self.shots:
            (locator or self.page).screenshot(path=str(self.shots / f"{name}.png"))
