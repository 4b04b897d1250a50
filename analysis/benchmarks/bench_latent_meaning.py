"""What "what z learned" costs against the evaluation it rides on: one run's evaluation with and
without the token lifts collected (``zfree_lab.run.latent_meaning.COLLECT_LIFTS``), interleaved
--repeats times in one process, and the time ``write_latent_meaning`` then takes, as ratios.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 .venv/bin/python analysis/benchmarks/bench_latent_meaning.py --run RUN_DIR [--rows 64]

RUN_DIR: any discrete run folder with a learned or optimal posterior (its config.json is reused in a
temporary folder; the weights are the run's initial ones: the cost does not depend on them). For a
49k-vocabulary model, a run of ``zfree study --preset e2e-smollm2 --model <tiny 49k folder> ...`` or
of the SmolLM2 study. Run it on an otherwise idle machine: the ratios, not the seconds, are the result.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="a discrete run folder (its config.json)")
    ap.add_argument("--rows", type=int, default=64, help="evaluated rows (the run's eval_rows capped)")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    from zfree.config import TrainConfig
    from zfree_lab.run import latent_meaning as lm
    from zfree_lab.run.metrics import evaluate
    from zfree_lab.run.run_folder import read_run_config
    from zfree_lab.run.run_setup import setup_run

    flat = read_run_config(Path(a.run) / "config.json")  # portable and zfree: paths resolved as a run does
    cfg = TrainConfig.from_flat(flat)
    tmp = Path(tempfile.mkdtemp())
    try:
        run = setup_run(cfg, tmp / "run", progress=False)
        data = run.data
        val, pairs = data.val[: a.rows], data.val_pairs[: a.rows]
        kw = {**data.eval_kw, "b": data.eval_kw["b"][: a.rows], "decode_rows": 0}
        times = {True: [], False: []}
        ev = None
        for _ in range(a.repeats):
            for collect in (False, True):
                lm.COLLECT_LIFTS = collect
                t0 = time.perf_counter()
                e = evaluate(run.model, val, pairs, step=0, **kw)
                times[collect].append(time.perf_counter() - t0)
                ev = e if collect else ev
        lm.COLLECT_LIFTS = True
        t0 = time.perf_counter()
        lm.write_latent_meaning(tmp, ev, pairs, latent_kind=run.model.latent_kind, given=False,
                                tokenizer=data.tokenizer, strategies=kw.get("strategies"), seed=0)
        write_s = time.perf_counter() - t0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base, withl = statistics.median(times[False]), statistics.median(times[True])
    vocab = run.model.backbone.get_input_embeddings().weight.shape[0]
    print(f"rows {len(val)}, K = {run.model.n_latent}, vocabulary {vocab}, {a.repeats} interleaved repeats (median)")
    print(f"evaluation without lifts {base:.2f} s, with lifts {withl:.2f} s: x{withl / base:.3f}")
    print(f"write_latent_meaning {write_s:.2f} s: {write_s / base:.1%} of the evaluation")
    print(f"total overhead: {(withl - base + write_s) / base:.1%} of an evaluation (target <= 10 %)")


if __name__ == "__main__":
    main()
