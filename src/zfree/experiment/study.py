"""The main job: data -> base run -> CVAE grid (papermill) -> summary.csv -> report.html.

Presets:
  smoke    tiny data, a tiny base model trained on the spot, two short runs (< 2 minutes; tests).
  default  the shipped benchmark and base run: each of plain, distribution, example and token
           weighting once without an aid (z collapses where theory predicts use) and once with the
           switch-on recipe: distribution, example and token inside their predicted boundary (z
           switches on), plain at beta = 1 outside it (z ends unused); <= 10 minutes on 2 cores.
  aided    the aids issue: the best aid on both sides of the prediction and the aids that fail.
  full     the complete phase diagram (hours).
  e2e      real text (issue 14): data/e2e with its shipped base data/e2e/base, every weighting with and
           without the aid at a third of its predicted boundary; labels' NMI/probe and per-value samples.
Rerunning any preset skips finished work. Your own model and data: ``zfree.experiment.own_study``.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zfree.config import BaseTrainConfig, DataConfig, TrainConfig
from zfree.core.io import atomic_write_json, atomic_write_text, read_json, sha256_file
from zfree.core.locks import run_folder_lock
from zfree.core.paths import ROOT, SHIPPED_BASE, SHIPPED_DATA, SHIPPED_E2E  # noqa: F401 - ROOT re-exported
from zfree.experiment.results import SUMMARY_COLUMNS, aggregate, collect_runs, summary_table  # noqa: F401 - re-exported
from zfree.experiment.sweeps import NOTEBOOKS, expand_grid, run_points

@dataclass(frozen=True)
class Preset:
    """A study preset: the grid over flat TrainConfig fields, shared overrides, data and base configs (None: shipped)."""
    name: str
    grid: dict[str, list[Any]]
    train: dict[str, Any]  # flat TrainConfig overrides
    data: DataConfig | None = None  # None: the shipped benchmark
    base: BaseTrainConfig | None = None  # None: the shipped base run
    workers: int = 2
    data_dir: Path | None = None  # a shipped real-text data folder (with its shipped base_dir) instead of `data`
    base_dir: Path | None = None


#: The switch-on recipe of the aids issue: hard EM gated hand-over, order-keeping posterior
#: features, more latent values than strategies, dead-value restarts (see AidConfig).
HARD_EM_RECIPE = {"aid": "hard_em_then_soft", "n_latent": 6, "posterior_features": "mean_first",
                  "hard_em_decoder": "best", "handover_margin": 0.15,
                  "restart_dead_every": 100, "hard_em_max_steps": 800, "handover_check_every": 50,
                  "handover_rows": 500,
                  # soft-phase backbone rate: 3e-5 gave rho_recon 0.48 / NMI(m=1) 0.71 at step 800,
                  # 1e-4 gave 0.30 / 0.78 (same seed and hand-over step; 0.18 / 0.89 at step 1000)
                  "lr_backbone": 1e-4,
                  # heads and latent embeddings: 1e-3 ended at NMI(m=1) 0.884 (seed 0, step 1200), 3e-3 at 0.901
                  "lr_new": 3e-3}
#: issue 15's faster switch-on (analysis/results/switch_on_variants.md): the recipe with the
#: optimal posterior q*(z | x, y) (no amortized head: q* is computed from the K decoder passes the
#: step makes anyway), batch 32, higher rates (hard-phase backbone 3e-4, latent embeddings and
#: router 1e-2), a 200-row gate every 25 steps and restarts every 50. With the amortized head
#: (mean_first) the same recipe sat at NMI (m = 1) 0.85-0.89 for hundreds of steps: 6-11 of the 71
#: copy rows (m = 1) of the first 300 validation rows went to the reverse value (10 of those 71 have
#: x[0] = x[-1], a first y token reverse would emit too); the decoders' own q* does not stall there
SWITCH_ON_RECIPE = {**HARD_EM_RECIPE, "posterior_features": "optimal", "batch_size": 32, "hard_em_lr_backbone": 3e-4,
                    "lr_backbone": 3e-4, "lr_new": 1e-2, "handover_rows": 200, "handover_check_every": 25,
                    "restart_dead_every": 50, "hard_em_max_steps": 400}
_AIDED_RUN = {"steps": 1200, "eval_every": 300, "eval_rows": 500, "decode_rows": 200}
#: the best aid's runs: one evaluation fewer (1200 steps took 618-639 s with evaluations every 300)
_BEST_RUN = {**_AIDED_RUN, "eval_every": 400}
#: the default preset's aided runs: SWITCH_ON_RECIPE for 600 steps (the hand-over gate decides
#: when the true objective takes over; forced at step 400), evaluated every 200 steps
_QUICK_AID = {**SWITCH_ON_RECIPE, "steps": 600, "eval_every": 200, "eval_rows": 500, "decode_rows": 200}
_QUICK_PLAIN = {"steps": 100, "eval_every": 50, "eval_rows": 300, "decode_rows": 100}
#: the full preset's aided runs: the best aid with the phase-boundary sweep's schedule (hand-over
#: forced by step 450, then 250 soft steps under the true objective; 276-482 s a run there)
_PHASE_AID = {**HARD_EM_RECIPE, "hard_em_max_steps": 450, "steps": 700, "eval_every": 350, "eval_rows": 500,
              "decode_rows": 100}
_PHASE_PLAIN = {"steps": 250, "eval_every": 125, "eval_rows": 500, "decode_rows": 100}
_WEIGHTINGS = [{"weighting": "plain"}, {"weighting": "distribution"}, {"weighting": "example", "epsilon": 0.05},
               {"weighting": "token", "token_outer": "distribution", "token_alpha": 0.5}]

#: the E2E preset's runs (real text, labels instead of strategies): the recipe at K = 4 with a short
#: hard phase, and the unaided runs; betas at a third of each weighting's predicted boundary beta*
#: (``zfree.experiment.own_study.predicted_boundary`` on the shipped E2E reference: plain 0.0333, distribution
#: 0.0129, example 0.0136; token as distribution)
_E2E_AID = {**HARD_EM_RECIPE, "lr_new": 1e-3, "n_latent": 4, "hard_em_max_steps": 150, "handover_rows": 200,
            "steps": 250, "eval_every": 125, "eval_rows": 300, "decode_rows": 3}
_E2E_PLAIN = {"steps": 100, "eval_every": 50, "eval_rows": 300, "decode_rows": 3}
_E2E_BETAS = {"plain": 0.0111, "distribution": 0.0043, "example": 0.0045, "token": 0.0043}

PRESETS: dict[str, Preset] = {
    "smoke": Preset(
        "smoke", grid={"weighting": ["plain", "distribution"], "beta": [0.3]},
        train={"steps": 12, "batch_size": 16, "eval_every": 6, "eval_rows": 60, "decode_rows": 16,
               "warmup_backbone": 5},
        data=DataConfig(n_min=3, n_max=6, n_train=600, n_val=60, n_test=20),
        base=BaseTrainConfig(n_layer=1, n_embd=32, n_head=2, max_steps=150, eval_every=75, warmup_steps=20,
                             lr=3e-3, max_minutes=1.0)),
    # both sides of the prediction (issue 15): every weighting collapses without an aid where
    # theory predicts use; with the aid, distribution, example and token switch on there, and
    # plain at beta = 1, where theory predicts no use, ends with z unused. The aided runs first, so
    # the two workers finish together (<= 10 minutes on 2 cores)
    "default": Preset(
        "default", grid={"variant": [
            {"weighting": "distribution", "beta": 0.3, **_QUICK_AID},
            {"weighting": "example", "epsilon": 0.05, "beta": 0.3, **_QUICK_AID},
            # alpha 0.5 keeps every token supervised: at alpha = 1 the tokens the base model already
            # predicts get weight ~0 and the aided run's decoders drifted on them (rho_recon 3.2)
            {"weighting": "token", "token_outer": "distribution", "token_alpha": 0.5, "beta": 0.3, **_QUICK_AID},
            {"weighting": "plain", "beta": 1.0, **_QUICK_AID},
            {"weighting": "plain", "beta": 0.03, **_QUICK_PLAIN},
            {"weighting": "distribution", "beta": 0.3, **_QUICK_PLAIN},
            {"weighting": "example", "epsilon": 0.05, "beta": 0.3, **_QUICK_PLAIN},
            {"weighting": "token", "token_outer": "distribution", "token_alpha": 0.5, "beta": 0.3, **_QUICK_PLAIN},
        ]}, train={"batch_size": 64}),
    # the aids issue: the best aid on both sides of the prediction, the prototype's recipe, and the
    # aids that failed in the prototype (kept so the report shows them failing)
    "aided": Preset(
        "aided", grid={"variant": [
            {"weighting": "distribution", "beta": 0.3, **HARD_EM_RECIPE, **_BEST_RUN},
            {"weighting": "distribution", "beta": 0.3, **HARD_EM_RECIPE, **_BEST_RUN, "seed": 1},
            # the posterior that minimizes the objective for the current decoders (no amortized head)
            {"weighting": "distribution", "beta": 0.3, **HARD_EM_RECIPE, **_BEST_RUN, "posterior_features": "optimal"},
            {"weighting": "plain", "beta": 1.0, **HARD_EM_RECIPE, **_BEST_RUN},
            {"weighting": "distribution", "beta": 0.3, "aid": "hard_em_then_soft", "hard_em_max_steps": 600,
             "handover_check_every": 50, "handover_rows": 500, **_AIDED_RUN},
            {"weighting": "distribution", "beta": 0.3, "aid": "beta0_warmup", "warmup_aid_steps": 100,
             "steps": 300, "eval_every": 100, "eval_rows": 500},
            {"weighting": "distribution", "beta": 0.3, "aid": "random_init_jsd", "latent_init_std": 0.02,
             "lambda_jsd": 0.1, "steps": 300, "eval_every": 100, "eval_rows": 500},
        ]}, train={"batch_size": 64}),
    # the complete phase diagram (issue: notebook suite): 4 weightings x 5 betas x {discrete,
    # continuous, discrete + the best aid} = 60 runs; the aided runs first (the longest), so the two
    # workers finish together
    "full": Preset(
        "full", grid={"variant": [{"latent_kind": "discrete", **_PHASE_AID}, {"latent_kind": "discrete", **_PHASE_PLAIN},
                                  {"latent_kind": "continuous", **_PHASE_PLAIN}],
                      "weighting": _WEIGHTINGS, "beta": [0.03, 0.1, 0.3, 0.6, 1.0]},
        train={"batch_size": 64}),
    # the real-text benchmark (issue 14): E2E with its shipped base, every weighting with and without
    # the aid (the aided runs first, so the two workers finish together)
    "e2e": Preset(
        "e2e", grid={"variant": [{**w, "beta": _E2E_BETAS[w["weighting"]], **run}
                                 for run in (_E2E_AID, _E2E_PLAIN) for w in _WEIGHTINGS]},
        train={"batch_size": 32}, data_dir=SHIPPED_E2E, base_dir=SHIPPED_E2E / "base"),
}


def _prepare_data(preset: Preset, out: Path) -> Path:
    from zfree.data.synth import write_benchmark

    if preset.data_dir is not None:
        if not (preset.data_dir / "val.jsonl").exists():
            raise FileNotFoundError(f"preset {preset.name!r}: {preset.data_dir / 'val.jsonl'} does not exist")
        return preset.data_dir
    if preset.data is None:
        meta = read_json(SHIPPED_DATA / "metadata.json")
        for split, sha in meta["sha256"].items():
            if sha256_file(SHIPPED_DATA / f"{split}.jsonl") != sha:
                raise ValueError(f"{SHIPPED_DATA / (split + '.jsonl')}: sha256 does not match metadata.json")
        return SHIPPED_DATA
    return write_benchmark(preset.data, out / "data")


def _prepare_base(preset: Preset, out: Path, data_dir: Path, retrain: bool, progress: bool = True) -> Path:
    from zfree.train.base_training import train_base

    if preset.base_dir is not None:  # a shipped base used in place (small; its reference is hash-checked)
        return preset.base_dir
    base = out / "base"
    if (base / "reference" / "reference.json").exists() and (base / "model").exists():
        return base
    if preset.base is not None or retrain:
        if base.exists():
            shutil.rmtree(base)  # an unfinished base run (no reference yet) is rebuilt
        train_base(data_dir, base, preset.base or BaseTrainConfig(), threads=1, progress=progress)
        return base
    if not (SHIPPED_BASE / "reference" / "reference.json").exists():
        raise FileNotFoundError(f"the shipped base run {SHIPPED_BASE} has no reference/reference.json; "
                                "run with --retrain-base")
    tmp = out / ".base.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(SHIPPED_BASE, tmp)
    tmp.rename(base)
    return base


def run_study(preset: str, out_dir: Path | str, *, retrain_base: bool = False, workers: int | None = None,
              progress: bool = True) -> Path:
    """Run a preset end to end into ``out_dir``; returns the path of ``report.html``.

    Writes out_dir/{base/reference/reference.json, runs/<id>/, summary.csv, report.ipynb,
    report.html}. Finished runs are skipped; failed runs are listed and do not stop the others.
    Raises ValueError for an unknown preset (listing the valid ones); LockHeldError when another
    process is preparing the same study folder.
    """
    if preset not in PRESETS:
        raise ValueError(f"preset={preset!r} is not one of {sorted(PRESETS)}")
    p = PRESETS[preset]
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with run_folder_lock(out, "study folder"):  # one process prepares the data and the base run
        data_dir = _prepare_data(p, out)
        base_dir = _prepare_base(p, out, data_dir, retrain_base, progress)
    flat = {**TrainConfig().to_flat(), **p.train, "data_dir": str(data_dir), "base_dir": str(base_dir)}
    points = expand_grid(flat, p.grid)
    notes = None
    if p.data_dir is not None:  # real text: labels instead of strategies; notes for the report
        from zfree.data.pairs import load_pairs
        from zfree.experiment.study_notes import label_notes

        notes = label_notes(load_pairs(data_dir / "val.jsonl"), data_dir)
        atomic_write_json(out / "notes.json", {"notes": notes, "preset": p.name, "data": str(data_dir),
                                               "base": str(base_dir)})
    statuses = run_points(points, out / "runs", workers=workers or p.workers, progress=progress)
    failed = [s for s in statuses if s["status"] == "failed"]
    if notes is None:
        table = summary_table(collect_runs(out / "runs"))
        atomic_write_text(out / "summary.csv", table.to_csv(index=False))
    else:
        from zfree.experiment.study_notes import write_summary_csv

        table = write_summary_csv(out, notes)
    html = render_report(out, progress=progress)
    if progress:
        print(f"study {preset!r}: {len(table)} runs in {out} ({time.time() - t0:.0f} s); report: {html}")
    for f in failed:
        print(f"  FAILED {f['run_id']}: {f['error']}  (see {out / 'runs' / f['run_id'] / 'error.json'})")
    return html


REPORT_NOTEBOOKS = ("study_report", "sweep_beta_vs_recon_weight", "rate_distortion", "effective_beta", "rho_recon",
                    "training_dynamics", "switch_on")  # the sections of report.html, in order


def _combined_report(study_dir: Path, parts: list[Path]):
    """One notebook made of ``parts``: each part's parameters cell (untagged, its defaults kept)
    is followed by an injected ``sweep_dir = ...`` cell, so all sections run in one kernel."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for part in parts:
        for cell in nbformat.read(part, as_version=4).cells:
            tags = cell.get("metadata", {}).get("tags", [])
            cell.metadata.pop("tags", None)
            nb.cells.append(cell)
            if "parameters" in tags:
                nb.cells.append(nbformat.v4.new_code_cell(f"sweep_dir = {str(study_dir)!r}",
                                                          metadata={"tags": ["injected-parameters"]}))
    for i, cell in enumerate(nb.cells):  # the parts' own ids repeat across notebooks ('0', '1', ...)
        cell["id"] = f"cell-{i}"
    return nb


def render_report(study_dir: Path | str, notebook: Path | str | None = None, progress: bool = False) -> Path:
    """Aggregate a study or sweep folder (``zfree.experiment.results.aggregate``: runs.parquet, runs.csv,
    per_example.parquet, summary.csv), execute the report notebooks on it with papermill in one
    kernel (``REPORT_NOTEBOOKS``, or the one ``notebook``; their parameter ``sweep_dir`` set) and
    render ``report.html`` with nbconvert, code hidden. report.ipynb and report.html are written
    atomically; papermill's progress bar with ``progress``."""
    import nbformat
    import papermill as pm
    from nbconvert import HTMLExporter

    study_dir = Path(study_dir).resolve()
    if not (study_dir / "runs").is_dir():
        raise FileNotFoundError(f"{study_dir} has no runs/ folder: not a study or sweep folder")
    aggregate(study_dir)
    parts = [Path(notebook).resolve()] if notebook else [NOTEBOOKS / f"{n}.ipynb" for n in REPORT_NOTEBOOKS]
    if notebook is None and (study_dir / "notes.json").exists():  # an own-data study: labels, notes, samples
        parts.append(NOTEBOOKS / "labels_and_samples.ipynb")
    src, tmp_nb = study_dir / ".report.src.ipynb", study_dir / ".report.tmp.ipynb"
    nbformat.write(_combined_report(study_dir, parts), src)
    try:
        pm.execute_notebook(str(src), str(tmp_nb), kernel_name="python3", progress_bar=progress, log_output=False,
                            cwd=str(study_dir))
    finally:
        src.unlink(missing_ok=True)
    tmp_nb.replace(study_dir / "report.ipynb")
    exporter = HTMLExporter(exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(nbformat.read(study_dir / "report.ipynb", as_version=4))
    atomic_write_text(study_dir / "report.html", body)
    return study_dir / "report.html"
