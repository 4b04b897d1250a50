"""analysis/results/oracle-routes-synth/trace_steps.py on a tiny label-oracle run: it replays the run's own
batches (the loop's logged loss of each step equals the trace's packed loss of the batch it drew), and on those
batches the packed and padded training steps agree (loss and every gradient), as on the benchmark's run."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.scripts import load_script
from tests.tiny import tiny_flat

SCRIPT = Path(__file__).resolve().parents[1] / "analysis" / "results" / "oracle-routes-synth" / "trace_steps.py"


@pytest.fixture(scope="module")
def trace_module():
    return load_script(SCRIPT, "trace_steps")


def test_the_trace_replays_the_runs_batches_and_finds_the_layouts_equal(tiny_run, trace_module, tmp_path):
    data, base = tiny_run
    flat = tiny_flat(data, base, steps=6, device="cpu", latent_source="label:strategy", n_latent=4, beta=0.0,
                     weighting="distribution", injection="embedding", lr_new=1e-2, tensorboard=False)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(flat))
    out_csv = tmp_path / "trace.csv"
    assert trace_module.main(str(cfg), str(data), str(tmp_path / "run"), str(out_csv), 1, every=3) == 0
    t = pd.read_csv(out_csv)
    assert list(t.columns) == trace_module.FIELDS
    assert t.step.tolist() == list(range(1, 7))
    assert t.packed.all()  # "on" took the packed rows (else both sides would be the padded step)
    assert t.logged.tolist() == pytest.approx(t.loss_packed.tolist(), rel=1e-6)  # the step's own batch
    assert (t.loss_packed - t.loss_padded).abs().max() < 1e-6
    assert t.grad_rel_max.max() < 1e-3
    read = t.val_rows_loss.notna()
    assert read.any() and ((t.val_rows_loss - t.val_rows_loss_padded)[read].abs() < 1e-6).all()
    assert t.val_rows_loss_after.notna().tolist() == [False] * 5 + [True]  # read after the last update only
    assert (tmp_path / "run" / "summary.json").exists()
