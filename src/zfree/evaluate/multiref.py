"""Multi-reference evidence of what a discrete latent changes in y: for each
evaluated input x (an E2E meaning representation, MR) with several human references, K outputs —
the greedy y under each latent value k of a discrete CVAE — scored by

- **pairwise-BLEU** among the K outputs (lower = more diverse), and
- **#references covered**: each output picks the reference of its MR with the highest sentence
  BLEU; the number of distinct references picked, averaged over MRs (higher = the outputs follow
  different human realisations rather than one),

the protocol of Shen et al. 2019, "Mixture Models for Diverse Machine Translation: Tricks of the
Trade" (ICML 2019, arXiv:1902.07816), as their released scorer computes it (fairseq
``examples/translation_moe/score.py``, ``pairwise`` and ``multi_ref``). A z-free control (K = 1) is
compared through K samples at temperature 1 (``zfree.evaluate.latent_stats.multiref_outputs``).

Pure functions on lists of strings; BLEU is sacrebleu's (Post 2018), 13a tokenisation (our outputs
are detokenised text; fairseq scored pre-tokenised text with ``tokenize='none'``).
"""

from __future__ import annotations

import math
from itertools import permutations
from typing import Sequence

import numpy as np
from sacrebleu.metrics import BLEU

#: distinct evaluated x whose K outputs are decoded once at the end of a run
MULTIREF_MRS = 30
#: samples per MR drawn from a z-free control (K = 1): the largest K a shipped recipe uses
MULTIREF_SAMPLES = 6


def _corpus_bleu() -> BLEU:
    """sacrebleu's corpus BLEU with its defaults (13a tokens, 'exp' smoothing), as fairseq's ``corpus_bleu``."""
    return BLEU()


def _sentence_bleu() -> BLEU:
    """The released scorer's sentence BLEU: add 1 to the matched and total n-gram counts of orders
    2-4 (``smooth_method='add-k'``, k = 1 applies to n > 1 only), no effective order."""
    return BLEU(smooth_method="add-k", smooth_value=1, effective_order=False)


def pairwise_bleu(outputs: Sequence[Sequence[str]]) -> float:
    """Pairwise-BLEU (%) of ``outputs`` (one list of K strings per MR): one corpus BLEU over every
    ordered pair (i, j), i != j, of every MR, output j as the hypothesis and output i as its one
    reference (Shen et al. 2019; fairseq ``score.py``, ``pairwise``: the pairs are pooled into one
    corpus, not averaged). 100 when the K outputs of every MR are equal; lower = more diverse.
    NaN for no MR or K < 2 everywhere (no pair). ValueError for MRs with different K."""
    ks = {len(o) for o in outputs}
    if len(ks) > 1:
        raise ValueError(f"every MR needs the same number of outputs; got {sorted(ks)}")
    pairs = [(o[i], o[j]) for o in outputs for i, j in permutations(range(len(o)), 2)]  # (reference, hypothesis)
    if not pairs:
        return float("nan")
    return float(_corpus_bleu().corpus_score([h for _, h in pairs], [[r for r, _ in pairs]]).score)


def best_reference(output: str, references: Sequence[str]) -> int:
    """Index of the reference with the highest sentence BLEU of ``output`` (``_sentence_bleu``); ties go
    to the first (the released scorer draws a random one, which lets K identical outputs "cover"
    several tied references). ValueError for no reference."""
    if not references:
        raise ValueError("an MR needs at least one reference")
    bleu = _sentence_bleu()
    return int(np.argmax([bleu.corpus_score([output], [[r]]).score for r in references]))  # sentence_score, unwarned


def refs_covered(outputs: Sequence[Sequence[str]], references: Sequence[Sequence[str]]) -> float:
    """#references covered: per MR, the distinct references picked by its outputs
    (``best_reference``), averaged over MRs (Shen et al. 2019; fairseq ``score.py``, ``multi_ref``).
    In [1, min(K, #refs)]; 1 when the K outputs of every MR are equal; NaN for no MR. ValueError when
    ``outputs`` and ``references`` differ in length or an MR has no reference."""
    if len(outputs) != len(references):
        raise ValueError(f"{len(outputs)} MRs of outputs but {len(references)} of references")
    if not outputs:
        return float("nan")
    return float(np.mean([len({best_reference(h, rs) for h in hs}) for hs, rs in zip(outputs, references)]))


def multiref_metrics(outputs: Sequence[Sequence[str]], references: Sequence[Sequence[str]]) -> dict[str, float]:
    """``multiref/pairwise_bleu`` (%), ``multiref/refs_covered`` and ``multiref/n_mrs`` (MRs scored)
    of ``outputs`` (per MR, K strings) against ``references`` (per MR, its human references);
    ``multiref/n_outputs`` is K (NaN for no MR). Raises as ``pairwise_bleu`` and ``refs_covered``."""
    n_out = len(outputs[0]) if outputs else math.nan
    return {"multiref/pairwise_bleu": pairwise_bleu(outputs), "multiref/refs_covered": refs_covered(
        outputs, references), "multiref/n_mrs": float(len(outputs)), "multiref/n_outputs": float(n_out)}
