"""Injection routes (zfree.models.routes; issue 55 item 4) on three architectures, float64.

Per route x architecture (GPT-2, Llama, Gemma 3 with sliding-window layers and soft-capped final
logits; tiny and random, ``tests.test_architectures.CONFIGS``): step 0 equals the base model's own
logits (prefix: the base model reading the initial soft token, its own reference); the K-way
shared-prefix pass equals K separate full passes once the latent parameters are perturbed; a
gradient reaches the latent at step 0. Each under both ``latent_capacity`` settings (the K values
their own vectors, or zero-initialised deltas on one shared vector: issue 55 item 2). Plus: greedy
decoding goes through the route, the continuous CVAE, and the config field. A prefix run's training,
against its own reference: tests/test_prefix_reference.py.
"""

from __future__ import annotations

import copy
import logging
import warnings

import pytest
import torch
import transformers as T

from tests.test_architectures import CONFIGS, make_pairs
from tests.tiny import tiny_flat
from zfree.config import LATER_FIELD_DEFAULTS, TrainConfig, without_log_only
from zfree.data.batching import EncodedPair, collate, encode_pairs
from zfree_lab.run.tokenizer import build_digit_tokenizer
from zfree.models.decoding import decode_with_latents
from zfree.models.continuous import ContinuousCVAE
from zfree.models.discrete import DiscreteCVAE
from zfree.models.injection import full_target_logprobs
from zfree.models.routes import (INJECTIONS, LATENT_CAPACITIES, ROUTES, InjectionRoute, MemoryRoute, MidRoute,
                                 bind_route, decoder_layers, route_of)
from zfree_lab.experiment.controls import control_params

ARCHS = ["gpt2", "llama", "gemma3-softcap-sliding"]  # the last: sliding windows and final-logit soft-capping
SLIDING = {"gemma3-softcap-sliding"}
ROUTE_NAMES = list(INJECTIONS)
CAPACITIES = list(LATENT_CAPACITIES)
K = 3
STEP0_ATOL = 1e-6  # nats per token (float64: the paths agree to ~1e-15)


def build_arch(name: str) -> dict:
    """A tiny random float64 model of ``name`` with a peaked head, the pairs encoded and collated."""
    make, scale = CONFIGS[name]
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(make()).double().eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(scale)  # peaked predictions
    enc = encode_pairs(build_digit_tokenizer(40), make_pairs())
    return dict(name=name, model=model, enc=enc, batch=collate(enc, pad_id=0))


@pytest.fixture(scope="module", params=ARCHS)
def arch(request):
    return build_arch(request.param)


@pytest.fixture(scope="module")
def llama():
    """One architecture where the routes' shared code suffices (the continuous CVAE, decoding)."""
    return build_arch("llama")


def cvae(arch, route: str, **kw) -> DiscreteCVAE:
    return DiscreteCVAE(copy.deepcopy(arch["model"]), n_latent=K, injection=route, **kw).double()


def reference_logprobs(model, enc, soft: torch.Tensor | None = None) -> list[torch.Tensor]:
    """log p(S) per row from the model's own logits on one unpadded row; with ``soft`` (D,) inserted
    before the separator (the prefix route's reference)."""
    out = []
    for e in enc:
        seq, P = list(e.prefix_ids + e.target_ids), len(e.prefix_ids)
        with torch.no_grad():
            emb = model.get_input_embeddings()(torch.tensor([seq]))
            if soft is not None:  # [x-prefix, soft, sep, y]: extended position t predicts seq[t]
                emb = torch.cat([emb[:, : P - 1], soft[None, None], emb[:, P - 1 :]], 1)
            lp = torch.log_softmax(model(inputs_embeds=emb).logits[0].double(), -1)
        shift = 0 if soft is not None else 1
        out.append(torch.stack([lp[t - shift, seq[t]] for t in range(P, len(seq))]))
    return out


def perturb(model: DiscreteCVAE | ContinuousCVAE, std: float = 0.5) -> None:
    """Latent parameters away from their step-0 values, so the K values decode differently."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        lat = model.latent_embedding.weight if isinstance(model, DiscreteCVAE) else model.latent_proj.weight
        lat.copy_(std * torch.randn(lat.shape, generator=g, dtype=lat.dtype))
        for p in model.injection.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
        if model.latent_shared is not None:
            model.latent_shared.copy_(std * torch.randn(model.latent_shared.shape, generator=g, dtype=lat.dtype))


@pytest.mark.parametrize("capacity", CAPACITIES)
@pytest.mark.parametrize("shared", [True, False], ids=["shared_prefix", "full"])
@pytest.mark.parametrize("route", ROUTE_NAMES)
def test_step0_equals_the_base_models_own_logits(arch, route, shared, capacity):
    model = cvae(arch, route, latent_capacity=capacity)
    model.shared_prefix = shared
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the sliding model's fallback warning
        out = model(arch["batch"])
    soft = model.injection.shared.detach() if route == "prefix" else None
    want = reference_logprobs(arch["model"], arch["enc"], soft)
    for r, w in enumerate(want):
        for k in range(K):
            got = out.target_logprobs[r, k][arch["batch"].target_mask[r]]
            torch.testing.assert_close(got, w, atol=STEP0_ATOL, rtol=0, msg=f"{arch['name']} {route} row {r} value {k}")
    if route == "prefix":  # its own reference: the soft token changes the context
        base = reference_logprobs(arch["model"], arch["enc"])
        assert max(float((a - b).abs().max()) for a, b in zip(want, base)) > 1e-3


@pytest.mark.parametrize("capacity", CAPACITIES)
@pytest.mark.parametrize("route", ROUTE_NAMES)
def test_k_way_shared_prefix_equals_k_separate_full_passes(arch, route, capacity):
    model = cvae(arch, route, latent_capacity=capacity)
    perturb(model)
    batch = arch["batch"]
    # non-sliding: the shared prefix is taken ("on" raises otherwise); sliding: it must fall back
    model.shared_prefix_mode = "auto" if arch["name"] in SLIDING else "on"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        shared = model(batch).target_logprobs.detach()  # (B, K, T)
    for k in range(K):
        z = torch.full((len(batch), 1), k)
        alone, _ = full_target_logprobs(model.backbone, batch, model.decoder_hidden(batch, z))
        torch.testing.assert_close(shared[:, k], alone[:, 0].detach(), atol=1e-10, rtol=0,
                                   msg=f"{arch['name']} {route} value {k}")
    assert float((shared[:, 0] - shared[:, 1]).abs().max()) > 1e-3  # the values really differ
    if arch["name"] in SLIDING:
        model.shared_prefix_mode = "on"
        with pytest.raises(ValueError, match="shared_prefix='on'.*sliding window"):
            model(batch)


@pytest.mark.parametrize("capacity", CAPACITIES)
@pytest.mark.parametrize("route", ROUTE_NAMES)
def test_a_gradient_reaches_every_latent_value_at_step_0(arch, route, capacity):
    """Every value's vector (under shared_delta: its delta, and the shared vector) gets a gradient at step 0."""
    model = cvae(arch, route, latent_capacity=capacity)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = model(arch["batch"])
    mask = arch["batch"].target_mask[:, None]
    (-(out.target_logprobs * mask).sum() / mask.sum()).backward()  # the reconstruction loss, all K values
    g = model.latent_embedding.weight.grad
    assert torch.isfinite(g).all() and bool((g.abs().sum(-1) > 0).all()), (arch["name"], route, g.abs().sum(-1))
    if capacity == "shared_delta" and route != "prefix":  # s gets the sum of the K values' gradients
        torch.testing.assert_close(model.latent_shared.grad, g.sum(0), rtol=1e-12, atol=1e-15)
    else:  # per_value, or the prefix route, whose soft token is the shared vector
        assert model.latent_shared is None


@pytest.mark.parametrize("capacity", CAPACITIES)
@pytest.mark.parametrize("route", ROUTE_NAMES)
def test_continuous_cvae_step0_and_gradient(llama, route, capacity):
    arch = llama
    model = ContinuousCVAE(copy.deepcopy(arch["model"]), d_latent=4, injection=route,
                           latent_capacity=capacity).double()
    out = model(arch["batch"], n_samples=2, generator=torch.Generator().manual_seed(0))
    soft = model.injection.shared.detach() if route == "prefix" else None
    for r, w in enumerate(reference_logprobs(arch["model"], arch["enc"], soft)):
        for s in range(2):
            torch.testing.assert_close(out.target_logprobs[r, s][arch["batch"].target_mask[r]], w, atol=STEP0_ATOL, rtol=0)
    mask = arch["batch"].target_mask[:, None]
    (-(out.target_logprobs * mask).sum() / mask.sum()).backward()
    assert float(model.latent_proj.weight.grad.abs().sum()) > 0
    assert (model.latent_shared is None) == (capacity == "per_value" or route == "prefix")
    assert model.latent_shared is None or float(model.latent_shared.grad.abs().sum()) > 0


@pytest.mark.parametrize("route", ROUTE_NAMES)
def test_greedy_decoding_follows_the_routes_own_teacher_forced_argmax(llama, route):
    """Decoding (given only the backbone, as evaluate.latent_stats calls it) goes through the CVAE's
    route: every decoded token is the argmax of the trained path's distribution for that value, and
    (another route than embedding) the ids differ from adding the same latents to the input embeddings."""
    arch = llama  # decoding reuses the route's full pass (the tiny GPT-2 decodes one token whatever the latent)
    model = cvae(arch, route)
    perturb(model, std=2 * float(arch["model"].get_input_embeddings().weight.detach().std()))  # moves ids, not saturating
    assert route_of(model.backbone) is model.injection
    enc, decoded, as_embedding = arch["enc"][:3], [], []
    prefixes = [list(e.prefix_ids) for e in enc]
    for k in range(K):
        with torch.no_grad():
            lat = model.latent_embedding(torch.full((len(enc),), k))
            got = decode_with_latents(model.backbone, prefixes, lat, eos_id=3, max_new_tokens=4)
            bind_route(model.backbone, InjectionRoute())  # the same latents through the embedding path
            as_embedding += decode_with_latents(model.backbone, prefixes, lat, eos_id=3, max_new_tokens=4)
            bind_route(model.backbone, model.injection)
            rows = [EncodedPair(e.id, e.prefix_ids, tuple(g) + (3,)) for e, g in zip(enc, got)]
            out = model(collate(rows, pad_id=0), with_distributions=True)
        decoded += got
        for r, row in enumerate(rows):
            n = len(got[r]) + (1 if len(got[r]) < 4 else 0)  # the end token was chosen when decoding stopped early
            argmax = out.next_token_logprobs[r, k, :n].argmax(-1).tolist()
            assert argmax == list(row.target_ids[:n]), (route, k, r)
    assert (decoded == as_embedding) == (route == "embedding")


def test_routes_step0_identity_and_structure(arch):
    """mid hooks the layer in the middle; memory's projection covers every layer's key and value;
    the embedding route adds no parameter (checkpoints and golden runs unchanged)."""
    model = arch["model"]
    n_layer = model.config.get_text_config().num_hidden_layers
    assert MidRoute(model).layer_index == n_layer // 2 and len(decoder_layers(model)) == n_layer
    mem = MemoryRoute(model)
    assert len(mem.kv_shapes) == n_layer and mem.proj.weight.shape[0] == sum(h * (a + b) for h, a, b in mem.kv_shapes)
    plain = DiscreteCVAE(copy.deepcopy(model), n_latent=K)
    assert not any(k.startswith("injection") for k in plain.state_dict())
    assert set(ROUTES) == set(INJECTIONS)


class _TransformersLog(logging.Handler):
    """transformers' log records while installed (its logger does not propagate to pytest's caplog);
    its once-only warnings re-armed, so a warning given earlier in the process is given again."""

    def __enter__(self):
        logging.Logger.warning_once.cache_clear()  # transformers' warning_once: an lru_cache on the Logger
        self.messages = []
        logging.getLogger("transformers").addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger("transformers").removeHandler(self)

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_the_memory_route_passes_an_attention_mask_to_every_pass(arch):
    """transformers warned "pass an attention_mask" once a memory route was built: ``cache_shapes``'s
    one-token shape probe read token 0 (the pad id here and in many tokenizers) without a mask.
    Harmless (one token, only shapes read), now given its all-ones mask; building the route and its
    passes (shared prefix and full, on the padded batch) and decoding through it warn nothing about
    masks. (That the padded passes are exact is test_step0_equals_the_base_models_own_logits': each
    row against the model's own logits on that row alone.)"""
    assert arch["model"].config.pad_token_id == 0
    with _TransformersLog() as log, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the sliding model's fallback warning
        model = cvae(arch, "memory")
        perturb(model)
        for shared in (True, False):
            model.shared_prefix = shared
            model(arch["batch"])
        prefixes = [list(e.prefix_ids) for e in arch["enc"][:3]]
        with torch.no_grad():
            decode_with_latents(model.backbone, prefixes, model.latent_vectors(torch.zeros(3, dtype=torch.long)),
                                eos_id=3, max_new_tokens=2)
    assert not [m for m in log.messages if "attention_mask" in m], log.messages


def test_memory_refuses_a_row_without_a_token_before_the_separator(arch):
    model = cvae(arch, "memory")
    batch = collate([EncodedPair("a", (4,), (5, 6, 3))], pad_id=0)  # the separator alone at position 0
    with pytest.raises(RuntimeError, match="prefix_len >= 2"):
        model(batch)


def test_bad_injection_is_refused_naming_the_field(arch):
    with pytest.raises(ValueError, match="injection='nope'"):
        cvae(arch, "nope")  # and in the config: test_a_model_field_added_later_…


@pytest.mark.parametrize(("field", "default", "other", "bad"), [("injection", "embedding", "memory", "nope"),
                                                            ("latent_capacity", "per_value", "shared_delta", "shared")])
def test_a_model_field_added_later_defaults_to_the_old_behaviour_and_keeps_old_run_ids(field, default, other, bad):
    """``injection`` and ``latent_capacity``: the default is what runs did before the field, a run recorded
    without it reads as the default with the same id, another value changes the id and is the control's
    too, and an unknown value is refused naming the field."""
    flat = TrainConfig().to_flat()
    assert flat[field] == default == LATER_FIELD_DEFAULTS[field]
    old = {k: v for k, v in flat.items() if k != field}  # a run recorded before the field
    assert getattr(TrainConfig.from_flat(old).model, field) == default
    assert without_log_only(flat) == without_log_only(old)
    assert field in without_log_only({**flat, field: other})
    assert control_params({**flat, field: other})[field] == other  # the control's route/capacity is its run's
    with pytest.raises(ValueError, match=field):
        TrainConfig.from_flat({**flat, field: bad})


@pytest.mark.parametrize("kind", ["discrete", "continuous"])
@pytest.mark.parametrize("route", ["memory", "mid"])
def test_a_tiny_run_trains_through_the_route_and_starts_at_rho_1(tiny_run, tmp_path, route, kind):
    """The run's own step-0 check (rho_recon = 1 against the stored base reference) passes; evaluation
    (decoding included) runs through the route."""
    from zfree_lab.run.training import train_cvae

    data, base = tiny_run
    cfg = TrainConfig.from_flat(tiny_flat(data, base, device="cpu", steps=2, eval_every=2, injection=route,
                                          latent_kind=kind))
    s = train_cvae(cfg, tmp_path / "run", progress=False)
    assert s["injection"] == route
    assert abs(s["init/loss/val/baseline_normalized_reconstruction_loss"] - 1) < 1e-5
    assert torch.isfinite(torch.tensor(s["loss/val/reconstruction_loss"]))




def _latent_independent(model) -> dict[str, int]:
    """name -> size of every trainable parameter that is neither a latent value's own vector
    (``latent_embedding``: the deltas) nor the router probe (K outputs): the adaptation every value shares."""
    skip = ("latent_embedding", *model.ROUTER_MODULES)
    return {n: p.numel() for n, p in model.named_parameters() if p.requires_grad and n.split(".")[0] not in skip}


@pytest.mark.parametrize("route", ["embedding", "mid", "memory"])
def test_control_oracle_and_null_share_one_latent_independent_adaptation_and_the_deltas_start_at_0(llama, route):
    """Under ``latent_capacity='shared_delta'`` the z-free control (K = 1), a label oracle and its null
    oracle built from one recipe (``zfree_lab.experiment.controls``) train the same latent-independent
    parameters (the body, the route's, and the shared vector s), and their K deltas start at exactly 0
    (so the decoder is the base model at step 0); under ``per_value`` there is no s."""
    from zfree_lab.experiment.controls import control_params, null_params, oracle_params
    from zfree_lab.run.run_setup import build_cvae

    run = {**TrainConfig().to_flat(), "latent_capacity": "shared_delta", "injection": route, "device": "cpu"}
    arms = {"control": control_params(run), "oracle": oracle_params(run, "complete", 2),
            "null": null_params(run, "complete", 2)}
    counts = {}
    for name, flat in arms.items():
        model = build_cvae(TrainConfig.from_flat(flat), copy.deepcopy(llama["model"]))
        counts[name] = _latent_independent(model)
        d = model.latent_embedding.weight.shape[1]
        assert model.latent_embedding.weight.shape[0] == flat["n_latent"] == (1 if name == "control" else 2)
        assert bool((model.latent_embedding.weight == 0).all()) and bool((model.latent_shared == 0).all())
        assert counts[name]["latent_shared"] == d
    assert counts["control"] == counts["oracle"] == counts["null"], counts
    plain = build_cvae(TrainConfig.from_flat(control_params({**run, "latent_capacity": "per_value"})),
                       copy.deepcopy(llama["model"]))
    assert plain.latent_shared is None and "latent_shared" not in plain.state_dict()
    assert set(counts["control"]) - set(_latent_independent(plain)) == {"latent_shared"}
