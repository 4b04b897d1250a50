"""The z-free reference of a prefix-route run (``injection: prefix``, ``zfree.models.routes.PrefixRoute``).

The prefix route inserts one soft token s + u before the separator. At step 0 (u = 0, s = s_0 the mean
input embedding, ``zfree.models.routes.initial_soft_token``) its decoder is the base model reading
[bos] x, s_0, sep, y — not the base model reading (x, y), since the soft token changes the context. So a
prefix run's reference is scored *through the prefix*:

  b(x, y) = (1/|S|) sum_{t in S} -log p_base(y_t | x, s_0, sep, y_<t)    nats per token (masked mean over S)
  b_t     = -log p_base(y_t | x, s_0, sep, y_<t)                          nats, per token of S
  c_base  = mean of b over the validation rows (valid rows), nats per token

with the base model as loaded (before any training step), in the conventions of
``zfree.reference.scoring`` (x and y tokenized separately, x cut from the left, S = y and the end token).
Every weighting's c_base and b of a prefix run are these (docs/concepts/problem.md#routes), and the run's
step-0 check (``zfree.reference.reference.check_step0_rho``: rho_recon = 1 within 1e-3) compares against
them. They are scored by ``score_pairs(..., soft_token=s_0)``: the scorer's own batching, padding and head
path, with the soft token inserted as an input embedding — not the route's shared-prefix pass the check
reads, so the check can fail.

A run folder holds one reference per split it reads b of, ``PREFIX_REFERENCE_DIR/<split>/``:
per_example.parquet, per_token.parquet, soft_token.safetensors (s_0 as scored) and reference.json (c_base,
the route, the hashes of the weights, tokenizer, rows and soft token, the scoring settings; written last).
``prefix_reference`` reads it back instead of rescoring when reference.json records the same inputs
(``MATCH_KEYS``), so a resumed run does not rescore.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pandas as pd
import torch
from jaxtyping import Float
from safetensors.torch import load_file, save_file

from zfree.core.io import atomic_replace, atomic_write_json, atomic_write_parquet, read_json, sha256_state_dict
from zfree.data.pairs import Pair, load_pairs
from zfree.reference.reference import Reference, _check_c_base, _meta_from, check_c_base_against_b
from zfree.reference.score_cache import rows_sha256, tokenizer_sha256
from zfree.reference.scoring import SCORER_VERSION, ScoringPolicy, context_length, score_pairs, soft_token_sha256

# a run folder's prefix references, one folder per split (module docstring), and what a stored one must record
# to be read back instead of rescored: named in a module without torch (the study tables read them)
from zfree.reference.records import MATCH_KEYS, PREFIX_REFERENCE_DIR  # noqa: F401
ESTIMATOR = "prefix_route"


def _inputs(model, tokenizer, pairs, soft_token) -> dict:
    """The ``MATCH_KEYS`` values of scoring ``pairs`` with ``model`` through ``soft_token`` now."""
    policy = ScoringPolicy()
    return {"route": "prefix", "model_sha256": sha256_state_dict(model.state_dict()),
            "tokenizer_sha256": tokenizer_sha256(tokenizer), "rows_sha256": rows_sha256(pairs),
            "soft_token_sha256": soft_token_sha256(soft_token), "scorer_version": SCORER_VERSION,
            "policy": asdict(policy), "max_length": policy.max_length or context_length(model),
            "dtype": str(next(model.parameters()).dtype).replace("torch.", "")}


def prefix_reference(model, tokenizer, data_file: Path | str, soft_token: Float[torch.Tensor, "d_model"],
                     ref_dir: Path | str, *, pairs: list[Pair] | None = None, split: str = "val") -> Reference:
    """The prefix reference of the rows of ``data_file`` (or ``pairs``, read from it) under ``model`` (the base
    as loaded, before training) reading ``soft_token`` (s_0): read from ``ref_dir`` when its reference.json
    records the same inputs (``MATCH_KEYS``; meta ``rescored`` False), else scored now (``score_pairs``, no
    score cache: ``ref_dir`` is the cache) and written there, reference.json last (``rescored`` True). The
    returned ``Reference.stored`` is that reference.json: the run's step-0 check reads it. Raises ValueError
    for a c_base not finite and positive, errors as ``score_pairs``."""
    ref_dir, data_file = Path(ref_dir), Path(data_file)
    pairs = load_pairs(data_file) if pairs is None else pairs
    soft = soft_token.detach()
    want = _inputs(model, tokenizer, pairs, soft)
    if (stored := _load_matching(ref_dir, want)) is not None:
        return stored
    res = score_pairs(model, tokenizer, pairs, cache=False, soft_token=soft)
    _check_c_base(res.c_base, f"prefix reference of {data_file}")
    meta = {**_meta_from(res, pairs, data_file, ESTIMATOR), **want, "split": split,
            "units": "nats per token (masked mean over y tokens and the end token), the base model reading "
                     "[bos] x, s_0, sep, y (s_0 the prefix route's initial soft token)"}
    atomic_write_parquet(ref_dir / "per_example.parquet", res.per_example)
    atomic_write_parquet(ref_dir / "per_token.parquet", res.per_token)
    atomic_replace(ref_dir / "soft_token.safetensors",
                   lambda p: save_file({"soft_token": soft.cpu().contiguous()}, str(p)))
    atomic_write_json(ref_dir / "reference.json", meta)  # last: its presence marks a complete reference
    return Reference(res.c_base, res.per_example, {**meta, "rescored": True}, res.per_token,
                     stored=ref_dir / "reference.json")


def _load_matching(ref_dir: Path, want: dict) -> Reference | None:
    """The reference stored in ``ref_dir`` when complete and recording ``want`` on every ``MATCH_KEYS``
    (a stored soft token's hash rechecked from its file); else None (a note printed for a mismatch)."""
    path = ref_dir / "reference.json"
    if not path.exists():
        return None
    meta = read_json(path)
    differ = [k for k in MATCH_KEYS if meta.get(k) != want[k]]
    soft_file = ref_dir / "soft_token.safetensors"
    if not differ and (not soft_file.exists()
                       or soft_token_sha256(load_file(str(soft_file))["soft_token"]) != want["soft_token_sha256"]):
        differ = ["soft_token.safetensors"]
    if differ:
        print(f"note: {path} was scored with other {', '.join(differ)}: scoring the prefix reference again",
              flush=True)
        return None
    c = _check_c_base(meta.get("c_base"), path)
    per_example = pd.read_parquet(ref_dir / "per_example.parquet")
    check_c_base_against_b(c, per_example, path, ref_dir / "per_example.parquet")
    return Reference(c, per_example, {**meta, "rescored": False}, pd.read_parquet(ref_dir / "per_token.parquet"),
                     stored=path)
