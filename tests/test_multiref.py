"""zfree.evaluate.multiref against sacrebleu called directly (the pooled pairwise corpus and the
add-1 sentence BLEU of Shen et al.'s released scorer) and hand-computed small cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import sacrebleu

from zfree.evaluate.multiref import best_reference, multiref_metrics, pairwise_bleu, refs_covered

OUTS = [["the cat sat on the mat", "a cat sat on a mat", "the dog ran in the park"],
        ["there is a pub near the river", "a pub is near the river", "near the river there is a pub"]]


def test_pairwise_bleu_is_sacrebleu_on_the_pooled_ordered_pairs():
    hyp, ref = [], []
    for o in OUTS:  # every ordered pair (i, j), i != j: output j scored against output i
        for i in range(3):
            for j in range(3):
                if i != j:
                    hyp.append(o[j])
                    ref.append(o[i])
    assert len(hyp) == 2 * 6
    assert pairwise_bleu(OUTS) == pytest.approx(sacrebleu.corpus_bleu(hyp, [ref]).score, abs=1e-12)


def test_pairwise_bleu_hand_cases():
    assert pairwise_bleu([["a b c d e", "a b c d e"]] * 3) == pytest.approx(100.0)  # equal outputs
    assert pairwise_bleu([["a b c d e", "f g h i j"]]) == 0.0  # no shared n-gram
    assert math.isnan(pairwise_bleu([["a b c"], ["d e f"]]))  # K = 1: no pair
    assert math.isnan(pairwise_bleu([]))
    with pytest.raises(ValueError, match="same number of outputs"):
        pairwise_bleu([["a", "b"], ["c"]])


def test_best_reference_is_the_add_one_sentence_bleu_argmax():
    refs = ["the cat sat on the mat", "a dog ran in a park", "the cat is on the mat"]
    for h in ("the cat sat on a mat", "a dog ran in the park", "the cat is on a mat"):
        want = [sacrebleu.sentence_bleu(h, [r], smooth_method="add-k", smooth_value=1,
                                        use_effective_order=False).score for r in refs]
        assert best_reference(h, refs) == int(np.argmax(want))
    assert best_reference("x y z", ["a b", "c d"]) == 0  # a tie (BLEU 0 to both): the first
    with pytest.raises(ValueError, match="at least one reference"):
        best_reference("a", [])


def test_refs_covered_hand_cases():
    refs = [["the cat sat on the mat", "a dog ran in a park", "the cat is on the mat"]]
    assert refs_covered([refs[0]], refs) == 3.0  # each output is one reference
    assert refs_covered([[refs[0][0]] * 3], refs) == 1.0  # equal outputs cover one
    two = [["the cat sat on the mat", "a dog ran in a park"], ["p q r s", "p q r s"]]
    assert refs_covered(two, [refs[0], ["p q r s", "t u v w"]]) == pytest.approx((2 + 1) / 2)
    assert math.isnan(refs_covered([], []))
    with pytest.raises(ValueError, match="MRs of outputs"):
        refs_covered([["a"]], [])


def test_multiref_metrics_keys():
    m = multiref_metrics(OUTS, [OUTS[0], OUTS[1][:1]])
    assert set(m) == {"multiref/pairwise_bleu", "multiref/refs_covered", "multiref/n_mrs", "multiref/n_outputs"}
    assert m["multiref/n_mrs"] == 2 and m["multiref/n_outputs"] == 3
    assert m["multiref/refs_covered"] == pytest.approx((3 + 1) / 2)  # the second MR has one reference
    assert math.isnan(multiref_metrics([], [])["multiref/n_outputs"])
