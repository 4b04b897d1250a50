"""The e2e-smollm2 study's planned run configs without training any (the study pipeline's own preparation
and points: ``zfree_lab.experiment.pipeline.prepare`` and ``_points``): DIR/planned/<run id>/config.json for the
aided run, its z-free control and the `complete` oracle, so a variant can be trained from them with
``zfree train --config ... --set ...`` in a folder that holds no finished study (variant 3 was trained so).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 .venv/bin/python analysis/results/e2e-smollm2/plan_configs.py runs/e2e-smollm2
"""
import dataclasses, json, sys
from pathlib import Path
from zfree_lab.experiment.own_study import BOUND_PRESETS, OWN_PRESETS
from zfree_lab.experiment.pipeline import prepare, _points
from zfree_lab.experiment.spec import BaseSource
from zfree_lab.run.fetch import fetch_model

out = Path(sys.argv[1]).resolve()
name, data, val = BOUND_PRESETS["e2e-smollm2"]
p = OWN_PRESETS["e2e-smollm2"]
p = dataclasses.replace(p, data=dataclasses.replace(p.data, kind="jsonl", path=Path(data), val=Path(val)),
                        base=BaseSource("pretrained", path=str(fetch_model(name)), finetune_steps=0))
out.mkdir(parents=True, exist_ok=True)
prep = prepare(p, out)
pts = _points(p, prep, out)
for pt in pts:
    d = out / "planned" / pt.run_id
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(pt.params, indent=1, default=str))
    print(pt.run_id)
