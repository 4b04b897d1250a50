"""zfree.train.aids (imported by no test before): the warm-phase switches, the hard phase's rate,
argmax usage counts against a numpy bincount, dead-value restarts on a recording model, the
frozen-decoder gradient mask, and the hand-over gate of a step-0 discrete CVAE against its closed
form (every latent value decodes as the base model, so the oracle nll is the base surprisal b)."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.tiny import PAIRS
from zfree.config import TrainConfig
from zfree.data.batching import encode_pair
from zfree.models.base import target_logprobs
from zfree.models.nll import masked_mean_token_nll
from zfree.train.aids import (POSTERIOR_SIDE, FrozenDecoderMask, beta0_warm, check_handover, count_usage,
                              frozen_decoder_phase, handover_gate, new_lr, restart_dead_values)
from zfree.train.plugins import initial_phase


def _cfg(**kw) -> TrainConfig:
    return TrainConfig.from_flat({**TrainConfig().to_flat(), **kw})


def test_warm_phase_switches_and_the_hard_phase_rate():
    warm = _cfg(aid="beta0_warmup", warmup_aid_steps=3)
    assert [beta0_warm(warm, s) for s in (0, 3, 4)] == [True, True, False]
    assert not beta0_warm(_cfg(warmup_aid_steps=3), 0)  # only under that aid
    frozen = _cfg(frozen_decoder_steps=2)
    assert [frozen_decoder_phase(frozen, s) for s in (1, 2, 3)] == [True, True, False]
    hard = _cfg(aid="hard_em_then_soft", hard_em_lr_new=0.5, lr_new=0.01)
    assert initial_phase(hard) == "hard" and initial_phase(_cfg()) == "soft"
    assert new_lr(hard, "hard") == 0.5 and new_lr(hard, "soft") == 0.01
    assert new_lr(_cfg(aid="hard_em_then_soft", hard_em_lr_new=0.0, lr_new=0.02), "hard") == 0.02  # unset: lr_new


@given(st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=10), min_size=1, max_size=4), st.booleans())
def test_count_usage_adds_up_to_a_bincount(batches, restored):
    state = SimpleNamespace(usage=[1, 0, 0, 0, 2] if restored else [])
    for z in batches:
        count_usage(state, torch.tensor(z), 5)
    want = np.bincount(np.concatenate(batches), minlength=5) + (np.array([1, 0, 0, 0, 2]) if restored else 0)
    assert isinstance(state.usage, torch.Tensor) and state.usage.tolist() == want.tolist()


class _Recorder:
    n_latent = 4

    def __init__(self):
        self.calls = []

    def restart_values(self, dead, donor):
        self.calls.append((dead, donor))


def test_restart_dead_values_copies_the_most_used_into_the_rare_ones():
    cfg = _cfg(restart_dead_every=2, restart_dead_share=0.5)  # dead: share < 0.5 / 4
    model, state = _Recorder(), SimpleNamespace(usage=torch.tensor([10, 1, 6, 3]), restarts=[])
    restart_dead_values(model, cfg, state, 3)  # not a check step: nothing
    assert model.calls == [] and state.usage.tolist() == [10, 1, 6, 3]
    restart_dead_values(model, cfg, state, 4)  # shares 0.5, 0.05, 0.3, 0.15
    assert model.calls == [([1], 0)] and state.restarts == [{"step": 4, "dead": [1], "donor": 0}]
    assert state.usage == []  # the counts restart
    restart_dead_values(model, cfg, state, 6)  # no counts since: nothing
    assert len(model.calls) == 1


@pytest.fixture(scope="module")
def step0(tiny_lm):
    from zfree.models.discrete import DiscreteCVAE

    base, tok, batch = tiny_lm(n_layer=1, seed=2)
    model = DiscreteCVAE(copy.deepcopy(base), n_latent=3)
    b = masked_mean_token_nll(-target_logprobs(base, batch), batch.target_mask).detach().double().numpy()
    return model, tok, [encode_pair(tok, p) for p in PAIRS], b


def test_frozen_decoder_mask_keeps_only_the_posterior_side(step0):
    model, tok, enc, _ = step0
    model = copy.deepcopy(model)
    from zfree.data.batching import collate

    out = model(collate(enc, pad_id=tok.pad_token_id))
    (out.posterior_logits.sum() + out.prior_logits.sum() + out.target_logprobs.sum()).backward()
    FrozenDecoderMask(model).drop("posterior")
    for name, p in model.named_parameters():
        if name.split(".")[0] not in POSTERIOR_SIDE:
            assert p.grad is None, name
    assert any(p.grad is not None for n, p in model.named_parameters() if n.split(".")[0] in POSTERIOR_SIDE)


def test_handover_gate_at_step_0_is_the_closed_form(step0):
    model, tok, enc, b = step0
    c_base = float(b.mean())
    cfg = _cfg(weighting="plain", beta=0.25)
    g = handover_gate(model, enc, b, cfg, c_base, tok.pad_token_id)
    assert g["kl_estimate"] == pytest.approx(math.log(3))
    assert g["oracle_rho"] == pytest.approx(1.0, abs=1e-6)  # min_k nll_k = b at step 0
    assert g["collapsed_objective"] == pytest.approx(b.mean(), rel=1e-12)  # plain: w = 1
    assert g["best_objective"] == pytest.approx(b.mean() + 0.25 * math.log(3), abs=1e-6)
    assert g["pass"] is False and model.training  # the model's mode is restored
    state = SimpleNamespace(gate=[], phase="hard", handover_step=None, handover_forced=False)
    hard = _cfg(weighting="plain", beta=0.25, aid="hard_em_then_soft", handover_check_every=2, hard_em_max_steps=4)
    check_handover(model, hard, state, 1, enc, b, c_base, tok.pad_token_id)  # not a check step
    assert state.gate == []
    check_handover(model, hard, state, 2, enc, b, c_base, tok.pad_token_id)
    assert [r["step"] for r in state.gate] == [2] and state.phase == "hard"
    check_handover(model, hard, state, 4, enc, b, c_base, tok.pad_token_id)  # the budget: forced
    assert (state.phase, state.handover_step, state.handover_forced) == ("soft", 4, True)


class _FixedNLL(torch.nn.Module):
    """A stand-in decoder whose per-token NLL of value k on row i is ``nll[i, k]`` at every position."""

    def __init__(self, nll):
        super().__init__()
        self.nll = torch.as_tensor(nll, dtype=torch.float32)
        self.n_latent = self.nll.shape[1]
        self.p = torch.nn.Parameter(torch.zeros(1))

    def forward(self, batch):
        rows, t = batch.target_mask.shape
        lp = -self.nll[:rows, :, None].expand(rows, self.n_latent, t)
        return SimpleNamespace(target_logprobs=lp, prior_logits=torch.zeros(rows, self.n_latent))


@pytest.mark.parametrize("reference", ["base", "single_value"])
def test_the_gate_against_the_decoders_own_single_value_ignores_what_fine_tuning_alone_bought(step0, reference):
    """A decoder fine-tuned so that every value reconstructs at 1 nat/token (nothing depends on z) beats
    the base's collapse at b = 5 nats/token: the ``base`` gate passes, the ``single_value`` gate does
    not. Values that split the rows (1 vs 3 nats) pass both."""
    _, tok, enc, _ = step0
    n = len(enc)
    b = np.full(n, 5.0)
    cfg = _cfg(weighting="plain", beta=0.0, handover_margin=0.3, handover_reference=reference)
    same = handover_gate(_FixedNLL(np.ones((n, 2))), enc, b, cfg, 5.0, tok.pad_token_id)
    assert same["best_objective"] == pytest.approx(1.0)
    assert same["collapsed_objective"] == pytest.approx(5.0 if reference == "base" else 1.0)
    assert ("single_value_objective" in same) is (reference == "single_value")
    assert same["pass"] is (reference == "base")
    split = np.array([[1.0, 3.0] if i % 2 else [3.0, 1.0] for i in range(n)])
    g = handover_gate(_FixedNLL(split), enc, b, cfg, 5.0, tok.pad_token_id)
    single = min(split[:, 0].mean(), split[:, 1].mean())  # 2 for an even n
    assert g["best_objective"] == pytest.approx(1.0)
    assert g["collapsed_objective"] == pytest.approx(5.0 if reference == "base" else single)
    assert g["pass"] is True  # 1 < 0.7 * 5 and 1 < 0.7 * single


def test_every_plugin_names_its_source_and_fields_and_every_aid_its_hook():
    """The plug-in registry: each entry has a name of its own, its source and flat config fields that exist;
    every aid of the registry (zfree.config.aid.AIDS) but none and random_init_jsd (a start, not a hook:
    zfree_lab.run.run_setup) is switched on by a plug-in, and a remedy's hook is listed after the aids'."""
    from zfree.config import AIDS, TrainConfig
    from zfree.objective.remedies import REMEDY_ENTRIES
    from zfree.train.plugins import PLUGINS, active_plugins

    flat = set(TrainConfig.flat_fields())
    assert len({p.name for p in PLUGINS}) == len(PLUGINS)
    for p in PLUGINS:
        assert p.name and p.source and set(p.fields) <= flat, p.name
    hooks = [r.plugin for r in REMEDY_ENTRIES.values() if r.plugin is not None]
    assert PLUGINS[len(PLUGINS) - len(hooks):] == hooks
    for aid, entry in AIDS.items():
        assert entry.source and entry.kinds
        if aid not in ("none", "random_init_jsd"):
            assert active_plugins(TrainConfig().replace(aid=aid)), aid
