"""A finished run's multi-reference outputs: once, after the final evaluation
(never at the intermediate ones), K outputs for ``MULTIREF_MRS`` evaluated MRs are decoded
(``zfree.evaluate.latent_stats.multiref_outputs``), written to ``multiref.parquet`` and scored
(``zfree.evaluate.multiref.multiref_metrics``) into summary.json's ``multiref/*`` keys. The study
table (``zfree_lab.experiment.multiref_table``) re-scores a z-free control at its CVAE's K."""

from __future__ import annotations

import time
from pathlib import Path

from zfree.config import LatentKind, TrainConfig
from zfree.core.io import atomic_write_parquet
from zfree.data.pairs import Pair, load_pairs
from zfree.evaluate.latent_stats import multiref_outputs
from zfree.evaluate.multiref import MULTIREF_MRS, MULTIREF_SAMPLES, multiref_metrics

MULTIREF_FILE = "multiref.parquet"


def references_by_x(pairs: list[Pair]) -> dict[str, list[str]]:
    """x -> the y of every row with that x, in file order (an MR's human references)."""
    out: dict[str, list[str]] = {}
    for p in pairs:
        out.setdefault(p.x, []).append(p.y)
    return out


def outputs_and_references(df, k: int | None = None) -> tuple[list[list[str]], list[list[str]]]:
    """Per MR of a ``multiref.parquet`` table (in its order): its outputs ordered by index (the first
    ``k`` only, when given) and its references. Returns (outputs, references)."""
    outs, refs = [], []
    for _, g in df.groupby("id", sort=False):
        g = g.sort_values("index")
        outs.append(list(g["output"])[:k])
        refs.append(list(g["references"].iloc[0]))
    return outs, refs


def write_multiref(out: Path, model, data, cfg: TrainConfig) -> dict[str, float]:
    """For a discrete run on data without strategies that decodes rows (``decode_rows`` > 0, as
    samples.parquet): ``out/multiref.parquet`` and its ``multiref_metrics`` plus
    ``multiref/decode_s`` (wall seconds of the decoding and scoring); {} for any other run. ``data``
    is training's RunData (val, val_pairs, tokenizer, eval_kw); the references are every row of
    ``cfg.data_dir``/val.jsonl with the MR's x."""
    if (model.latent_kind != LatentKind.DISCRETE or data.eval_kw.get("strategies") is not None
            or not cfg.optim.decode_rows):
        return {}
    t0 = time.time()
    refs = references_by_x(load_pairs(Path(cfg.data_dir) / "val.jsonl"))
    was_training = model.training
    model.eval()  # no dropout while decoding, as in ``evaluate``
    df = multiref_outputs(model, data.val, data.val_pairs, data.tokenizer, refs, n_x=MULTIREF_MRS,
                          n_samples=MULTIREF_SAMPLES, seed=cfg.optim.seed)
    model.train(was_training)
    atomic_write_parquet(out / MULTIREF_FILE, df)
    m = multiref_metrics(*outputs_and_references(df))
    m["multiref/decode_s"] = time.time() - t0
    return m
