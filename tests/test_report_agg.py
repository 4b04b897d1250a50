"""The smoke report under ``MPLBACKEND=Agg`` (headless servers, cluster jobs) holds every figure.

Under Agg the inline backend that shows a notebook's figures at the end of a cell is not active,
so a figure reaches report.html only when the notebook displays it (``zfree_lab.report.report.show``). The
expected number of images is counted per report section from the notebooks' own sources: every
``show(`` on an unindented line runs unconditionally; the switch_on section's three conditional
figures and the phase diagrams (one per aid / latent kind) are counted from the study's data
with the same package calls the notebook makes.
"""

from __future__ import annotations

import re

import jupytext
import pandas as pd
import pytest

from zfree.core.paths import NOTEBOOKS
from zfree_lab.experiment.render import REPORT_NOTEBOOKS

SHOW = re.compile(r"\bshow\(")


def _shows(name: str) -> tuple[int, int]:
    """(unconditional, conditional) ``show(`` calls in the code cells of notebook ``name``."""
    code = [c.source for c in jupytext.read(NOTEBOOKS / f"{name}.py").cells if c.cell_type == "code"]
    lines = [ln for src in code for ln in src.splitlines() if SHOW.search(ln) and "import" not in ln]
    top = sum(1 for ln in lines if not ln.startswith((" ", "\t")))
    return top, len(lines) - top


def _expected_switch_on(study) -> int:
    """The switch_on figures the notebook draws for this study: gate traces, phase boundary and
    use per length, each only where its data exist."""
    from zfree_lab.report.report import aided_runs, gate_traces
    from zfree_lab.experiment.results import load_sweep

    sweep = load_sweep(study)
    return (int(not gate_traces(aided_runs(sweep.runs), sweep.runs).empty) + int(not sweep.phase_boundary().empty)
            + int(not sweep.use_by_length("distribution").empty))


@pytest.fixture
def agg_smoke(smoke_study):
    """The session's smoke study (tests/smoke_study.py): run under ``MPLBACKEND=Agg``."""
    return smoke_study


def test_smoke_report_under_agg_holds_every_figure_per_section(agg_smoke):
    html = (agg_smoke / "report.html").read_text()
    sections = re.split(r"<h1[ >]", html)[1:]  # one h1 per notebook: its title cell
    assert len(sections) == len(REPORT_NOTEBOOKS), [s[:60] for s in sections]
    want = {}
    for name in REPORT_NOTEBOOKS:
        top, cond = _shows(name)
        if name == "switch_on":
            assert (top, cond) == (0, 3), "switch_on's figures changed: update _expected_switch_on"
            want[name] = _expected_switch_on(agg_smoke)
        elif name == "sweep_beta_vs_recon_weight":  # one phase diagram per aid / latent kind
            from zfree_lab.report.figstyle import variants
            from zfree_lab.experiment.results import load_sweep

            assert (top, cond) == (0, 1), "the phase diagram's figures changed: update this count"
            want[name] = len(variants(load_sweep(agg_smoke).runs))
        elif name == "training_dynamics":  # the curves, and the training distortion where runs wrote curve.jsonl
            assert cond == 1, "training_dynamics' figures changed: update this count"
            want[name] = top + int(any((agg_smoke / "runs").glob("*/curve.jsonl")))
        elif name == "study_report":  # the gain figure (z-free controls), the remedies leaderboard's, and the
            # three per-run figures (rate and ρ_recon, predicted against measured, loss fractions) where a CVAE run is
            assert cond == 5, "study_report's figures changed: update this count"
            has_runs = not pd.read_csv(agg_smoke / "summary.csv").empty
            want[name] = (top + 3 * int(has_runs) + int((agg_smoke / "controls.json").exists())
                          + int((agg_smoke / "leaderboard.csv").exists()))
        else:
            assert cond == 0, f"{name}: a conditional figure; count it from the data as switch_on's are"
            want[name] = top
    got = {name: s.count("<img") for name, s in zip(REPORT_NOTEBOOKS, sections)}
    assert got == want
    assert sum(want.values()) >= len(REPORT_NOTEBOOKS)  # at least one figure a section on average
    assert "Traceback" not in html and "<Figure size" not in html  # no error, no figure left as text
