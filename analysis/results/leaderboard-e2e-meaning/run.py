"""Issue 39: the leaderboard-e2e study's switch_on_e2e runs only (3 seeds), their z-free controls and the
first_slot oracle, through the study pipeline (zfree_lab.experiment.pipeline.run_experiment with its points
filtered), so the report reads what z carries on those runs."""
import sys
from pathlib import Path
from zfree.config import LatentSource
from zfree_lab.experiment import pipeline
from zfree_lab.experiment.controls import control_params, given_run_id
from zfree_lab.experiment.spec_file import shipped_presets

orig = pipeline._points


def switch_on_only(spec, prep, out=None):
    pts = orig(spec, prep, out)
    runs = [p for p in pts if p.params.get("remedy") == "switch_on_e2e" and p.params["latent_source"] == "posterior"]
    keep = {p.run_id for p in runs} | {given_run_id(control_params(p.params)) for p in runs}
    keep |= {p.run_id for p in pts if LatentSource.parse(p.params["latent_source"]).kind == "label"}
    return [p for p in pts if p.run_id in keep]


pipeline._points = switch_on_only
res = pipeline.run_experiment(shipped_presets()["leaderboard-e2e"], Path(sys.argv[1]), workers=2)
print(res.html, res.n_runs)
