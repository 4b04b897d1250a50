"""analysis/results/e2e-smollm2/latent_scale.py on a tiny saved checkpoint: the vectors it measures are
the ones the injection route receives (``DiscreteCVAE.latent_vectors``) under both ``latent_capacity``
settings; under ``shared_delta`` (value k's vector s + δ_k) it read the deltas alone before."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.tiny import tiny_gpt2
from tests.scripts import load_script
from zfree.models.discrete import DiscreteCVAE
from zfree_lab.run.checkpoint import save_checkpoint
from zfree_lab.run.run_setup import TrainState

SCRIPT = Path(__file__).resolve().parents[1] / "analysis" / "results" / "e2e-smollm2" / "latent_scale.py"
K = 3


def _script():
    return load_script(SCRIPT, "e2e_latent_scale")


@pytest.mark.parametrize("capacity", ["per_value", "shared_delta"])
def test_latent_scale_reads_the_vectors_the_route_receives(tmp_path, capacity):
    base, _ = tiny_gpt2(folder=tmp_path / "base")
    model = DiscreteCVAE(base, n_latent=K, latent_capacity=capacity)
    torch.manual_seed(0)
    with torch.no_grad():
        model.latent_embedding.weight.normal_(std=0.5)
        if capacity == "shared_delta":
            model.latent_shared.normal_(std=2.0)  # large next to the deltas: leaving it out shows
    save_checkpoint(tmp_path / "run", model, torch.optim.SGD(model.parameters(), lr=0.1), np.random.default_rng(0),
                    TrainState(step=7))
    out = _script().latent_scale(tmp_path / "run", tmp_path / "base")
    with torch.no_grad():
        u = model.latent_vectors(torch.arange(K)).numpy()
    assert out["latent_capacity"] == capacity and out["checkpoint_step"] == 7
    np.testing.assert_allclose(out["latent_norms"], np.linalg.norm(u, axis=1), rtol=1e-6)
    unit = u / np.linalg.norm(u, axis=1, keepdims=True)
    np.testing.assert_allclose([p["cosine"] for p in out["pairs"]], [unit[0] @ unit[1], unit[0] @ unit[2],
                                                                      unit[1] @ unit[2]], rtol=1e-5, atol=1e-6)
    deltas = model.latent_embedding.weight.detach().numpy()
    np.testing.assert_allclose([p["difference_norm"] for p in out["pairs"]],
                               [np.linalg.norm(deltas[i] - deltas[j]) for i, j in ((0, 1), (0, 2), (1, 2))], rtol=1e-5)
    wte = base.get_input_embeddings().weight.detach().numpy()
    assert out["token_norm_median"] == pytest.approx(float(np.median(np.linalg.norm(wte, axis=1))), rel=1e-6)
    if capacity == "shared_delta":
        assert out["shared_norm"] == pytest.approx(float(model.latent_shared.detach().norm()), rel=1e-6)
        np.testing.assert_allclose(out["delta_norms"], np.linalg.norm(deltas, axis=1), rtol=1e-6)
    else:
        assert "shared_norm" not in out
