"""The z-free reference: per-example b, per-token surprisal, c_base, and its artifacts.

c_base = E_D[b(x, y)] > 0, estimated as the mean of b over the validation rows, nats per token
(docs/concepts/weightings.md; docs/concepts/problem.md: the two estimators). ``resolve_reference``:

  entangled_run      c_base and b from the base run's ``reference/``, checked against the model and data;
  pretrained_source  the validation rows scored with the source model now.

A base run's ``reference/`` holds per_example.parquet, per_token.parquet and reference.json (c_base,
the analytic c_base on the synthetic benchmark, the hashes of weights, tokenizer and data).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from zfree.core.errors import InputError
from zfree.data.batching import special_convention
from zfree.data.pairs import load_pairs
from zfree.core.io import atomic_write_json, atomic_write_parquet, read_json, sha256_file, sha256_state_dict
from zfree.reference.scoring import ScoreResult, load_scoring_model, score_pairs, tokenizer_sha256
from zfree.objective.theory import analytic_c_base

ReferenceSource = Literal["entangled_run", "pretrained_source"]


@dataclass
class Reference:
    """The z-free reference of a base run on one split: c_base, per-example b (and per-token b_t) and its metadata."""
    c_base: float  # nats per token
    per_example: pd.DataFrame  # id, b, n_tokens, sequence_nll (+ x_tokens_cut, valid)
    meta: dict
    per_token: pd.DataFrame | None = None  # id, position, token_id, surprisal
    stored: Path | None = None  # reference.json of a stored (entangled-run) reference: checked at step 0
    _b: dict | None = field(default=None, init=False, repr=False, compare=False)  # id -> b, built on first use
    _s: dict | None = field(default=None, init=False, repr=False, compare=False)  # id -> per-token surprisal

    def b_of(self, ids) -> list[float]:
        """b of each row in ``ids``. KeyError naming missing rows; ValueError naming rows whose b is
        not finite."""
        if self._b is None:
            self._b = dict(zip(self.per_example["id"], self.per_example["b"]))
        m = self._b
        missing = [i for i in ids if i not in m]
        if missing:
            raise KeyError(f"reference has no b for rows {missing[:5]}{'...' if len(missing) > 5 else ''}")
        bad = [i for i in ids if not math.isfinite(m[i])]
        if bad:
            raise ValueError(f"reference b is not finite for rows {bad[:5]}")
        return [float(m[i]) for i in ids]

    def surprisal_of(self, ids) -> list[np.ndarray]:
        """Per-token surprisal b_t over S (nats, in position order) of each row in ``ids`` (token shares:
        b_t / b_t.sum()). ValueError without per-token values, KeyError naming missing rows."""
        if self.per_token is None:
            raise ValueError("this reference has no per-token surprisal (per_token.parquet is missing)")
        if self._s is None:
            self._s = {k: g.sort_values("position")["surprisal"].to_numpy()
                       for k, g in self.per_token.groupby("id", sort=False)}
        groups = self._s
        missing = [i for i in ids if i not in groups]
        if missing:
            raise KeyError(f"reference has no per-token surprisal for rows {missing[:5]}")
        return [groups[i] for i in ids]


def _data_file(data_dir: Path | str, split: str) -> Path:
    p = Path(data_dir)
    return p if p.suffix == ".jsonl" else p / f"{split}.jsonl"


def _meta_from(res: ScoreResult, pairs, data_file: Path, estimator: str) -> dict:
    s = res.settings
    return {"c_base": res.c_base,
            "c_base_analytic": analytic_c_base(pairs) if all(p.bayes_nll is not None for p in pairs) else None,
            "n_rows": len(pairs), "n_valid": res.n_valid, "data_file": str(data_file),
            "data_sha256": sha256_file(data_file), "rows_sha256": s["data_sha256"],
            "model_sha256": s["weights_sha256"], "tokenizer_sha256": s["tokenizer_sha256"],
            "scoring": {**{k: s[k] for k in ("policy", "max_length", "bos_id", "sep_id", "eos_id", "dtype", "device",
                                             "scorer_version", "head_path")},
                        **{k: s[k] for k in ("empty_x_id",) if k in s}},
            "units": "nats per token (masked mean over y tokens and the end token)", "estimator": estimator}


def _check_c_base(c, where) -> float:
    if not isinstance(c, (int, float)) or not math.isfinite(c) or c <= 0:
        raise ValueError(f"{where}: c_base={c!r} must be a finite positive number")
    return float(c)


def build_reference(base_dir: Path | str, data_dir: Path | str, split: str = "val", *, device: str = "auto",
                    dtype: str = "float32", cache: bool | None = False) -> Reference:
    """Score the ``split`` rows with ``base_dir/model`` and write ``base_dir/reference/`` (module
    docstring); reference.json last. Not cached by default (``cache=None`` also fills the score
    cache). Errors as ``zfree.reference.scoring.score_file``; nothing is written then."""
    base_dir = Path(base_dir)
    data_file = _data_file(data_dir, split)
    pairs = load_pairs(data_file)
    model, tok = load_scoring_model(base_dir / "model", device=device, dtype=dtype)
    res = score_pairs(model, tok, pairs, cache=cache, progress=True)
    meta = {**_meta_from(res, pairs, data_file, "entangled_run"), "split": split}
    _check_c_base(res.c_base, f"reference of {base_dir}")
    ref_dir = base_dir / "reference"
    atomic_write_parquet(ref_dir / "per_example.parquet", res.per_example)
    atomic_write_parquet(ref_dir / "per_token.parquet", res.per_token)
    atomic_write_json(ref_dir / "reference.json", meta)  # last: its presence marks a complete reference
    return Reference(res.c_base, res.per_example, meta, res.per_token)


def load_reference(base_dir: Path | str) -> Reference:
    """c_base and b from ``base_dir/reference``, without the hash checks of ``resolve_reference``.
    FileNotFoundError naming a missing file; ValueError for a c_base missing, non-finite or <= 0;
    InputError when c_base is not the mean of b (``check_c_base_against_b``)."""
    ref_dir = Path(base_dir) / "reference"
    path = ref_dir / "reference.json"
    if not path.exists():
        raise FileNotFoundError(f"base run {base_dir} has no reference: {path} is missing "
                                f"(build it with `zfree base reference --base {base_dir} --data DATA_DIR`)")
    meta = read_json(path)
    c = _check_c_base(meta.get("c_base"), path)
    pe_path, pt_path = ref_dir / "per_example.parquet", ref_dir / "per_token.parquet"
    if not pe_path.exists():
        raise FileNotFoundError(f"base run {base_dir}: {pe_path} is missing")
    per_example = pd.read_parquet(pe_path)
    check_c_base_against_b(c, per_example, path, pe_path)
    return Reference(c, per_example, meta, pd.read_parquet(pt_path) if pt_path.exists() else None)


#: relative tolerance between reference.json's c_base and the mean of its per-example b (both are
#: float64 written from the same scores; anything beyond rounding means one of them was edited)
C_BASE_RTOL = 1e-6


def check_c_base_against_b(c_base: float, per_example: pd.DataFrame, json_path: Path, parquet_path: Path) -> None:
    """Refuse a reference whose c_base is not the mean of its per-example b over valid rows
    (the definition, ``ScoreResult.c_base``): |c_base - mean(b)| > C_BASE_RTOL * mean(b) raises
    ``InputError`` naming both files and both values."""
    if "b" not in per_example.columns:
        raise InputError(f"{parquet_path}: no column 'b' (per-example z-free loss)")
    b = pd.to_numeric(per_example["b"], errors="coerce").to_numpy(dtype=float)
    valid = np.isfinite(b)
    if "valid" in per_example.columns:
        valid = valid & per_example["valid"].to_numpy(dtype=bool)
    if not valid.any():
        raise InputError(f"{parquet_path}: no row has a finite b")
    mean_b = float(b[valid].mean())
    if not abs(c_base - mean_b) <= C_BASE_RTOL * abs(mean_b):
        raise InputError(f"{json_path}: c_base={c_base!r} is not the mean of b over the {int(valid.sum())} valid rows "
                         f"of {parquet_path} ({mean_b!r}; relative tolerance {C_BASE_RTOL:g}): the reference was "
                         "edited or mixed; rebuild it with `zfree base reference`")


def _mismatch(what: str, ref_dir: Path, stored: str, given: str, given_name: str) -> ValueError:
    return ValueError(f"entangled-run reference {ref_dir} was computed from {what} {stored[:12]}..., but {given_name} "
                      f"has {given[:12]}...: rebuild it (`zfree base reference`) or use source='pretrained_source'")


def resolve_reference(source: str, base_dir: Path | str, data_dir: Path | str, split: str = "val", *,
                      model=None, tokenizer=None, device: str = "auto", dtype: str = "float32",
                      cache: bool | None = None, cache_dir: Path | str | None = None) -> Reference:
    """The z-free reference for a CVAE run by either estimator (``ReferenceSource``).

    entangled_run: ``load_reference``, its data hash checked against ``data_dir/<split>.jsonl`` (or
        ``data_dir`` itself, a .jsonl file), its weight hash against ``model`` as loaded (else
        ``base_dir/model``), its tokenizer hash and token convention against ``tokenizer`` (or the loaded one).
    pretrained_source: the rows scored now with ``model``/``tokenizer``, else the model of
        ``base_dir/model`` (or ``base_dir``); cached as ``score_pairs``; nothing written.

    Raises ValueError for an unknown source, a hash mismatch (naming both hashes) or a c_base not
    finite and positive; InputError for another token convention; FileNotFoundError for missing
    artifacts or data.
    """
    base_dir = Path(base_dir)
    data_file = _data_file(data_dir, split)
    handlers = {"entangled_run": _entangled_run, "pretrained_source": _pretrained_source}
    if source not in handlers:
        raise ValueError(f"reference source={source!r}: expected one of {sorted(handlers)}")
    if not data_file.exists():
        raise FileNotFoundError(f"data file {data_file} does not exist")
    return handlers[source](base_dir, data_file, model=model, tokenizer=tokenizer, device=device, dtype=dtype,
                            cache=cache, cache_dir=cache_dir)


def _entangled_run(base_dir: Path, data_file: Path, *, model, tokenizer, device, dtype, cache, cache_dir) -> Reference:
    ref = load_reference(base_dir)
    ref_dir = base_dir / "reference"
    data_sha = sha256_file(data_file)
    if ref.meta.get("data_sha256") != data_sha:
        raise _mismatch("data", ref_dir, str(ref.meta.get("data_sha256")), data_sha, str(data_file))
    if model is None:
        model, tok = load_scoring_model(base_dir / "model", device="cpu", dtype="float32")
        tokenizer = tokenizer or tok
        name = str(base_dir / "model")
    else:
        name = "the model given"
    model_sha = sha256_state_dict(model.state_dict())
    if ref.meta.get("model_sha256") != model_sha:
        raise _mismatch("weights", ref_dir, str(ref.meta.get("model_sha256")), model_sha, name)
    if tokenizer is not None and ref.meta.get("tokenizer_sha256"):
        tok_sha = tokenizer_sha256(tokenizer)
        if ref.meta["tokenizer_sha256"] != tok_sha:
            raise _mismatch("tokenizer", ref_dir, ref.meta["tokenizer_sha256"], tok_sha, "the tokenizer given")
    if tokenizer is not None:
        check_convention(ref.meta, tokenizer, ref_dir / "reference.json")
    ref.meta = {**ref.meta, "estimator": "entangled_run", "checked": True}
    ref.stored = ref_dir / "reference.json"
    return ref


#: the token conventions a reference.json records under ``scoring`` and a run's encoding must share
CONVENTION_KEYS = ("bos_id", "sep_id", "eos_id")
#: the token before y when x is empty (``Convention.empty_x_id``); checked where recorded
EMPTY_X_KEY = "empty_x_id"


def check_convention(meta: dict, tokenizer, json_path: Path) -> None:
    """InputError naming the file, the key and both values when a stored reference's token convention
    (``CONVENTION_KEYS``, ``EMPTY_X_KEY``) is not the one ``special_convention`` now derives from
    ``tokenizer`` under the stored policy (same hashes, other code)."""
    stored = meta.get("scoring") or {}
    policy = stored.get("policy") or {}
    try:
        conv = special_convention(tokenizer, bos=policy.get("bos", "auto"), sep=policy.get("sep", "auto"),
                                  add_eos=policy.get("add_eos", True))
    except ValueError as e:
        raise InputError(f"{json_path}: its scoring policy {policy} does not apply to this tokenizer: {e}") from None
    now = {"bos_id": conv.bos_id, "sep_id": conv.sep_id, "eos_id": conv.eos_id, EMPTY_X_KEY: conv.empty_x_id}
    for key in (*CONVENTION_KEYS, EMPTY_X_KEY):
        if key in stored and stored[key] != now[key]:
            raise InputError(f"{json_path}: scored with {key}={stored[key]!r}, but the code now encodes with "
                             f"{key}={now[key]!r} (policy {policy}): the reference no longer matches; rebuild it "
                             "with `zfree base reference`")


#: |rho_recon - 1| allowed at step 0, where the decoder equals the base model
#: (docs/concepts/problem.md#models): float32/float64 runs differ from the reference by rounding only;
#: a bf16/fp16 body moves single tokens by ~1e-2
RHO0_TOL = 1e-3
RHO0_TOL_LOW_PRECISION = 1e-2


def check_step0_rho(rho0: float, ref_file: Path, low_precision: bool = False,
                    remedy: str = "rebuild it with `zfree base reference`") -> None:
    """At step 0 the CVAE's decoder is the base model (docs/concepts/problem.md#models; a prefix run's: the
    base reading the route's initial soft token, ``zfree.reference.prefix``), so rho_recon =
    R_val / mean(b over the same rows) must be 1 within ``RHO0_TOL`` (``RHO0_TOL_LOW_PRECISION`` for a
    bf16/fp16 model); else ``InputError`` naming ``ref_file``, the difference and ``remedy``."""
    tol = RHO0_TOL_LOW_PRECISION if low_precision else RHO0_TOL
    if not (math.isfinite(rho0) and abs(rho0 - 1.0) <= tol):
        raise InputError(f"{ref_file}: step-0 rho_recon is {rho0:.6f}, not 1 within {tol:g}: the base model now scores "
                         f"these rows {100 * (rho0 - 1):+.3f}% off its stored b (other scoring code or conventions); "
                         f"{remedy}")


def _pretrained_source(base_dir: Path, data_file: Path, *, model, tokenizer, device, dtype, cache, cache_dir
                       ) -> Reference:
    pairs = load_pairs(data_file)
    if (model is None) != (tokenizer is None):
        raise ValueError("pretrained_source: pass both model and tokenizer, or neither (to load them from base_dir)")
    if model is None:
        model_dir = base_dir / "model" if (base_dir / "model").is_dir() else base_dir
        model, tokenizer = load_scoring_model(model_dir, device=device, dtype=dtype)
    res = score_pairs(model, tokenizer, pairs, cache=cache, cache_dir=cache_dir)
    c = _check_c_base(res.c_base, f"pretrained-source reference from {base_dir} on {data_file}")
    meta = {**_meta_from(res, pairs, data_file, "pretrained_source"), "source_dir": str(base_dir),
            "cache_hit": res.cache_hit}
    return Reference(c, res.per_example, meta, res.per_token)
