"""The notebook suite: stored output-free and in sync with the py:percent twins; train_cvae's
parameters are the flat config; every analysis notebook runs through papermill at smoke size;
``zfree report`` aggregates a sweep and renders report.html with code hidden."""

from __future__ import annotations


import jupytext
import nbformat
import pandas as pd
import papermill as pm
import pytest

from tests.tiny_sweep import make_tiny_sweep
from zfree.config import TrainConfig
from zfree.core.paths import NOTEBOOKS
from zfree_lab.experiment.render import REPORT_NOTEBOOKS

ALL = sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb"))
SUITE = ["train_cvae", "sweep_beta_vs_recon_weight", "rate_distortion", "effective_beta", "rho_recon",
         "training_dynamics", "explore", "study_report"]


def test_the_suite_is_complete():
    assert set(SUITE) <= set(ALL)
    assert set(REPORT_NOTEBOOKS) <= set(ALL)


@pytest.mark.parametrize("name", ALL)
def test_notebook_is_output_free_and_in_sync_with_its_twin(name):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    for c in nb.cells:
        if c.cell_type == "code":
            assert c.outputs == [] and c.execution_count is None, (name, c.source[:60])
    twin = jupytext.read(NOTEBOOKS / f"{name}.py")
    assert [(c.cell_type, c.source) for c in nb.cells] == [(c.cell_type, c.source) for c in twin.cells], \
        f"{name}.ipynb differs from {name}.py: run `jupytext --to ipynb notebooks/{name}.py`"
    params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1, name


def test_train_cvae_parameters_are_the_flat_config_generated_at_use(tmp_path):
    """The committed cell names the run folder and the data and base folders only; a run executes the
    notebook with the cell generated from the config's declarations: every flat field, in order, at
    its default (the committed lines kept)."""
    from zfree_lab.experiment.executor import with_config_parameters

    committed = pm.inspect_notebook(str(NOTEBOOKS / "train_cvae.ipynb"))
    assert list(committed) == ["out_dir", "progress", "data_dir", "base_dir"]
    nbformat.write(with_config_parameters(NOTEBOOKS / "train_cvae.ipynb"), tmp_path / "nb.ipynb")
    params = pm.inspect_notebook(str(tmp_path / "nb.ipynb"))
    assert list(params) == ["out_dir", "progress", *TrainConfig.flat_fields()]
    defaults = TrainConfig().to_flat()
    assert all(params[k]["default"] == repr(defaults[k]) for k in defaults if k not in ("data_dir", "base_dir"))


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return make_tiny_sweep(tmp_path_factory)


# Each report section's code runs in the default tier inside the combined report
# (test_report_aggregates_and_renders_every_section_without_code); run alone through its own
# parameters cell, one kernel each, in the slow tier. explore is in no report: always here.
@pytest.mark.parametrize("name", [*(pytest.param(n, marks=pytest.mark.slow) for n in REPORT_NOTEBOOKS[1:]), "explore"])
def test_analysis_notebook_runs_through_papermill(sweep, tmp_path, name):
    params = {"sweep_dir": str(sweep)} | ({"interactive": False} if name == "explore" else {})
    out = pm.execute_notebook(str(NOTEBOOKS / f"{name}.ipynb"), str(tmp_path / f"{name}.ipynb"), parameters=params,
                              kernel_name="python3", progress_bar=False, cwd=str(tmp_path))
    images = [o for c in out.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert images or name in ("explore", "switch_on"), name  # switch_on: see the test below


def test_switch_on_section_shows_the_aided_runs(sweep, tmp_path):
    """The aids section draws the hand-over barrier and the m = 1 confusion of an aided run."""
    import shutil

    from tests.tiny_sweep import tiny_base_flat
    from zfree.config import TrainConfig
    from zfree.core.io import read_json
    from zfree_lab.run.training import train_cvae

    d = tmp_path / "sweep"
    shutil.copytree(sweep, d)
    some = read_json(next((d / "runs").glob("*/config.json")))
    flat = tiny_base_flat(some["data_dir"], some["base_dir"], weighting="distribution", beta=0.3,
                          aid="hard_em_then_soft", n_latent=3, posterior_features="mean_first", hard_em_max_steps=4,
                          handover_check_every=2, handover_rows=16, restart_dead_every=2)
    train_cvae(TrainConfig.from_flat(flat), d / "runs" / "aided", progress=False)
    out = pm.execute_notebook(str(NOTEBOOKS / "switch_on.ipynb"), str(tmp_path / "s.ipynb"),
                              parameters={"sweep_dir": str(d)}, kernel_name="python3", progress_bar=False,
                              cwd=str(tmp_path))
    outputs = [o for c in out.cells for o in c.get("outputs", [])]
    assert any("image/png" in o.get("data", {}) for o in outputs)
    html = " ".join(o.get("data", {}).get("text/html", "") for o in outputs)
    assert "hard_em_then_soft" in html and "latent value" in html  # the table and the confusion matrix


def test_switch_on_section_without_aided_runs_leaves_no_heading_empty(sweep, tmp_path):
    """On a study without aided runs (the smoke preset, this tiny sweep) every heading of the aids
    section says something below it: "Targets met?" and "Latent value against strategy" showed
    their heading (and the targets' prose) over nothing."""
    out = pm.execute_notebook(str(NOTEBOOKS / "switch_on.ipynb"), str(tmp_path / "s.ipynb"),
                              parameters={"sweep_dir": str(sweep)}, kernel_name="python3", progress_bar=False,
                              cwd=str(tmp_path))
    cells = [c for c in out.cells if "parameters" not in c.metadata.get("tags", [])
             and "injected-parameters" not in c.metadata.get("tags", [])]
    empty = [m.source.splitlines()[0] for m, c in zip(cells, cells[1:])
             if m.cell_type == "markdown" and c.cell_type == "code" and not c.get("outputs")]
    assert not empty, empty


def test_report_aggregates_and_renders_every_section_without_code(sweep, tmp_path):
    import shutil

    from zfree_lab.cli import main

    d = tmp_path / "sweep"
    shutil.copytree(sweep, d)
    assert main(["report", str(d)]) == 0
    runs = pd.read_parquet(d / "runs.parquet")
    assert len(runs) == 6 and {"rate", "distortion", "latent_kind", "aid", "weighting", "beta"} <= set(runs.columns)
    assert len(pd.read_csv(d / "runs.csv")) == 6 and len(pd.read_parquet(d / "per_example.parquet")) == 6 * 24
    html = (d / "report.html").read_text()
    for title in (">zfree report<a", "phase diagram", "rate-distortion", "Effective β", "ρ_recon per example",
                  "collapse moment", "switch on"):
        assert title.lower() in html.lower(), title
    assert html.count("<img") >= 8 and "load_sweep" not in html  # figures in, code hidden
    assert not (d / ".report.src.ipynb").exists()


#: the notebooks whose text states theory's use rule
RULE_NOTEBOOKS = ["study_report", "effective_beta", "switch_on", "sweep_beta_vs_recon_weight"]


@pytest.mark.parametrize("name", RULE_NOTEBOOKS)
def test_the_use_rule_a_report_states_counts_the_base_models_excess(name):
    """Predicted use (``zfree.objective.theory.predicted_use``) is β_eff < η·(1 + |S|·excess / bayes_nll)
    where the Bayes loss is known: a report that states a bare β_eff < 1 (or < η) contradicts its own
    tables whenever the base falls short of Bayes-optimal (the smoke study: predicted use 98 % with every
    row at β_eff ≥ 1.2, β* of plain 1.16 at |S| of 4 to 7)."""
    import re

    text = " ".join(c.source.replace("\n", " ") for c in jupytext.read(NOTEBOOKS / f"{name}.py").cells
                    if c.cell_type == "markdown")
    bare = re.findall(r"β_eff[^.;]{0,20}?< ?(?:η|1)\b(?! ?[·+(])", text)
    assert not bare, bare
    assert "excess" in text


def test_rho_recon_below_one_is_not_said_to_be_z():
    """ρ_i divides by the frozen z-free model's surprisal, so a decoder that trains lowers ρ without z:
    on a real-data study (SmolLM2, unconditional) a run with rate 0.006 nats on one code read
    ρ_recon 0.37 under a line saying ρ < 1 means z carries information the z-free model lacks."""
    text = " ".join(c.source.replace("\n", " ").replace("# ", "") for c in jupytext.read(NOTEBOOKS / "rho_recon.py").cells
                    if c.cell_type == "markdown")
    assert "z carries information the z-free model lacks" not in text
    assert "control" in text  # what tells z's part apart: the gain over the z-free control


def test_the_report_notebooks_imports_load_neither_torch_nor_transformers():
    """The report's sections import only what reads tables and draws figures: their ``from zfree... import``
    lines, run in a fresh interpreter, leave torch and transformers unloaded (they loaded both through the
    decoding, run-folder, prefix-reference and latent-meaning modules: 9 s of the first cell beside a busy
    study, 2.4 s after). torch itself is still imported where a section computes the theory's weights."""
    import re
    import subprocess
    import sys

    parts = [*REPORT_NOTEBOOKS, "labels_and_samples", "what_z_learned"]
    lines = [m.group(0).strip() for nb in parts
             for m in re.finditer(r"^from zfree\S* import (\([^)]*\)|.*)$", (NOTEBOOKS / f"{nb}.py").read_text(), re.M)]
    assert len(lines) >= 20, lines  # every section's imports were found
    code = "\n".join([*lines, "import sys", "print('HEAVY', sorted(m for m in ('torch', 'transformers') if m in sys.modules))"])
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "HEAVY []" in r.stdout, r.stdout + r.stderr[-2000:]


@pytest.mark.parametrize("name", sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")))
def test_papermill_reads_every_parameter_of_every_notebook(name):
    """`papermill NB OUT -p NAME VALUE` and `papermill --help-notebook` know a parameter only where papermill parses
    its line: an `=` inside the comment (explore's `(make lab STUDY=DIR)`) dropped `sweep_dir` with a warning, and
    papermill then injected it as an "unknown parameter"."""
    import ast

    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    (cell,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assigned = [t.id for node in ast.parse(cell.source).body if isinstance(node, ast.Assign) for t in node.targets]
    assert assigned and list(pm.inspect_notebook(str(NOTEBOOKS / f"{name}.ipynb"))) == assigned
