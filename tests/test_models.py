"""Discrete CVAE: the step-0 contract (decoder == base model) and path equivalences."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.tiny import PAIRS
from zfree.data.batching import collate, encode_pair
from zfree.data.pairs import Pair
from zfree_lab.run.tokenizer import build_digit_tokenizer
from zfree.models.base import build_synthetic_gpt2, target_logprobs
from zfree.models.discrete import DiscreteCVAE
from zfree.models.injection import injection_mask


@pytest.fixture(scope="module")
def setup(tiny_lm):
    return tiny_lm(n_layer=2, seed=1, saved=True)  # saved and loaded back: the real loading path


def spread_cvae(base, n_latent: int, *, double: bool = False) -> DiscreteCVAE:
    """A DiscreteCVAE on a copy of ``base`` (float64 with ``double``) whose latent vectors are drawn
    N(0, 0.5²): its values decode differently."""
    model = DiscreteCVAE(copy.deepcopy(base), n_latent=n_latent)
    model = model.double() if double else model
    with torch.no_grad():
        model.latent_embedding.weight.normal_(std=0.5)
    return model


def test_decoder_equals_base_model_at_init_for_every_latent(setup):
    base, tok, batch = setup
    model = DiscreteCVAE(copy.deepcopy(base), n_latent=5)
    out = model(batch)
    ref = target_logprobs(base, batch)
    for k in range(5):
        torch.testing.assert_close(out.target_logprobs[:, k], ref, atol=1e-6, rtol=0)
    torch.testing.assert_close(out.zfree_target_logprobs, ref, atol=1e-6, rtol=0)


def test_target_logprobs_match_transformers_own_loss(setup):
    """b of one unpadded example == model(labels=...).loss with -100 outside the y-region."""
    base, tok, batch = setup
    for r in range(len(PAIRS)):
        L = int(batch.attention_mask[r].sum())
        ids = batch.input_ids[r : r + 1, :L]
        labels = torch.where(batch.target_mask[r : r + 1, :L], ids, torch.full_like(ids, -100))
        hf = base(input_ids=ids, labels=labels).loss
        mine = -target_logprobs(base, batch)[r][batch.target_mask[r]].mean()
        torch.testing.assert_close(mine, hf, atol=1e-6, rtol=1e-6)


def test_batched_latent_pass_equals_naive_full_pass_per_latent(setup):
    base, tok, batch = setup
    model = spread_cvae(base, 3)
    out = model(batch)
    emb_layer = model.backbone.get_input_embeddings()
    for k in range(3):
        emb = emb_layer(batch.input_ids) + injection_mask(batch)[..., None] * model.latent_embedding.weight[k]
        naive = target_logprobs(model.backbone, batch, inputs_embeds=emb)
        torch.testing.assert_close(out.target_logprobs[:, k], naive, atol=1e-5, rtol=0)
    assert not torch.allclose(out.target_logprobs[:, 0], out.target_logprobs[:, 1])


def test_padding_changes_nothing(setup):
    base, tok, batch = setup
    model = spread_cvae(base, 3)
    full = model(batch)
    for r, p in enumerate(PAIRS):
        alone = model(collate([encode_pair(tok, p)], pad_id=tok.pad_token_id))
        L = alone.target_logprobs.shape[-1]
        torch.testing.assert_close(full.target_logprobs[r, :, :L], alone.target_logprobs[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(full.posterior_logits[r], alone.posterior_logits[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(full.prior_logits[r], alone.prior_logits[0], atol=1e-5, rtol=0)


def test_router_sees_only_x_and_posterior_differs_across_examples(setup):
    base, tok, batch = setup
    model = DiscreteCVAE(copy.deepcopy(base), n_latent=4)
    with torch.no_grad():
        model.router_head.weight.normal_()
    a = model(collate([encode_pair(tok, Pair("a", "1 2 3", "3 2 1"))]))
    b = model(collate([encode_pair(tok, Pair("a", "1 2 3", "1 2 3"))]))
    torch.testing.assert_close(a.prior_logits, b.prior_logits)  # same x, different y
    assert not torch.allclose(a.posterior_logits, b.posterior_logits)  # the posterior reads y


def test_distributions_are_normalized_and_consistent(setup):
    base, tok, batch = setup
    model = DiscreteCVAE(copy.deepcopy(base), n_latent=2)
    out = model(batch, with_distributions=True)
    lse = torch.logsumexp(out.next_token_logprobs, -1)[out.pos_mask[:, None].expand(-1, 2, -1)]
    torch.testing.assert_close(lse, torch.zeros_like(lse), atol=1e-5, rtol=0)


def test_bad_model_arguments():
    tok = build_digit_tokenizer(10)
    base = build_synthetic_gpt2(len(tok), n_layer=1, n_embd=16, n_head=2)
    with pytest.raises(ValueError, match="n_latent"):
        DiscreteCVAE(base, n_latent=1)
    with pytest.raises(ValueError, match="posterior_features"):
        DiscreteCVAE(base, n_latent=2, posterior_features="nope")


def test_forward_selected_gradient_equals_the_full_k_way_graph(setup):
    """Hard EM differentiates only the chosen value's decoder pass; its parameter gradient must equal
    the gradient through the full K-way graph gathered at the same values (float64)."""
    base, tok, batch = setup
    torch.manual_seed(0)
    model = spread_cvae(base, 4, double=True)
    mask = batch.target_mask

    def loss_of(tlp_z, q_logits):  # (B, T), (B, K): a reconstruction term plus a posterior term
        return (-(tlp_z * mask).sum(1) / mask.sum(1)).sum() + torch.log_softmax(q_logits, -1)[:, 0].sum()

    def grads():
        g = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad()
        return g

    full = model(batch)
    z = (-(full.target_logprobs * mask[:, None]).sum(-1)).detach().argmin(-1)  # the best value per row
    loss_of(full.target_logprobs.gather(1, z[:, None, None].expand(-1, 1, mask.shape[1]))[:, 0],
            full.posterior_logits).backward()
    g_full = grads()
    sel = model.forward_selected(batch, lambda o: (-(o.target_logprobs * mask[:, None]).sum(-1)).argmin(-1))
    out, tlp_z, z_sel = sel.out, sel.selected_logprobs, sel.z
    assert not out.target_logprobs.requires_grad
    assert torch.equal(z_sel, z) and len(set(z.tolist())) > 1  # a real selection, not one value for all rows
    torch.testing.assert_close(out.target_logprobs, full.target_logprobs.detach(), atol=1e-12, rtol=0)
    loss_of(tlp_z, out.posterior_logits).backward()
    g_sel = grads()
    assert g_sel.keys() == g_full.keys()
    for n in g_full:
        torch.testing.assert_close(g_sel[n], g_full[n], atol=1e-10, rtol=1e-8, msg=n)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_forward_selected_estep_on_the_first_tokens_of_s(setup, n):
    """``estep_tokens = n``: the K no-grad passes score only the first n tokens of S, equal to the
    full K-way pass's log-probs there (float64); k* is the argmin of their mean; the decoded value's
    log-probs still cover all of S and equal the full pass at k*."""
    base, tok, batch = setup
    torch.manual_seed(0)
    model = spread_cvae(base, 4, double=True)
    full = model(batch).target_logprobs.detach()  # (B, K, T)
    sel = model.forward_selected(batch, "best", estep_tokens=n)
    t = torch.arange(batch.input_ids.shape[1])[None, :]
    first = batch.target_mask & (t < (batch.prefix_len + n)[:, None])  # the first n tokens of S
    assert int(first.sum()) == int(batch.target_len.clamp_max(n).sum()) < int(batch.target_mask.sum())
    torch.testing.assert_close(sel.out.target_logprobs, full * first[:, None], atol=1e-12, rtol=0)
    nll_first = -(full * first[:, None]).sum(-1) / first.sum(-1, keepdim=True)  # (B, K)
    assert torch.equal(sel.k_star, nll_first.argmin(-1))
    rows = torch.arange(len(batch))
    torch.testing.assert_close(sel.selected_logprobs.detach(), full[rows, sel.k_star], atol=1e-12, rtol=0)
    assert sel.selected_logprobs.requires_grad


def test_first_targets_beyond_the_longest_s_is_the_batch_itself(setup):
    _, _, batch = setup
    assert batch.first_targets(0) is batch and batch.first_targets(10**6) is batch
