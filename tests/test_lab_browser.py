"""JupyterLab in a real browser (slow tier), as a researcher drives explore.ipynb: in a fresh clone
with the notebook filter, JupyterLab starts from the project's environment (autosave every few
seconds) and the notebook is opened (``git status`` stays clean) and run. Then, each a test on
the same page: the figures redraw as the widgets change; a study is chosen in the dropdown, no
tracked file changing; a launch finishes with numbers in its summary.json; a launch that must
fail says failed, with its reason and run folder, and the explorer counts it; stop ends the
workers and launch works again; saving (autosave and Ctrl+S) leaves ``git status`` clean.

Needs Playwright for Python (the test extra) and a system Chromium at ``$ZFREE_CHROMIUM`` or
/usr/bin/chromium (Debian package ``chromium``; ``playwright install`` is not used): ``make
test-lab`` installs both where it can. Set ``ZFREE_SCREENSHOTS=DIR`` to keep a screenshot of each
explorer figure, of the launch panel and of the page at the end of each test.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.lab_page import AUTOSAVE_S, CHROMIUM, Lab, browser_or_skip, free_port, lab_settings, open_notebook, run_all
from tests.test_lab import _git, make_lab_clone
from tests.tiny_sweep import make_tiny_sweep
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
FIGURES = ("phase", "rate_distortion", "effective_beta", "rho", "dynamics")


def _start_lab(clone: Path, port: int, token: str, settings: Path) -> subprocess.Popen:
    args = [str(Path(sys.prefix) / "bin" / "jupyter"), "lab", "--ServerApp.root_dir=notebooks", "--no-browser",
            "--ip=127.0.0.1", f"--port={port}", f"--IdentityProvider.token={token}"]
    if os.geteuid() == 0:
        args.append("--allow-root")
    # the clone's own package (its runs/ is where the notebook looks for studies), not the one the
    # environment's editable install points at; JUPYTER_CONFIG_PATH as `make lab` sets it
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(clone / "src"),
           "JUPYTER_CONFIG_PATH": str(clone / "etc" / "jupyter"), "JUPYTERLAB_SETTINGS_DIR": str(settings)}
    env.pop("ZFREE_STUDY", None)
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


def _break_study(study: Path) -> None:
    """A study whose data folder has gone (moved, deleted): every launch from it must fail."""
    for cfg in study.glob("runs/*/config.json"):
        cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "data_dir": str(study / "data that was deleted")}))


def _kernel_children(lab_pid: int) -> list:
    """The processes the notebook's kernel started, alive now: the launch panel's pool workers,
    then (their children) the runs' notebook kernels."""
    import psutil

    kernels = [p for p in psutil.Process(lab_pid).children() if "ipykernel_launcher" in " ".join(p.cmdline())]
    alive = []
    for c in (c for k in kernels for c in k.children(recursive=True)):
        try:
            if c.status() != psutil.STATUS_ZOMBIE:
                alive.append(c)
        except psutil.NoSuchProcess:
            pass
    return alive


def _run_kernels(lab_pid: int) -> int:
    """How many runs' notebook kernels (the pool workers' children) are alive."""
    import psutil

    workers = {p.pid for p in _kernel_children(lab_pid) if p.ppid() in
               {k.pid for k in psutil.Process(lab_pid).children()}}
    return sum(p.ppid() in workers for p in _kernel_children(lab_pid))


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """explore.ipynb opened in JupyterLab (git status checked after open and autosave) and run."""
    sync_api, shots = browser_or_skip()
    tmp = tmp_path_factory.mktemp("lab")
    sweep = make_tiny_sweep(tmp_path_factory)
    clone = make_lab_clone(tmp, sweep)
    shutil.copytree(sweep, clone / "runs" / "study-moved")  # ignored by git: runs/ is not tracked
    _break_study(clone / "runs" / "study-moved")
    os.utime(next((clone / "runs" / "study-aided" / "runs").glob("*/summary.json")))  # the newest study
    nb = clone / "notebooks" / "explore.ipynb"
    port, token = free_port(), "zfree-test"
    proc = _start_lab(clone, port, token, lab_settings(tmp / "lab-settings"))
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            open_notebook(page, f"http://127.0.0.1:{port}/lab/tree/explore.ipynb?token={token}")
            lab = Lab(page, clone, proc, shots, sync_api.TimeoutError)
            lab.status_after_open = _git(clone, "status", "--porcelain")
            lab.dirty_after_open = page.locator(".lm-TabBar-tab.jp-mod-dirty").count()
            lab.mtime_before_run = nb.stat().st_mtime_ns
            run_all(lab)
            yield lab
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@pytest.fixture(autouse=True)
def _end_shot(request):
    yield
    lab = request.node.funcargs.get("lab")
    if lab is not None:
        lab.shot(f"end_{request.node.name}")


def test_opening_the_notebook_changes_no_tracked_file(lab):
    """Open, kernel started, several autosave intervals: nothing written to tracked files, and the
    notebook not marked unsaved (the kernel's language_info was already in it)."""
    assert lab.status_after_open == "", lab.status_after_open
    assert lab.dirty_after_open == 0


def test_the_explorer_opens_the_newest_study_and_redraws(lab):
    chosen = lab.chooser.locator("select").evaluate("el => el.options[el.selectedIndex].text")
    assert chosen.replace("\u00a0", " ") == "runs/study-aided (6 runs)", chosen  # ipywidgets: no-break spaces
    lab.text(rf"^study {re.escape(str((lab.runs / 'study-aided').resolve()))}: 6 finished runs, 0 failed$")
    for kind in FIGURES:
        lab.changed_after(lambda: lab.dropdown("figure").select_option(kind))
        lab.figure.scroll_into_view_if_needed()
        lab.shot(f"explorer_{kind}", lab.explorer)
    lab.dropdown("figure").select_option("effective_beta")
    assert lab.changed_after(lambda: lab.dropdown("weighting").select_option("distribution")), "weighting: no redraw"
    handle = lab.explorer.locator(".widget-hslider").filter(has=lab.page.get_by_text("β", exact=True)) \
        .locator(".noUi-handle").first
    assert lab.changed_after(lambda: (handle.focus(), lab.page.keyboard.press("ArrowLeft"))) or \
        lab.changed_after(lambda: (handle.focus(), lab.page.keyboard.press("ArrowRight"))), "β slider: no redraw"


def test_a_study_chosen_in_the_dropdown_changes_no_tracked_file(lab):
    lab.choose_study("study-default", 6)
    assert "study-default/launched/runs" in lab.panel.text_content()  # the panel follows the study
    lab.page.wait_for_timeout(3 * AUTOSAVE_S * 1000)  # the notebook is dirty (run): autosaved by now
    assert lab.clone.joinpath("notebooks", "explore.ipynb").stat().st_mtime_ns > lab.mtime_before_run, "no autosave"
    assert _git(lab.clone, "status", "--porcelain") == "", _git(lab.clone, "diff")[:3000]


def test_a_launch_finishes_with_numbers_in_its_summary(lab):
    lab.choose_study("study-default", 6)
    # every run a point (the launched one adds one); each choice's redraw has reached the page before
    # the figure is read (a choice the explorer already shows changes nothing: a wait, no failure)
    lab.changed_after(lambda: lab.dropdown("figure").select_option("rate_distortion"))
    lab.changed_after(lambda: lab.dropdown("weighting").select_option("all"))
    lab.text(r"^6 finished runs, 0 failed; showing 6$")
    before, handle = lab.figure.get_attribute("src"), lab.figure.element_handle()
    # a weighting the study has no run of: a curve of its own, so the figure must change (a plain run
    # at the template's β and seed repeats the study's own plain run exactly: the same figure)
    lab.set_launch(n_beta=1, steps=4, weightings=("token",))
    lab.shot("launch_panel", lab.panel)
    lab.figure.scroll_into_view_if_needed()
    lab.shot("explorer_before_launch", lab.explorer)
    label = lab.launch()
    assert label == "done: 1/1 ok", label
    (summary,) = (lab.runs / "study-default" / "launched" / "runs").glob("*/summary.json")
    s = json.loads(summary.read_text())
    metrics = ("loss/val/kl_prior_loss", "loss/val/baseline_normalized_reconstruction_loss",
               "latent/mutual_information", "steps")
    assert all(isinstance(s.get(k), (int, float)) and math.isfinite(s[k]) for k in metrics), {k: s.get(k) for k in metrics}
    assert s["steps"] == 4 and "done" not in summary.read_text()
    lab.text(r"^7 finished runs, 0 failed; showing 7$")  # the explorer counts it and draws it
    # the explorer is refreshed from the launch thread: its new figure must reach the page (an
    # Output captured with `with out:` there kept showing the old one)
    assert lab.changed_from(before, handle), "the explorer's figure was not redrawn after the launch"
    lab.figure.scroll_into_view_if_needed()
    lab.shot("explorer_after_launch", lab.explorer)
    lab.shot("after_launch")


def test_a_launch_that_fails_says_why_and_where_and_the_explorer_counts_it(lab):
    lab.choose_study("study-moved", 6)
    lab.set_launch(n_beta=1, steps=4)
    label = lab.launch()
    m = re.fullmatch(r"failed: 0/1 ok; 1 failed, first (\S+): (.+?) \(see (.+/error\.json)\)", label)
    assert m and "done" not in label, label
    run_id, reason, error_file = m.groups()
    assert "data that was deleted" in reason and "does not exist" in reason and "…" not in reason, reason
    assert Path(error_file) == (lab.runs / "study-moved" / "launched" / "runs" / run_id / "error.json").resolve()
    assert Path(error_file).is_file() and not Path(error_file).with_name("summary.json").exists()
    lab.text(r"^6 finished runs, 1 failed; showing \d+$")
    assert lab.panel.get_by_role("button", name="launch").is_enabled()
    lab.shot("failed_launch", lab.panel)


def test_stop_ends_the_workers_and_launch_works_again(lab):
    lab.choose_study("study-default", 6)  # the chooser counts a study's own runs, not its launched ones
    lab.set_launch(n_beta=2, steps=100_000)  # two β of the range, runs that would take hours
    lab.panel.get_by_role("button", name="launch").click()
    runs = lab.runs / "study-default" / "launched" / "runs"
    for _ in range(360):  # both workers have started their run's kernel
        if _run_kernels(lab.proc.pid) >= 2:
            break
        time.sleep(0.5)
    assert _run_kernels(lab.proc.pid) == 2, [p.cmdline() for p in _kernel_children(lab.proc.pid)]
    assert lab.panel.get_by_role("button", name="launch").is_disabled()
    t0 = time.time()
    lab.panel.get_by_role("button", name="stop").click()
    label = lab.wait_status(r"(done|failed|stopped): .*", timeout_s=60)
    assert label == "stopped: 0/2 finished" and time.time() - t0 < 60, label
    assert lab.panel.get_by_role("button", name="launch").is_enabled()
    assert lab.panel.get_by_role("button", name="stop").is_disabled()
    for _ in range(60):
        if not _kernel_children(lab.proc.pid):
            break
        time.sleep(0.5)
    assert not _kernel_children(lab.proc.pid), [p.cmdline() for p in _kernel_children(lab.proc.pid)]
    assert len(list(runs.glob("*/summary.json"))) == 1  # the first test's run; the stopped ones unfinished
    lab.set_launch(n_beta=1, steps=4)  # launch works again (a plain run at the template's β, 4 steps)
    assert lab.launch() == "done: 1/1 ok"


def test_saving_leaves_git_clean(lab):
    lab.page.keyboard.press("Control+s")
    lab.page.wait_for_timeout(3000)
    assert _git(lab.clone, "status", "--porcelain") == "", _git(lab.clone, "diff")[:3000]
