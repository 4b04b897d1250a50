"""``compile: true`` (issue 56, item 4): the backbone's body under torch.compile gives eager's results.

The compiled run uses the ``aot_eager`` backend (``zfree_lab.run.run_setup.COMPILE_BACKEND``): dynamo's
tracing and the compiled autograd graph, without inductor's code generation, which takes minutes per
graph on a loaded CPU (on the tiny model, inductor's compiled step matched eager's loss to 2.4e-7 and its
gradients to 9e-8, run by hand). Skipped where torch.compile cannot run.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.tiny import tiny_flat
from zfree.config import TrainConfig

dynamo = pytest.importorskip("torch._dynamo")
pytestmark = pytest.mark.skipif(not dynamo.is_dynamo_supported(), reason="torch.compile is not supported here")

#: relative difference allowed between a compiled run's logged losses and eager's (float32; aot_eager
#: runs the same kernels in a traced order, so the runs measured here agree to ~1e-7)
COMPILE_RTOL = 1e-5


def test_compile_is_a_validated_config_field_off_by_default():
    assert TrainConfig().optim.compile is False
    assert TrainConfig().replace(compile=True).optim.compile is True
    with pytest.raises(ValueError, match="compile"):
        TrainConfig().replace(compile="maybe")


@pytest.mark.slow  # ~140 s of compilation on a shared 2-core machine: the slow tier (make test-slow)
def test_a_compiled_run_equals_the_eager_run(tiny_run, tmp_path, monkeypatch):
    from zfree.core.io import read_jsonl
    from zfree_lab.run import run_setup
    from zfree_lab.run.training import train_cvae

    from zfree.models import packing

    monkeypatch.setattr(run_setup, "COMPILE_BACKEND", "aot_eager")
    # a compiled body takes the padded passes (``packing_problem``: packed rows are not traced); the eager run
    # takes them too, so both do the same work and their forward tokens compare (packed = padded within float
    # rounding is tests/test_packing.py's)
    monkeypatch.setattr(packing, "PACKING", "off")
    data, base = tiny_run
    kw = dict(device="cpu", steps=2, eval_every=2, eval_rows=8, decode_rows=0, batch_size=4,
              latent_source="control", n_latent=1, beta=0.0)
    calls = []
    real = run_setup.compile_body
    monkeypatch.setattr(run_setup, "compile_body", lambda m: calls.append(1) or real(m))
    runs = {c: train_cvae(TrainConfig.from_flat(tiny_flat(data, base, compile=c, **kw)), tmp_path / str(c),
                          progress=False) for c in (False, True)}
    torch._dynamo.reset()
    assert calls == [1]  # the compiled run compiled its body; the eager one did not
    eager, comp = (read_jsonl(tmp_path / str(c) / "metrics.jsonl") for c in (False, True))
    assert [r["step"] for r in comp] == [r["step"] for r in eager] == [0, 2]
    for a, b in zip(eager, comp):
        for k, v in a.items():
            if k.startswith("loss/") and isinstance(v, float) and math.isfinite(v):
                assert b[k] == pytest.approx(v, rel=COMPILE_RTOL, abs=1e-7), k
    assert runs[True]["compute/forward_tokens"] == runs[False]["compute/forward_tokens"]
