"""The shipped result tables whose headline numbers the code can recompute cheaply are recomputed:
each leaderboard from its shipped per-run summary (``zfree.experiment.leaderboard.leaderboard``), and
every z-gain interval the README quotes from it. (Re-running the studies themselves takes minutes to
hours: analysis/results/README.md says which commit and command measured each.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from zfree.experiment.leaderboard import leaderboard

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "analysis" / "results"
BOARDS = ("leaderboard", "leaderboard-e2e")
KEY = ["remedy", "weighting", "beta"]


@pytest.mark.parametrize("name", BOARDS)
def test_a_shipped_leaderboard_is_its_summary_aggregated(name):
    shipped = pd.read_csv(RESULTS / f"{name}-leaderboard.csv")
    now = leaderboard(pd.read_csv(RESULTS / f"{name}-summary.csv"))
    assert sorted(map(tuple, shipped[KEY].to_numpy())) == sorted(map(tuple, now[KEY].to_numpy()))
    both = shipped.merge(now, on=KEY, suffixes=("_shipped", "_now"))
    numeric = [c for c in shipped.columns if c not in KEY and pd.api.types.is_numeric_dtype(shipped[c])
               and c in now.columns and c not in ("train_wall_s", "train_wall_ratio")]  # wall times: not re-derived
    assert {"z_gain", "z_gain_lo", "z_gain_hi", "rate", "alignment_nmi", "z_used_share", "rank"} <= set(numeric)
    for c in numeric:
        np.testing.assert_allclose(both[f"{c}_now"].astype(float), both[f"{c}_shipped"].astype(float), rtol=1e-9,
                                   atol=1e-12, equal_nan=True, err_msg=f"{name}: {c}")


@pytest.mark.parametrize("name", BOARDS)
def test_every_z_gain_the_readme_quotes_is_the_recomputed_one(name):
    readme = (ROOT / "README.md").read_text()
    board = leaderboard(pd.read_csv(RESULTS / f"{name}-summary.csv"))
    missing = [f"{r.remedy}/{r.weighting}/{r.beta}: {r.z_gain:.3g} [{r.z_gain_lo:.3g}, {r.z_gain_hi:.3g}]"
               for r in board.itertuples() if f"{r.z_gain:.3g} [{r.z_gain_lo:.3g}, {r.z_gain_hi:.3g}]" not in readme]
    assert not missing, f"README does not quote the recomputed z gain of: {missing}"
