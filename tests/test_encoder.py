"""The separate posterior encoder (posterior_features='encoder'): the decoder contract is untouched,
padding changes nothing, the posterior reads y, and its parameters train in the 'new' group."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.tiny import PAIRS
from zfree.config import ModelConfig, TrainConfig
from zfree.data.batching import collate, encode_pair
from zfree.data.pairs import Pair
from zfree.models.base import target_logprobs
from zfree.models.continuous import ContinuousCVAE
from zfree.models.discrete import DiscreteCVAE
from zfree_lab.run.run_setup import build_optimizer


@pytest.fixture(scope="module")
def setup(tiny_lm):
    return tiny_lm(n_layer=1, seed=2)  # (base in eval mode, tok, batch of PAIRS)


def test_discrete_with_encoder_keeps_step0_contract_and_ignores_padding(setup):
    base, tok, batch = setup
    model = DiscreteCVAE(copy.deepcopy(base), n_latent=3, posterior_features="encoder").eval()
    out = model(batch)
    ref = target_logprobs(base, batch)
    for k in range(3):
        torch.testing.assert_close(out.target_logprobs[:, k], ref, atol=1e-6, rtol=0)
    assert out.features.shape == (len(PAIRS), 32)
    assert not torch.allclose(out.posterior_logits[0], out.posterior_logits[1])  # symmetry breaks
    for r, p in enumerate(PAIRS):
        alone = model(collate([encode_pair(tok, p)], pad_id=tok.pad_token_id))
        torch.testing.assert_close(out.posterior_logits[r], alone.posterior_logits[0], atol=1e-5, rtol=0)
    a = model(collate([encode_pair(tok, Pair("a", "1 2 3", "3 2 1"))]))
    b = model(collate([encode_pair(tok, Pair("a", "1 2 3", "1 2 3"))]))
    assert not torch.allclose(a.posterior_logits, b.posterior_logits)  # the encoder reads y


def test_encoder_parameters_train_in_the_new_group(setup):
    base, tok, batch = setup
    model = DiscreteCVAE(copy.deepcopy(base), n_latent=2, posterior_features="encoder")
    opt = build_optimizer(model, TrainConfig().optim, log=None)
    new = {id(p) for p in opt.param_groups[1]["params"]}
    enc = list(model.encoder.parameters())
    assert enc and all(id(p) in new for p in enc)
    torch.log_softmax(model(batch).posterior_logits, -1)[:, 0].sum().backward()
    assert model.encoder.token_embedding.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("features", ContinuousCVAE.FEATURES)
def test_continuous_posterior_features_choices(setup, features):
    base, tok, batch = setup
    model = ContinuousCVAE(copy.deepcopy(base), d_latent=3, posterior_features=features, n_samples=2)
    out = model(batch)
    assert out.posterior_mean.shape == (len(PAIRS), 3)
    torch.testing.assert_close(out.target_logprobs[:, 1], target_logprobs(base, batch), atol=1e-6, rtol=0)


def test_config_accepts_encoder():
    assert ModelConfig(posterior_features="encoder").posterior_features == "encoder"
