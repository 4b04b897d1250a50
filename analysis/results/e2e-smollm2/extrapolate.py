"""How many steps would the `complete` oracle need to catch up with its own z-free control? An
extrapolation from the training curves of an oracle and its control (``curve.jsonl``: 10-step window
means of the reconstruction loss, nats/token, on the same batches, since both share the seed), for
issue 37's "what would be needed".

gap(t) = recon_control(t) - recon_oracle(t), per window, on the same batches (> 0: the oracle ahead).
An ordinary least-squares line gap ~ a + b t is fitted to the windows of the second half of training
(the first half holds the fast initial drop); its 95 % interval on b is the OLS t interval (scipy's
``linregress`` standard error, n - 2 degrees of freedom). The step where the line reaches 0 is
reported when b's interval lies above 0, with the wall time at the measured seconds per step;
otherwise: "no trend towards 0 within the interval".

    .venv/bin/python analysis/results/e2e-smollm2/extrapolate.py \\
        runs/e2e-smollm2/runs/variant-lora32all-oracle-complete_distribution \\
        runs/e2e-smollm2/runs/variant-lora32all-control_distribution
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

KEY = "loss/train/reconstruction_loss"


def gap_table(oracle: Path, control: Path) -> pd.DataFrame:
    """Per 10-step window: step, the control's and the oracle's train reconstruction (nats/token), gap."""
    o = pd.read_json(oracle / "curve.jsonl", lines=True).set_index("step")[KEY]
    c = pd.read_json(control / "curve.jsonl", lines=True).set_index("step")[KEY]
    t = pd.DataFrame({"control": c, "oracle": o}).dropna()
    return t.assign(gap=t["control"] - t["oracle"]).reset_index()


def extrapolate(t: pd.DataFrame, step_s: float | None) -> dict:
    """The OLS fit of gap on step over the second half of the windows, and the step (and hours at
    ``step_s`` s/step) where it would reach 0."""
    late = t[t["step"] > t["step"].max() / 2]
    fit = stats.linregress(late["step"], late["gap"])
    q = stats.t.ppf(0.975, len(late) - 2)
    lo, hi = fit.slope - q * fit.stderr, fit.slope + q * fit.stderr
    out = {"windows": len(late), "from_step": int(late["step"].min()), "to_step": int(late["step"].max()),
           "mean_gap": float(late["gap"].mean()), "slope_per_1000_steps": 1000 * fit.slope,
           "slope_lo": 1000 * lo, "slope_hi": 1000 * hi, "intercept": fit.intercept}
    if lo > 0 and out["mean_gap"] < 0:
        zero = -fit.intercept / fit.slope
        out.update(zero_step=float(zero), hours=None if step_s is None else zero * step_s / 3600)
    return out


def main(oracle: Path, control: Path) -> None:
    t = gap_table(oracle, control)
    s = json.loads((oracle / "summary.json").read_text()) if (oracle / "summary.json").exists() else {}
    step_s = s["wall_s"] / s["steps"] if s.get("wall_s") and s.get("steps") else None
    r = extrapolate(t, step_s)
    print(t.round(4).to_string(index=False))
    print(json.dumps(r, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
