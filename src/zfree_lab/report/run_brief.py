"""What ``zfree train`` prints when a run ends: a few lines a researcher reads at a glance (did z switch on,
what it cost, what it buys inside the model), instead of the summary's ~70 metrics as JSON; those stay in
``RUN/summary.json`` and ``zfree train ... --json`` prints them (docs/concepts/metrics.md names each)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

from zfree_lab.report.report import use_side
from zfree_lab.run.run_config import USE_THRESHOLD


def _num(summary: Mapping[str, Any], key: str) -> float:
    """The metric ``key`` as a float; NaN where it is absent or null (a run without readouts, labels, ...)."""
    v = summary.get(key)
    try:
        return float(v) if v is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


def _f(v: float, digits: int = 3) -> str:
    if math.isnan(v):
        return "–"
    out = f"{v:.{digits}f}"
    return out[1:] if out.startswith("-") and float(out) == 0 else out  # -0.0000: a rounded float noise's sign


def _pct(v: float) -> str:
    return "–" if math.isnan(v) else f"{100 * v:.0f}%"


def use_verdict(measured: float, predicted: float, threshold: float = USE_THRESHOLD) -> str:
    """One phrase: whether z was used (on more than ``threshold`` of the rows) and whether theory said it would."""
    side, expected = use_side(measured, threshold), use_side(predicted, threshold)  # the report's own rule
    if side == "unknown":
        return "z's use unknown (no per-row KL)"
    used = side == "use"
    said = "" if expected == "unknown" else (
        ", as theory predicts" if side == expected else
        ", where theory predicts no use" if used else ", where theory predicts use")
    return ("z switched on" if used else "z unused (collapsed)") + said


def run_brief(summary: Mapping[str, Any], run_dir: Path | str) -> list[str]:
    """The lines ``zfree train`` prints for the finished run ``run_dir`` from its ``summary`` (summary.json's
    dict): D against the z-free model on the same rows, the rate, −ELBO and the marginal NLL (nats per example),
    the use verdict, mutual information and codes used, and the within-model readouts (another row's z, z from
    the prior). A metric the run did not compute reads "–"."""
    s = summary
    steps = s.get("steps", "?")
    wall = _num(s, "compute/train_wall_s")
    k = s.get("n_latent", "?")
    measured, predicted = _num(s, "latent/measured_use_fraction"), _num(s, "latent/predicted_use_fraction")
    return [
        f"run {run_dir}: {steps} steps ({_f(wall, 1)} s of training)",
        f"  D {_f(_num(s, 'loss/val/reconstruction_loss'))} nats/token against the z-free model's "
        f"{_f(_num(s, 'loss/val/zfree_reconstruction_loss'))} on the same rows "
        f"(rho_recon {_f(_num(s, 'loss/val/baseline_normalized_reconstruction_loss'))})",
        f"  rate {_f(_num(s, 'loss/val/kl_prior_loss'), 4)} nats/example; -ELBO "
        f"{_f(_num(s, 'loss/val/neg_elbo_nats_per_sequence'))}, marginal NLL {_f(_num(s, 'readout/marginal_nll'))} "
        "nats/example",
        f"  {use_verdict(measured, predicted)}: used on {_pct(measured)} of rows (predicted {_pct(predicted)}); "
        f"mutual information {_f(_num(s, 'latent/mutual_information'), 4)} nats, "
        f"{s.get('latent/codes_used', '–')} of {k} codes used",
        f"  inside the model: another row's z costs {_f(_num(s, 'readout/use_shuffled'), 4)} nats/example, "
        f"z from the prior {_f(_num(s, 'readout/use_prior'), 4)}",
        f"  every metric: {Path(run_dir) / 'summary.json'} (`zfree train ... --json` prints them)",
        "  z's gain is read against a z-free control trained the same way: `zfree study` trains one beside each run",
    ]
