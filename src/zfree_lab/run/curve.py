"""The training curve of a run: ``curve.jsonl`` in the run folder, one row every ``CURVE_EVERY``
steps (and at the last step) with the mean of each training term over the steps since the previous
row (``n`` of them): ``loss/train/reconstruction_loss`` (the distortion D on the training batches,
nats per token), ``loss/train/kl_prior_loss`` (the rate, nats per example), the objective and its
weights, exactly the keys metrics.jsonl averages between evaluations
(``zfree.objective.objectives.Breakdown.log_tensors``). Unlike metrics.jsonl, whose training terms
are averaged over a whole evaluation interval (a z-free control is evaluated at step 0 and the end
only), it shows where a run's D flattens. The sums stay on the device; a row costs one host copy per
term every ``CURVE_EVERY`` steps. On resume, rows after the checkpoint's step are dropped and the
first row after it averages only the steps run since (its ``n`` says how many).
"""

from __future__ import annotations

import json
from pathlib import Path

from zfree.core.io import append_jsonl, atomic_write_text, read_jsonl

CURVE_FILE = "curve.jsonl"
#: steps between two rows of curve.jsonl
CURVE_EVERY = 10


class TrainCurve:
    """Window sums of a run's training terms, written to ``out/curve.jsonl`` (module docstring)."""

    def __init__(self, out: Path, resumed_step: int | None, every: int = CURVE_EVERY):
        """Start the curve of ``out``: the file removed for a fresh run (``resumed_step`` None), cut
        to the rows up to ``resumed_step`` for a resumed one. ``every``: steps per row (>= 1)."""
        self.path, self.every, self.sums, self.n = Path(out) / CURVE_FILE, max(1, int(every)), {}, 0
        if resumed_step is None:
            self.path.unlink(missing_ok=True)
        elif self.path.exists():
            rows = [r for r in read_jsonl(self.path, drop_torn_tail=True) if r["step"] <= resumed_step]
            atomic_write_text(self.path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))

    def add(self, step: int, terms: dict, last: bool) -> dict | None:
        """Add one step's terms (``log_tensors``: 0-dim tensors or floats); at every ``every``-th step
        and at the ``last`` one, append the window's means as a row and return it (else None)."""
        for k, v in terms.items():
            self.sums[k] = self.sums.get(k, 0.0) + v
        self.n += 1
        if not (step % self.every == 0 or last):
            return None
        row = {"step": step, "n": self.n, **{k: float(v) / self.n for k, v in self.sums.items()}}
        append_jsonl(self.path, row)
        self.sums, self.n = {}, 0
        return row


def read_curve(run_dir: Path | str) -> list[dict]:
    """The rows of a run's curve.jsonl ([] when the run wrote none: a run from before it existed)."""
    p = Path(run_dir) / CURVE_FILE
    return read_jsonl(p, drop_torn_tail=True) if p.exists() else []
