"""Decoding through each injection route with and without the key/value cache
(``zfree.models.decoding.decode_with_latents``), interleaved --repeats times in one process: the
seconds per route and path, and the ratio uncached / cached, with the greedy ids checked equal.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 .venv/bin/python analysis/benchmarks/bench_route_decoding.py \
        [--model smollm2-135m-instruct] [--rows 6] [--new 24] [--repeats 2]

--model: a name ``zfree model fetch`` knows (fetched once, then from its cache) or a local transformers
folder. The prefixes are the first --rows rows of the shipped E2E validation file; every row decodes
--new tokens (no end token stops it) with a K = 2 CVAE's latent value 0, its latent parameters moved
off zero so that u is not 0. Run it on an otherwise idle machine: the ratios, not the seconds, are
the result.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--rows", type=int, default=6)
    ap.add_argument("--new", type=int, default=24, help="new tokens per row")
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    import torch

    from zfree.core.paths import ROOT
    from zfree.data.batching import encode_pairs
    from zfree.data.pairs import load_pairs
    from zfree.models.decoding import decode_with_latents
    from zfree.models.discrete import DiscreteCVAE
    from zfree.models.loading import load_causal_lm
    from zfree.models.routes import INJECTIONS

    source = Path(a.model)
    if not source.exists():
        from zfree_lab.run.fetch import fetch_model

        source = fetch_model(a.model)
    base, tok = load_causal_lm(source)
    pairs = load_pairs(ROOT / "data" / "e2e" / "val.jsonl")[: a.rows]
    prefixes = [list(e.prefix_ids) for e in encode_pairs(tok, pairs)]
    print(f"model {source.name}: {a.rows} E2E prefixes of {min(map(len, prefixes))}-{max(map(len, prefixes))} "
          f"tokens, {a.new} new tokens each, greedy; {a.repeats} repeats interleaved; torch threads "
          f"{torch.get_num_threads()}")
    print(f"{'route':<10} {'cached s':>9} {'uncached s':>11} {'uncached/cached':>16}  ids equal")
    for route in INJECTIONS:
        model = DiscreteCVAE(base, n_latent=2, injection=route).eval()
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in [model.latent_embedding.weight, *model.injection.parameters()]:
                p.add_(0.02 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            lat = model.latent_vectors(torch.zeros(len(prefixes), dtype=torch.long))
        times, ids = {True: [], False: []}, {}
        for _ in range(a.repeats):
            for cache in (True, False):
                t0 = time.perf_counter()
                ids[cache] = decode_with_latents(model.backbone, prefixes, lat, eos_id=-1, max_new_tokens=a.new,
                                                 cache=cache)
                times[cache].append(time.perf_counter() - t0)
        c, u = statistics.median(times[True]), statistics.median(times[False])
        print(f"{route:<10} {c:>9.2f} {u:>11.2f} {u / c:>16.1f}  {ids[True] == ids[False]}")


if __name__ == "__main__":
    main()
