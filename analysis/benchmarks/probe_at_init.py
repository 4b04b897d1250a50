"""How well each posterior encoder's features predict the true strategy at initialization:
a held-out logistic-regression probe (first half of the validation rows train, second half test)
on the features the posterior head reads, from the shipped base run (issue: both CVAEs).

Usage: OMP_NUM_THREADS=1 .venv/bin/python analysis/benchmarks/probe_at_init.py [--base data/base/default]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from zfree.data.batching import collate, encode_pair, pad_id_of
from zfree.data.pairs import load_pairs
from zfree.evaluate.latent_stats import probe_accuracy
from zfree.models.base import load_base
from zfree.models.discrete import DiscreteCVAE


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="data/base/default")
    ap.add_argument("--data", default="data/synth/default/val.jsonl")
    a = ap.parse_args()
    torch.manual_seed(0)
    pairs = load_pairs(a.data)
    labels = np.array([p.strategy for p in pairs])
    print(f"{'posterior features':<20}{'probe accuracy':>16}   (held-out, {len(pairs) // 2} test rows; chance "
          f"{max(np.mean(labels == s) for s in set(labels)):.2f})")
    for feats in DiscreteCVAE.FEATURES:
        backbone, tok = load_base(f"{a.base}/model")
        model = DiscreteCVAE(backbone, 4, feats).eval()
        enc = [encode_pair(tok, p) for p in pairs]
        out = []
        with torch.no_grad():
            for i in range(0, len(enc), 200):
                out.append(model(collate(enc[i : i + 200], pad_id=pad_id_of(tok))).features.numpy())
        print(f"{feats:<20}{probe_accuracy(np.concatenate(out), labels):>16.3f}")


if __name__ == "__main__":
    main()
