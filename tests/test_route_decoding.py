"""Cached decoding on every injection route (zfree.models.decoding): the key/value cache gives the
same ids as re-reading the whole sequence through the route's full pass, greedy and sampled, on
GPT-2, Llama and Gemma 3 (sliding windows, soft-capped logits), float64, rows of two prefix lengths.
That the full pass itself decodes what the route trains: tests/test_injection_routes.py
(test_greedy_decoding_follows_the_routes_own_teacher_forced_argmax).
Hidden states token by token, and the ids end to end with the cached path forced."""

from __future__ import annotations

import pytest
import torch

import zfree.models.decoding as decoding
from tests.test_injection_routes import ARCHS, K, ROUTE_NAMES, cvae, perturb  # noqa: F401 - arch fixture below
from tests.test_injection_routes import build_arch
from zfree.models.decoding import decode_with_latents

NEW = 3  # new tokens: the longest prefix (4) + the prefix route's soft token + 3 fill the sliding window (8): the cache is used


@pytest.fixture(scope="module", params=ARCHS)
def arch(request):
    return build_arch(request.param)


def short_prefixes(enc) -> list[list[int]]:
    """[bos] + 1 or 2 x tokens + [sep] from the encoded rows: two prefix lengths (3 and 4)."""
    return [list(e.prefix_ids[:1] + e.prefix_ids[1 : 1 + m] + e.prefix_ids[-1:]) for e, m in zip(enc, (1, 2, 2, 1, 2))]


@pytest.mark.parametrize("capacity", ["per_value", "shared_delta"])
@pytest.mark.parametrize("route", ROUTE_NAMES)
def test_cached_decoding_equals_the_routes_full_pass(arch, route, capacity, monkeypatch):
    model = cvae(arch, route, latent_capacity=capacity)
    perturb(model, std=2 * float(arch["model"].get_input_embeddings().weight.detach().std()))
    prefixes = short_prefixes(arch["enc"])
    for k in range(K):
        with torch.no_grad():
            lat = model.latent_vectors(torch.full((len(prefixes),), k))
        runs = {}
        for cache in (True, False):
            if cache:  # the cached path must be the one taken, not a fallback to the full pass
                monkeypatch.setattr(decoding, "_group_uncached", _refuse)
            else:
                monkeypatch.undo()
            runs[cache] = [decode_with_latents(model.backbone, prefixes, lat, eos_id=-1, max_new_tokens=NEW,
                                               cache=cache, generator=g)
                           for g in (None, torch.Generator().manual_seed(0))]
        assert runs[True] == runs[False], (arch["name"], route, k)
        assert all(len(ids) == NEW for ids in runs[True][0])  # no end token (-1): every row decoded in full


@pytest.mark.parametrize("route", ROUTE_NAMES)
def test_each_cached_position_has_the_full_passs_hidden_state(arch, route):
    """Token by token (a fixed continuation), the cached path's last hidden state equals the route's
    full pass over the whole sequence (float64, 1e-9), and it depends on the latent value."""
    model = cvae(arch, route, latent_capacity="shared_delta")
    perturb(model)
    route_obj, backbone = model.injection, model.backbone
    ids = torch.tensor([p for p in short_prefixes(arch["enc"]) if len(p) == 4])  # one prefix length
    P, follow = ids.shape[1], torch.tensor([7, 11, 5])
    last = []
    for k in range(K):
        with torch.no_grad():
            lat = model.latent_vectors(torch.full((len(ids),), k))
            res, seq, hidden = decoding._start(backbone, route_obj, ids, lat), ids, []
            for t in range(len(follow) + 1):
                want = route_obj.last_hidden(backbone, seq, P, lat)
                got = res.last_hidden_state[:, -1]
                assert float((got - want).abs().max()) < 1e-9, (arch["name"], route, k, t)
                hidden.append(got)
                if t < len(follow):
                    nxt = follow[t].repeat(len(ids))
                    seq = torch.cat([seq, nxt[:, None]], 1)
                    res = decoding._step(backbone, route_obj, nxt, lat, res.past_key_values)
        last.append(torch.stack(hidden))
    assert float((last[0] - last[1]).abs().max()) > 1e-6  # the latent reaches every route's cached path


def test_the_cached_routes_are_routes():
    from zfree.models.routes import ROUTES

    assert decoding.CACHED_ROUTES <= set(ROUTES)


def _refuse(*args, **kwargs):
    raise AssertionError("the uncached path was taken")


def test_memory_decoding_refuses_a_prefix_without_a_token_before_the_separator(llama):
    model = cvae(llama, "memory")
    with pytest.raises(ValueError, match="prefix_len >= 2"):
        decode_with_latents(model.backbone, [[5]], model.latent_vectors(torch.zeros(1, dtype=torch.long)),
                            eos_id=3, max_new_tokens=2)


@pytest.fixture(scope="module")
def llama():
    return build_arch("llama")
