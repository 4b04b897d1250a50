"""The screenshots of docs/tutorials/jupyterlab.md: JupyterLab on notebooks/, explore.ipynb run
(Run All) on a finished study, in the system Chromium through Playwright for Python (as
tests/test_lab_browser.py drives it), in a 1600x1000 window.

    PYTHONPATH=src .venv/bin/python docs/lab_screenshots.py --study /tmp/study-copy [--launch]

writes into docs/assets/ (``--out``):

- ``lab-explore-run-all.png``: the window after Run All, scrolled to the study dropdown, the run
  table, the explorer's controls and the top of its figure;
- ``lab-explorer-figure.png``: the explorer, its controls and the whole figure;
- ``lab-launch-panel.png``: the launch panel as it opens (nothing launched);
- ``lab-launch-panel-done.png`` (``--launch``): the panel after the smallest launch it allows
  (one β, plain, one seed, ``--steps`` steps) has finished;
- ``lab-explorer-after-launch.png`` (``--launch``): the explorer then, counting the launched run and
  its figure redrawn (not taken, and said, when the figure stays as it was).

``--launch`` writes runs into ``<study>/launched/``: give a copy of the study, without a
``launched/`` folder. JupyterLab is started here from this environment on a free port, with the
checkout's ``src`` first on PYTHONPATH, ``ZFREE_STUDY=<study>``, the project's ``etc/jupyter``
config, autosave off and its layout in a temporary folder, and stopped at the end (``--url``
drives a server that is already running instead). Each PNG is cropped to what it shows; look at
each before using it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOKEN = "zfree-docs"
VIEWPORT = {"width": 1600, "height": 1000}
# the right edge of what an element shows: its leaf elements' and form controls' that are not as
# wide as the element
# (the explorer and the panel are as wide as the notebook, their content is not)
RIGHT_EDGE = """el => { const w = el.getBoundingClientRect().width;
    return Math.max(...[...el.querySelectorAll('*')].filter(e => !e.children.length || e.matches('select, button'))
        .map(e => e.getBoundingClientRect()).filter(r => r.width > 0 && r.height > 0 && r.width < 0.9 * w)
        .map(r => r.right)); }"""


def start_lab(study: Path, settings: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for plugin, values in (("docmanager-extension/plugin", {"autosave": False}),
                           ("apputils-extension/notification", {"fetchNews": "false", "checkForUpdates": False})):
        f = settings / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(values))
    args = [str(Path(sys.prefix) / "bin" / "jupyter"), "lab", "--ServerApp.root_dir=notebooks", "--no-browser",
            "--ip=127.0.0.1", f"--port={port}", f"--IdentityProvider.token={TOKEN}"]
    if os.geteuid() == 0:
        args.append("--allow-root")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "PYTHONPATH": str(REPO / "src"), "ZFREE_STUDY": str(study.resolve()),
           "JUPYTER_CONFIG_PATH": str(REPO / "etc" / "jupyter"), "JUPYTERLAB_SETTINGS_DIR": str(settings),
           "JUPYTERLAB_WORKSPACES_DIR": str(settings / "workspaces")}  # the default layout, none saved to ~
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            urllib.request.urlopen(f"{url}/api/status?token={TOKEN}", timeout=2)
            return proc, url
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"jupyter lab exited with {proc.returncode}")
            time.sleep(1)
    proc.terminate()
    raise SystemExit("jupyter lab did not answer within 120 s")


def clip_of(page, locator, pad: int = 6) -> dict:
    """The element's box, from its left edge to its content's right edge, padded left and right
    (above and below is the notebook's: the previous output, the cell's border); scrolled into view."""
    locator.evaluate("el => el.scrollIntoView({block: 'center'})")
    page.wait_for_timeout(500)
    box, right = locator.bounding_box(), locator.evaluate(RIGHT_EDGE)
    return {"x": box["x"] - pad, "y": box["y"], "width": right - box["x"] + 2 * pad, "height": box["height"]}


def check_page(page) -> None:
    """No traceback or stderr in the notebook's outputs, no red line under the study dropdown."""
    bad = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr'], "
                       ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.error']")
    if bad.count():
        raise SystemExit("the notebook shows an error:\n" + "\n".join(bad.nth(i).inner_text()[:2000]
                                                                    for i in range(bad.count())))
    error = page.locator(".zfree-chooser").get_by_text(re.compile("^cannot open"))
    if error.count():
        raise SystemExit(f"the study chooser says: {error.first.inner_text()}")


def shoot(url: str, out: Path, launch: bool, steps: int, launch_timeout_s: float) -> None:
    from playwright.sync_api import TimeoutError, sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=os.environ.get("ZFREE_CHROMIUM", "/usr/bin/chromium"),
                                     args=["--no-sandbox"])
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(f"{url}/lab/tree/explore.ipynb?token={TOKEN}")
        page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=120_000)
        page.get_by_text(re.compile(r"\| Idle$")).first.wait_for(timeout=120_000)  # the kernel is up
        page.wait_for_timeout(1000)
        open_tab = page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current")
        if open_tab.count():  # the file browser closed: the notebook as wide as the window
            open_tab.first.click()
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.locator(".lm-Menu-itemLabel").filter(has_text=re.compile(r"^Run All Cells$")).click()
        explorer, panel = page.locator(".zfree-explorer"), page.locator(".zfree-launch")
        explorer.locator(".widget-output img").first.wait_for(state="attached", timeout=300_000)
        panel.wait_for(state="attached", timeout=120_000)
        page.get_by_text(re.compile(r"\| Idle$")).first.wait_for(timeout=120_000)
        page.wait_for_timeout(2000)
        check_page(page)
        page.mouse.move(VIEWPORT["width"] - 5, VIEWPORT["height"] // 2)  # no hover highlight on the table

        # the window, the study dropdown at the top of the notebook's area
        page.locator(".zfree-chooser").evaluate("el => el.scrollIntoView({block: 'start'})")
        page.locator(".jp-NotebookPanel .jp-WindowedPanel-outer").evaluate("el => el.scrollBy(0, -12)")
        page.wait_for_timeout(800)
        page.screenshot(path=str(out / "lab-explore-run-all.png"))
        page.screenshot(path=str(out / "lab-explorer-figure.png"), clip=clip_of(page, explorer))
        page.screenshot(path=str(out / "lab-launch-panel.png"), clip=clip_of(page, panel))

        if launch:  # the smallest launch: one β (the template's), plain, one seed, `steps` steps
            field = lambda label: panel.locator(".widget-text").filter(  # noqa: E731
                has=page.get_by_text(label, exact=True)).locator("input")
            for label, value in (("# β", 1), ("seeds", 1), ("steps", steps)):
                field(label).fill(str(value))
                field(label).press("Enter")
            panel.locator("select[multiple]").select_option(["plain"])
            page.get_by_text(re.compile(r"^1 run\(s\) into")).first.wait_for(timeout=30_000)
            status = panel.locator(".zfree-launch-status")
            count = explorer.get_by_text(re.compile(r"^\d+ finished runs?, \d+ failed; showing \d+$")).first
            figure = explorer.locator(".widget-output img").first
            before, counted, drawn = status.text_content(), count.text_content(), figure.get_attribute("src")
            t0 = time.time()
            panel.get_by_role("button", name="launch").click()
            while not (status.text_content() != before
                       and re.fullmatch(r"(done|failed|stopped): .*", status.text_content())):
                if time.time() - t0 > launch_timeout_s:
                    raise SystemExit(f"the launch has not ended after {launch_timeout_s:.0f} s: "
                                     f"{status.text_content()!r}")
                time.sleep(1)
            print(f"launch: {status.text_content()} after {time.time() - t0:.0f} s")
            page.mouse.move(VIEWPORT["width"] - 5, VIEWPORT["height"] // 2)
            page.screenshot(path=str(out / "lab-launch-panel-done.png"), clip=clip_of(page, panel))
            page.wait_for_function("([el, s]) => el.textContent !== s", arg=[count.element_handle(), counted],
                                   timeout=60_000)  # the explorer counts the launched run
            try:  # and redraws its figure with it
                page.wait_for_function("s => document.querySelector('.zfree-explorer .widget-output img').src !== s",
                                       arg=drawn, timeout=60_000)
                page.wait_for_timeout(2000)
                page.screenshot(path=str(out / "lab-explorer-after-launch.png"), clip=clip_of(page, explorer))
            except TimeoutError:
                print(f"explorer: {count.text_content()!r}, but its figure was not redrawn within 60 s of the "
                      "launch: lab-explorer-after-launch.png not taken")
            check_page(page)
        browser.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--study", type=Path, required=True, help="a finished study (a copy, with --launch)")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "assets")
    ap.add_argument("--launch", action="store_true", help="also the panel after the smallest launch")
    ap.add_argument("--steps", type=int, default=1, help="the launched run's steps (default 1, the panel's least)")
    ap.add_argument("--launch-timeout", type=float, default=600, help="seconds")
    ap.add_argument("--url", help="a running JupyterLab (token zfree-docs) on this checkout's notebooks/, started "
                                  "with ZFREE_STUDY=<study>; default: start one")
    a = ap.parse_args()
    if a.launch and any((a.study / "launched" / "runs").glob("*")):
        raise SystemExit(f"{a.study}/launched/runs is not empty: give a fresh copy of the study")
    if a.url:
        return shoot(a.url, a.out, a.launch, a.steps, a.launch_timeout)
    with tempfile.TemporaryDirectory() as settings:
        proc, url = start_lab(a.study, Path(settings))
        try:
            shoot(url, a.out, a.launch, a.steps, a.launch_timeout)
        finally:
            proc.terminate()
            proc.wait(timeout=60)


if __name__ == "__main__":
    main()
