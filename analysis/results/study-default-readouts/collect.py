"""Copy a finished default study's readout tables here, without machine paths (issue 54).

    .venv/bin/python analysis/results/study-default-readouts/collect.py STUDY_DIR

Writes gains.csv (one row per CVAE run: z gain, rate, within-model use, net gain, gain - rate, each with its
row interval), available_gain.csv (the strategy oracle and its null), seed_gains.csv and seed_rows.parquet
(the per-row paired table every number above is a mean of; ``tests/test_shipped_results.py`` recomputes
them) and runs.csv (each run's settings: steps, lr_new, K, posterior, aid, seed). 1 seed: the default study.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).parent
#: the settings a reader needs to see what each arm trained, beside its id
SETTINGS = ["run_id", "weighting", "beta", "aid", "seed", "steps", "lr_new", "n_latent", "posterior_features",
            "codes_used", "mutual_information", "kl_prior_loss"]


def main(study: Path) -> None:
    gains = pd.read_csv(study / "gains.csv")
    drop = [c for c in gains if c.endswith("_dir") or c == "run_dir"]
    gains.drop(columns=drop).to_csv(HERE / "gains.csv", index=False)
    pd.read_csv(study / "available_gain.csv").to_csv(HERE / "available_gain.csv", index=False)
    pd.read_csv(study / "seed_gains.csv").to_csv(HERE / "seed_gains.csv", index=False)
    pd.read_parquet(study / "seed_rows.parquet").to_parquet(HERE / "seed_rows.parquet", index=False)
    summary = pd.read_csv(study / "summary.csv")
    summary[[c for c in SETTINGS if c in summary]].to_csv(HERE / "runs.csv", index=False)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
