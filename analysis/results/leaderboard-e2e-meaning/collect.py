"""What z carries on the leaderboard-e2e switch-on runs (issue 39): from a study folder made by run.py (or
by ``zfree study --preset leaderboard-e2e``), per switch-on run its z gain against its own control
(``gains.csv``), measured use, the derived properties that pass the permutation test
(``latent_meaning.json``) and one descriptive sentence per value. Writes properties.csv and values.csv
beside this file and prints them.

    .venv/bin/python analysis/results/leaderboard-e2e-meaning/collect.py runs/lb-e2e-switch
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent


def main(study: Path) -> None:
    gains = pd.read_csv(study / "gains.csv").set_index("run_id")
    summary = pd.read_csv(study / "summary.csv").set_index("run_id")
    props, values = [], []
    for run in sorted((study / "runs").iterdir()):
        f = run / "latent_meaning.json"
        if run.name not in gains.index or not f.exists() or "hard_em_then_soft" not in run.name:
            continue
        m = json.loads(f.read_text())
        g = gains.loc[run.name]
        head = {"run_id": run.name, "seed": json.loads((run / "config.json").read_text()).get("seed"),
                "z_gain": g["z_gain"], "z_gain_lo": g["z_gain_lo"], "z_gain_hi": g["z_gain_hi"], "rate": g["rate"],
                "measured_use": summary.loc[run.name, "measured_use_fraction"],
                "decoder_uses_z": m["decoder_uses_z"]}
        for p in m["properties"]:
            props.append({**head, **{k: p[k] for k in ("property", "levels", "mi", "nmi", "null95", "p_value",
                                                        "mi_posterior", "passes")}})
        for v in m["values"]:
            values.append({"run_id": run.name, "seed": head["seed"], "value": v["value"], "sentence": v.get("sentence")})
    props, values = pd.DataFrame(props), pd.DataFrame(values)
    props.to_csv(HERE / "properties.csv", index=False)
    values.to_csv(HERE / "values.csv", index=False)
    with pd.option_context("display.width", 200, "display.max_colwidth", 140):
        print(props[props["passes"]].round(4).to_string(index=False))
        print(values.to_string(index=False))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/lb-e2e-switch").resolve())
