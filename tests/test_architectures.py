"""Any causal LM, exactly: tiny random models of many architectures, saved with save_pretrained and
loaded through zfree's loader, against a float64 one-row computation from the model's own logits.

Each model has 2 layers, width 32, and its output weight scaled so predictions are peaked (a wrong
convention cannot hide in small numbers); sequences are longer than the sliding windows (8).
Checked per architecture: ``score_pairs`` per-token surprisal, and the CVAE decoder's step-0
per-token log-probs (zero latent) on both decoder paths (shared prefix and full pass).
"""

from __future__ import annotations

import copy
import json
import random
import warnings

import numpy as np
import pytest
import torch
import transformers as T
from safetensors.torch import load_file, save_file

from zfree.data.batching import collate, encode_pairs
from zfree.data.pairs import Pair
from zfree_lab.run.tokenizer import build_digit_tokenizer
from zfree.models import injection
from zfree.models.decoding import decode_with_latents
from zfree.models.injection import (decoder_hidden_full, decoder_hidden_suffix, full_target_logprobs,
                                    shared_prefix_problem, suffix_target_logprobs, zfree_pass)
from zfree.core.errors import ModelLoadError
from zfree.models.loading import load_causal_lm
from zfree.reference.scoring import score_pairs

ATOL = 1e-5
#: greedy decoding may pick another token than the model's own argmax only where the two logits are
#: this close (float32 rounding of two computation paths; a wrong head moves logits by far more)
TIE_LOGITS = 1e-4
V = 45  # build_digit_tokenizer(40): 5 special tokens + 40 digits
IDS = dict(vocab_size=V, bos_token_id=1, eos_token_id=3, pad_token_id=0)
LLAMA_LIKE = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
                  intermediate_size=64, max_position_embeddings=64, **IDS)
SLIDING = ["sliding_attention", "full_attention"]
CONFIGS = {  # name -> (config, output-weight scale)
    "gpt2": (lambda: T.GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=64, **IDS), 6.0),  # tied head
    "llama": (lambda: T.LlamaConfig(**LLAMA_LIKE), 20.0),
    "qwen2": (lambda: T.Qwen2Config(**LLAMA_LIKE), 20.0),
    "qwen3-sliding": (lambda: T.Qwen3Config(head_dim=16, sliding_window=8, use_sliding_window=True,
                                            layer_types=SLIDING, **LLAMA_LIKE), 20.0),
    "gptneox": (lambda: T.GPTNeoXConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                                        intermediate_size=64, max_position_embeddings=64, **IDS), 20.0),
    "opt": (lambda: T.OPTConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, ffn_dim=64,
                                word_embed_proj_dim=32, max_position_embeddings=64, **IDS), 6.0),  # tied head
    "mistral-window8": (lambda: T.MistralConfig(sliding_window=8, head_dim=16, **LLAMA_LIKE), 20.0),
    "phi3": (lambda: T.Phi3Config(**LLAMA_LIKE), 20.0),
    "gemma": (lambda: T.GemmaConfig(head_dim=16, **LLAMA_LIKE), 30.0),  # tied, embeddings scaled by sqrt(d)
    "gemma2-softcap-sliding": (lambda: T.Gemma2Config(head_dim=16, sliding_window=8, final_logit_softcapping=5.0,
                                                      layer_types=SLIDING, **LLAMA_LIKE), 30.0),
    "gemma3-softcap-sliding": (lambda: T.Gemma3TextConfig(head_dim=16, sliding_window=8, final_logit_softcapping=5.0,
                                                          layer_types=SLIDING, **LLAMA_LIKE), 30.0),
    "granite-logits-scaling": (lambda: T.GraniteConfig(logits_scaling=4.0, **LLAMA_LIKE), 60.0),
    "cohere-logit-scale": (lambda: T.CohereConfig(logit_scale=0.25, **LLAMA_LIKE), 60.0),  # tied
}


def make_pairs(n: int = 7, seed: int = 0) -> list[Pair]:
    rng = random.Random(seed)
    digits = lambda k: " ".join(str(rng.randrange(40)) for _ in range(k))  # noqa: E731
    return [Pair(f"r{i}", digits(rng.randint(2, 16)), digits(rng.randint(1, 7))) for i in range(n)]


def build(name: str, folder, seed: int = 0):
    """A tiny random model of ``name`` with a peaked head, saved with its tokenizer into ``folder``."""
    make, scale = CONFIGS[name]
    torch.manual_seed(seed)
    model = T.AutoModelForCausalLM.from_config(make())
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(scale)
    model.save_pretrained(folder)
    build_digit_tokenizer(40).save_pretrained(folder)
    return folder


def oracle(model, seq: list[int], n_target: int) -> np.ndarray:
    """Surprisal (nats) of the last ``n_target`` tokens: one unpadded row, float64, the model's own logits."""
    m64 = copy.deepcopy(model).double().eval()
    with torch.no_grad():
        lp = torch.log_softmax(m64(input_ids=torch.tensor([seq])).logits[0].double(), -1)
    return np.array([-lp[t - 1, seq[t]].item() for t in range(len(seq) - n_target, len(seq))])


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def arch(request, tmp_path_factory):
    folder = build(request.param, tmp_path_factory.mktemp(request.param))
    model, tok = load_causal_lm(folder, device="cpu")
    pairs = make_pairs()
    enc = encode_pairs(tok, pairs)
    want = [oracle(model, list(e.prefix_ids + e.target_ids), len(e.target_ids)) for e in enc]
    return dict(name=request.param, model=model, tok=tok, pairs=pairs, enc=enc, want=want)


def test_peaked_and_long_enough(arch):
    """The setup is a real test: logits are peaked and rows are longer than the windows."""
    e = arch["enc"]
    assert max(len(x.prefix_ids) + len(x.target_ids) for x in e) > 12
    with torch.no_grad():
        logits = arch["model"](input_ids=torch.tensor([e[0].prefix_ids + e[0].target_ids])).logits
    assert float(logits.max() - logits.min()) > 5.0


def test_score_equals_float64_one_row_oracle(arch):
    res = score_pairs(arch["model"], arch["tok"], arch["pairs"], cache=False, max_batch_rows=3)
    assert res.settings["head_path"] == "hidden_states"
    for e, want in zip(arch["enc"], arch["want"]):
        got = res.per_token.query("id == @e.id")["surprisal"].to_numpy()
        np.testing.assert_allclose(got, want, atol=ATOL, rtol=0, err_msg=f"{arch['name']} {e.id}")


@pytest.mark.parametrize("head_chunk", [None, 3 * V], ids=["whole-head", "chunked-head"])
@pytest.mark.parametrize("path", ["shared_prefix", "full"])
def test_decoder_step0_logprobs_equal_the_models_own(arch, path, head_chunk, monkeypatch):
    """Chunked: 3 rows per chunk, under gradient (``head_chunks._HeadLogprobs``: each chunk through
    the model's own head path: soft-capping, scaling)."""
    from zfree.models import head_chunks

    monkeypatch.setitem(head_chunks._SETTINGS, "elements", head_chunk)
    model, enc = arch["model"], arch["enc"]
    batch = collate(enc, pad_id=0)
    n = 2
    lat = torch.zeros(len(enc), n, model.config.hidden_size if hasattr(model.config, "hidden_size")
                      else model.get_input_embeddings().weight.shape[1])
    with torch.set_grad_enabled(head_chunk is not None), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if path == "full":
            tlp, _ = full_target_logprobs(model, batch, decoder_hidden_full(model, batch, lat))
        else:
            _, cache = zfree_pass(model, batch, use_cache=True)
            hz, valid = decoder_hidden_suffix(model, batch, cache, lat)
            tlp, _ = suffix_target_logprobs(model, batch, hz, valid)
    assert tlp.requires_grad == (head_chunk is not None)
    for r, want in enumerate(arch["want"]):
        for s in range(n):
            got = tlp[r, s][batch.target_mask[r]].detach().double().numpy()
            np.testing.assert_allclose(-got, want, atol=ATOL, rtol=0, err_msg=f"{arch['name']} row {r} latent {s}")


def test_greedy_decoding_follows_the_models_own_logits(arch):
    """Zero latent: greedy decoding = argmax of ``model(ids).logits`` step by step (soft-capping and
    scaling change the argmax only through ties, but a wrong head would still show in the ids)."""
    model, enc = arch["model"], arch["enc"][:3]
    prefixes = [list(e.prefix_ids) for e in enc]
    D = model.get_input_embeddings().weight.shape[1]
    got = decode_with_latents(model, prefixes, torch.zeros(len(enc), D), eos_id=3, max_new_tokens=5)
    for p, g in zip(prefixes, got):
        ids, want, tie = list(p), [], False
        with torch.no_grad():
            for i in range(5):
                logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
                nxt = int(logits.argmax())
                mine = g[i] if i < len(g) else 3  # decoding ended: it chose the end token
                if mine != nxt:  # two paths (batched with embeddings vs one row of ids) may round a
                    # near-tie apart on another CPU: allowed only within TIE_LOGITS, then the row stops
                    assert float(logits[mine]) >= float(logits.max()) - TIE_LOGITS, (arch["name"], g, want + [nxt])
                    tie = True
                    break
                if nxt == 3:
                    break
                want.append(nxt)
                ids.append(nxt)
        assert tie or g == want


def test_shared_prefix_is_used_where_exact_and_refused_by_on_where_not(arch):
    model, enc = arch["model"], arch["enc"]
    batch = collate(enc, pad_id=0)
    with torch.no_grad():
        _, cache = zfree_pass(model, batch, use_cache=True)
    T_, Pc, L = batch.input_ids.shape[1], int(batch.prefix_len.max()) - 1, int(batch.target_len.max())
    problem = shared_prefix_problem(model, cache, T_, Pc + L)
    sliding = "sliding" in arch["name"] or "window" in arch["name"]
    assert (problem is not None) == sliding, problem
    lat = torch.zeros(len(enc), 1, model.get_input_embeddings().weight.shape[1])
    if sliding:
        with pytest.raises(ValueError, match="shared_prefix='on'.*sliding window"):
            decoder_hidden_suffix(model, batch, cache, lat, shared_prefix="on")
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback warning where the cache is exact
            with torch.no_grad():
                decoder_hidden_suffix(model, batch, cache, lat, shared_prefix="on")


def test_auto_fallback_warns_once_per_model_class(tmp_path, monkeypatch):
    monkeypatch.setattr(injection, "_WARNED", set())
    model, tok = load_causal_lm(build("mistral-window8", tmp_path / "m"), device="cpu")
    batch = collate(encode_pairs(tok, make_pairs()), pad_id=0)
    lat = torch.zeros(len(batch), 1, 32)
    with torch.no_grad(), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(3):
            _, cache = zfree_pass(model, batch, use_cache=True)
            decoder_hidden_suffix(model, batch, cache, lat)
    assert len([x for x in w if "shared-prefix decoding is not exact" in str(x.message)]) == 1
    with pytest.raises(ValueError, match="expected one of"):
        injection.set_shared_prefix("sometimes")


# ---------------------------------------------------------------- refusals and the cache key

def _save_with_tokenizer(model, folder):
    model.save_pretrained(folder)
    build_digit_tokenizer(40).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("kind", ["bart", "t5"])
def test_encoder_decoder_models_are_refused_with_a_zfree_message(tmp_path, kind):
    if kind == "bart":
        cfg = T.BartConfig(encoder_layers=1, decoder_layers=1, d_model=16, encoder_attention_heads=2,
                           decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, **IDS)
        model = T.BartForConditionalGeneration(cfg)
    else:
        cfg = T.T5Config(num_layers=1, d_model=16, d_kv=8, num_heads=2, d_ff=32, vocab_size=V, decoder_start_token_id=0)
        model = T.T5ForConditionalGeneration(cfg)
    folder = _save_with_tokenizer(model, tmp_path / kind)
    with pytest.raises(ModelLoadError, match="encoder-decoder model, not a causal LM"):
        load_causal_lm(folder, device="cpu")


def test_bart_config_claiming_decoder_only_is_refused_naming_the_missing_weights(tmp_path):
    cfg = T.BartConfig(encoder_layers=1, decoder_layers=1, d_model=16, encoder_attention_heads=2,
                       decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, **IDS)
    folder = _save_with_tokenizer(T.BartForConditionalGeneration(cfg), tmp_path / "bart")
    conf = json.loads((folder / "config.json").read_text())
    conf["is_encoder_decoder"] = False
    (folder / "config.json").write_text(json.dumps(conf))
    with pytest.raises(ModelLoadError, match="weights missing or newly initialized on load: .*embed_tokens"):
        load_causal_lm(folder, device="cpu")


def test_missing_weights_are_refused_naming_them(tmp_path):
    folder = build("llama", tmp_path / "m")
    sd = load_file(folder / "model.safetensors")
    del sd["model.layers.1.mlp.down_proj.weight"]
    save_file(sd, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"model\.layers\.1\.mlp\.down_proj\.weight"):
        load_causal_lm(folder, device="cpu")


def test_folder_without_tokenizer_names_the_folder(tmp_path):
    T.AutoModelForCausalLM.from_config(CONFIGS["llama"][0]()).save_pretrained(tmp_path / "bare")
    with pytest.raises(ModelLoadError, match=r"bare has no tokenizer"):
        load_causal_lm(tmp_path / "bare", device="cpu")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_causal_lm(tmp_path / "nowhere", device="cpu")


def test_models_differing_only_in_config_never_share_cache_entries(tmp_path):
    a = build("mistral-window8", tmp_path / "a")
    b = build("mistral-window8", tmp_path / "b")
    conf = json.loads((b / "config.json").read_text())
    conf["sliding_window"] = 4096
    (b / "config.json").write_text(json.dumps(conf))
    pairs = make_pairs(seed=1)
    ma, tok = load_causal_lm(a, device="cpu")
    mb, _ = load_causal_lm(b, device="cpu")
    ra = score_pairs(ma, tok, pairs, cache_dir=tmp_path / "cache")
    rb = score_pairs(mb, tok, pairs, cache_dir=tmp_path / "cache")
    assert ra.settings["weights_sha256"] == rb.settings["weights_sha256"]  # same weights, different config
    assert not ra.cache_hit and not rb.cache_hit
    assert abs(ra.c_base - rb.c_base) > 1e-3
    for m, r in ((ma, ra), (mb, rb)):
        for e in encode_pairs(tok, pairs):
            want = oracle(m, list(e.prefix_ids + e.target_ids), len(e.target_ids))
            np.testing.assert_allclose(r.per_token.query("id == @e.id")["surprisal"], want, atol=ATOL, rtol=0)
    assert score_pairs(mb, tok, pairs, cache_dir=tmp_path / "cache").cache_hit


def test_head_is_float32_under_autocast_and_verification_survives_it(tmp_path):
    from zfree.models.head import exact_logits_from_hidden, head_is_exact

    model, tok = load_causal_lm(build("gemma2-softcap-sliding", tmp_path / "m"), device="cpu")
    ids = torch.tensor([encode_pairs(tok, make_pairs(1))[0].prefix_ids])
    fresh = copy.deepcopy(model)  # not yet verified: verified lazily inside the autocast region
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        h = fresh.base_model(input_ids=ids).last_hidden_state
        logits = exact_logits_from_hidden(fresh, h)
    assert head_is_exact(fresh) and logits.dtype == torch.float32
    with torch.no_grad():
        want = fresh(input_ids=ids).logits  # fp32 throughout; the bf16 body moves h only
        ref = exact_logits_from_hidden(fresh, h.float())
    torch.testing.assert_close(logits, ref, atol=1e-5, rtol=0)
    assert float((want - logits).abs().max()) < 0.5


def test_a_missing_hub_id_offline_is_a_one_line_zfree_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="nowhere-org/no-such-model is neither an existing path nor a loadable hub id"):
        load_causal_lm("nowhere-org/no-such-model", device="cpu")


@pytest.mark.parametrize("name", ["mistral-window8", "qwen3-sliding", "gemma2-softcap-sliding", "cohere-logit-scale"])
@pytest.mark.parametrize("kind", ["discrete", "continuous"])
def test_both_cvaes_start_at_the_base_model(tmp_path, name, kind):
    from zfree.models.continuous import ContinuousCVAE
    from zfree.models.discrete import DiscreteCVAE

    model, tok = load_causal_lm(build(name, tmp_path / name), device="cpu")
    enc = encode_pairs(tok, make_pairs())
    batch = collate(enc, pad_id=0)
    for shared in (True, False):
        cvae = (DiscreteCVAE(copy.deepcopy(model), n_latent=2) if kind == "discrete"
                else ContinuousCVAE(copy.deepcopy(model), d_latent=3, n_samples=2))
        cvae.shared_prefix = shared
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = cvae(batch)
        for r, e in enumerate(enc):
            want = oracle(model, list(e.prefix_ids + e.target_ids), len(e.target_ids))
            for s in range(2):
                got = -out.target_logprobs[r, s][batch.target_mask[r]].double().numpy()
                np.testing.assert_allclose(got, want, atol=ATOL, rtol=0, err_msg=f"{name} {kind} shared={shared}")
