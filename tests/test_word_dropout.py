"""Word dropout (zfree.train.word_dropout; Bowman et al. 2016, sec. 3.2) through the plug-in path:
which tokens drop, that the decoder reads the dropped inputs while the targets stay the clean tokens
(checked against the model's own logits), that both decoder paths agree, and that a run with it
trains, records it, gets its own id and control while a run without it keeps the id of the runs
recorded before the field existed."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from tests.tiny import tiny_flat
from zfree.config import TrainConfig
from zfree.data.batching import collate, encode_pairs
from zfree.models.discrete import DiscreteCVAE
from zfree.train import plugins
from zfree_lab.run.training import train_cvae
from zfree.train.word_dropout import WordDropout, drop_words, replacement_id
from zfree_lab.experiment.controls import control_params
from zfree_lab.experiment.spec import run_id


def _rows(tok, pairs):
    return encode_pairs(tok, pairs)


def test_drop_words_rate_last_token_and_determinism(tiny_lm):
    _, tok, _ = tiny_lm()
    from tests.tiny import PAIRS

    rows = _rows(tok, PAIRS) * 300  # 1,200 rows
    out = drop_words(rows, 0.3, replace_id=99, seed=5, step=7)
    dropped = kept = 0
    for e, d in zip(rows, out):
        assert d.target_ids == e.target_ids and d.prefix_ids == e.prefix_ids  # what is predicted: unchanged
        assert len(d.y_input_ids) == len(e.target_ids) and d.y_input_ids[-1] == e.target_ids[-1]
        for a, b in zip(d.y_input_ids[:-1], e.target_ids[:-1]):
            assert a in (b, 99)
            dropped, kept = dropped + (a == 99), kept + (a != 99)
    share = dropped / (dropped + kept)
    assert abs(share - 0.3) < 0.03, share  # 1,200 rows x ~3-7 droppable tokens: binomial sd ~ 0.007
    again = drop_words(rows, 0.3, replace_id=99, seed=5, step=7)
    assert [d.y_input_ids for d in again] == [d.y_input_ids for d in out]  # a function of (seed, step, row)
    other = drop_words(rows, 0.3, replace_id=99, seed=5, step=8)
    assert [d.y_input_ids for d in other] != [d.y_input_ids for d in out]
    # a chunk of the batch (gradient accumulation) drops what the whole batch drops on its rows
    assert [d.y_input_ids for d in drop_words(rows[:4], 0.3, 99, 5, 7)] == [d.y_input_ids for d in out[:4]]
    assert drop_words(rows[:3], 0.0, 99, 5, 7) == rows[:3]


def test_collate_gives_the_decoder_the_dropped_inputs_and_keeps_the_targets(tiny_lm):
    _, tok, _ = tiny_lm()
    from tests.tiny import PAIRS

    rows = _rows(tok, PAIRS)
    clean, dropped = collate(rows, pad_id=0), collate(drop_words(rows, 0.5, 11, seed=0, step=1), pad_id=0)
    assert clean.decoder_input_ids is None and torch.equal(clean.decoder_inputs, clean.input_ids)
    assert torch.equal(dropped.input_ids, clean.input_ids) and torch.equal(dropped.target_mask, clean.target_mask)
    diff = dropped.decoder_input_ids != dropped.input_ids
    assert diff.any() and bool((dropped.decoder_input_ids[diff] == 11).all())
    assert bool(dropped.target_mask[diff].all())  # only y-region positions ever change
    moved = dropped.to("cpu")
    assert torch.equal(moved.decoder_input_ids, dropped.decoder_input_ids)


@pytest.mark.parametrize("shared_prefix", ["on", "off"])
def test_decoder_reads_dropped_inputs_and_scores_clean_targets_as_the_models_own_logits(tiny_lm, shared_prefix):
    """At step 0 (zero latent embeddings) the CVAE's decoder is the base model, so its log p(y_t | ...)
    under word dropout must be the model's own log-softmax(logits) on the dropped sequence, read at the
    clean next tokens; the suffix (shared prefix) path and the full pass must agree."""
    base, tok, _ = tiny_lm()
    from tests.tiny import PAIRS

    rows = drop_words(_rows(tok, PAIRS), 0.5, replacement_id(tok, 0), seed=1, step=3)
    batch = collate(rows, pad_id=0)
    model = DiscreteCVAE(copy.deepcopy(base), n_latent=3).eval()
    model.shared_prefix_mode, model.shared_prefix = shared_prefix, shared_prefix != "off"
    with torch.no_grad():
        out = model(batch)
        logits = base(input_ids=batch.decoder_input_ids, attention_mask=batch.attention_mask).logits
    want = torch.log_softmax(logits.double(), -1)[:, :-1].gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    predict = batch.target_mask[:, 1:]
    for k in range(3):
        got = out.target_logprobs[:, k, 1:].double()
        assert torch.allclose(got[predict], want[predict], atol=1e-5), (shared_prefix, k)
    # the clean sequence gives other numbers: the dropout reached the decoder
    with torch.no_grad():
        clean = model(collate(_rows(tok, PAIRS), pad_id=0))
    assert not torch.allclose(clean.target_logprobs, out.target_logprobs)
    # the posterior's view (the z-free pass over x and the clean y) is unchanged by the dropout
    assert torch.allclose(clean.zfree_target_logprobs, out.zfree_target_logprobs)


def test_replacement_is_unk_else_pad():
    class Tok:
        unk_token_id = None

    assert replacement_id(Tok(), 7) == 7
    Tok.unk_token_id = 3
    assert replacement_id(Tok(), 7) == 3


def test_run_with_word_dropout_trains_records_it_and_is_its_own_run(tiny_run, tmp_path):
    data, base = tiny_run
    flat = tiny_flat(data, base, device="cpu", steps=2, eval_every=2)
    cfg = TrainConfig.from_flat({**flat, "word_dropout": 0.4})
    assert [type(p) for p in plugins.active_plugins(cfg)] == [WordDropout]
    assert plugins.active_plugins(TrainConfig.from_flat(flat)) == []
    s = train_cvae(cfg, tmp_path / "run", progress=False)
    assert s["aid/word_dropout"] == 0.4 and s["word_dropout"] == 0.4 and np.isfinite(s["loss/val/reconstruction_loss"])
    # identity: at 0 the field is left out (runs recorded before it keep their ids), else it counts
    without = {k: v for k, v in flat.items() if k != "word_dropout"}
    assert run_id(flat) == run_id(without) != run_id({**flat, "word_dropout": 0.4})
    # the z-free control is trained the same way: with the same word dropout
    assert control_params({**flat, "word_dropout": 0.4})["word_dropout"] == 0.4


def test_word_dropout_out_of_range_is_a_one_line_error(tiny_run):
    data, base = tiny_run
    with pytest.raises(ValueError, match=r"word_dropout=1\.0 must be <= 0\.99"):
        TrainConfig.from_flat(tiny_flat(data, base, word_dropout=1.0))
