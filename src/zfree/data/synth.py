"""Synthetic strategy benchmark (docs/concepts/problem.md#benchmark).

Each x is a sequence of digits over a vocabulary of V symbols with length in [n_min, n_max]; a
hidden strategy s (a named function) produces y = s(x). Because the generator knows the strategy
set and its prior pi(s | x), it knows the Bayes-optimal z-free loss of every example:

    -log p*(y | x) = -log sum_{s : s(x) = y} pi(s | x)        (nats per sequence)

which is log(K / m) under the uniform prior (m = number of strategies that map x to y). It is
stored on every row as ``bayes_nll`` so c_base has an exact analytic value (``zfree.objective.theory``).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Literal, Sequence

import numpy as np

from zfree.core.io import atomic_write_json, atomic_write_text, sha256_file
from zfree.core.validation import check_choice, check_int, check_range
from zfree.core.values import typed_fields
from zfree.data.pairs import Pair

Digits = tuple[int, ...]


def _swap_pairs(x: Digits) -> Digits:
    out = list(x)
    for i in range(0, len(out) - 1, 2):
        out[i], out[i + 1] = out[i + 1], out[i]
    return tuple(out)


#: The named strategies. Each maps a digit tuple to a digit tuple of the same length.
STRATEGIES: dict[str, Callable[[Digits], Digits]] = {
    "sort_asc": lambda x: tuple(sorted(x)),
    "sort_desc": lambda x: tuple(sorted(x, reverse=True)),
    "reverse": lambda x: tuple(reversed(x)),
    "copy": lambda x: tuple(x),
    "rotate_left": lambda x: tuple(x[1:]) + tuple(x[:1]),
    "rotate_right": lambda x: tuple(x[-1:]) + tuple(x[:-1]),
    "swap_pairs": _swap_pairs,
}


@dataclass(frozen=True)
class DataConfig:
    """Synthetic strategy benchmark (docs/concepts/problem.md#benchmark)."""

    vocab_size: int = 10  # digits 0..V-1
    n_min: int = 4  # shortest x
    n_max: int = 12  # longest x; y has the same length, |S| = |y| + 1 (end token)
    strategies: Sequence[str] = ("sort_asc", "sort_desc", "reverse", "copy")  # stored as a tuple
    prior: Literal["uniform", "x_dependent"] = "uniform"
    prior_strength: float = 3.0  # x_dependent: weight of the favoured strategy (others 1)
    n_train: int = 50_000
    n_val: int = 1_000
    n_test: int = 1_000
    seed: int = 0

    def __post_init__(self):
        typed_fields(self)
        if isinstance(self.strategies, str):
            raise ValueError(f"strategies={self.strategies!r} must be a sequence of names, not one string")
        object.__setattr__(self, "strategies", tuple(self.strategies))
        for name, lo in (("vocab_size", 2), ("n_min", 1), ("n_max", None), ("n_train", 1), ("n_val", 1), ("n_test", 1)):
            check_int(name, getattr(self, name), lo)
        check_int("seed", self.seed, 0)  # numpy's SeedSequence rejects negative entropy
        for s in self.strategies:
            if s not in STRATEGIES:
                raise ValueError(f"strategies: unknown strategy {s!r}; valid: {sorted(STRATEGIES)}")
        if len(set(self.strategies)) != len(self.strategies) or len(self.strategies) < 1:
            raise ValueError(f"strategies={self.strategies!r} must be non-empty and distinct")
        if self.n_min > self.n_max:
            raise ValueError(f"n_min={self.n_min} > n_max={self.n_max}: n_min must be <= n_max")
        check_choice("prior", self.prior, Literal["uniform", "x_dependent"])
        check_range("prior_strength", self.prior_strength, 0, lo_open=True)


def strategy_prior(x: Digits, strategies: Sequence[str], prior: str, prior_strength: float) -> np.ndarray:
    """pi(s | x) over ``strategies``, shape (n_strategies,), sums to 1.

    ``uniform``: 1/K. ``x_dependent``: the strategy whose index equals x[0] mod K gets weight
    ``prior_strength`` and the others weight 1, then normalized (exercises the router p(z | x)).
    Raises ValueError for another prior (listing the valid ones).
    """
    if prior not in STRATEGY_PRIORS:
        raise ValueError(f"prior={prior!r} is not one of {sorted(STRATEGY_PRIORS)}")
    return STRATEGY_PRIORS[prior](x, len(strategies), prior_strength)


def _x_dependent_prior(x: Digits, k: int, prior_strength: float) -> np.ndarray:
    w = np.ones(k)
    w[x[0] % k] = prior_strength
    return w / w.sum()


#: DataConfig.prior -> pi(s | x) over k strategies
STRATEGY_PRIORS: dict[str, Callable[[Digits, int, float], np.ndarray]] = {
    "uniform": lambda x, k, prior_strength: np.full(k, 1.0 / k), "x_dependent": _x_dependent_prior}


def bayes_nll(x: Digits, y: Digits, strategies: Sequence[str], prior: str = "uniform", prior_strength: float = 3.0) -> tuple[float, int]:
    """Bayes-optimal z-free loss of one example and its ambiguity.

    Returns (-log sum_{s: s(x)=y} pi(s|x) in nats per sequence, m = #strategies mapping x to y);
    log(K/m) under the uniform prior, exactly -0.0 when every strategy agrees. Raises ValueError if
    no strategy maps x to y.
    """
    pi = strategy_prior(x, strategies, prior, prior_strength)
    hits = [i for i, s in enumerate(strategies) if STRATEGIES[s](x) == tuple(y)]
    if not hits:
        raise ValueError(f"no strategy in {list(strategies)} maps x={x} to y={y}")
    mass = 1.0 if len(hits) == len(strategies) else float(pi[hits].sum())
    return float(-math.log(mass)), len(hits)


def digits_to_text(d: Digits) -> str:
    """(3, 1, 2) -> "3 1 2" (the benchmark's text form)."""
    return " ".join(str(v) for v in d)


def text_to_digits(s: str) -> Digits:
    """"3 1 2" -> (3, 1, 2); ValueError for a token that is not an integer."""
    return tuple(int(v) for v in s.split())


_SPLITS = {"train": 0, "val": 1, "test": 2}


def generate_split(cfg: DataConfig, split: str, n_rows: int) -> list[dict]:
    """Rows ``{id, x, y, strategy, bayes_nll, n_consistent}`` for one split, deterministic in
    (cfg, split): each split has its own random stream, so n_rows of one split never shifts
    another. Raises ValueError for a split other than train / val / test."""
    if split not in _SPLITS:
        raise ValueError(f"split={split!r} is not one of {list(_SPLITS)}")
    split_index = _SPLITS[split]
    rng = np.random.default_rng([cfg.seed, split_index])
    rows = []
    for i in range(n_rows):
        x, s = _draw(cfg, rng)
        y = STRATEGIES[s](x)
        nll, m = bayes_nll(x, y, cfg.strategies, cfg.prior, cfg.prior_strength)
        rows.append({"id": f"{split}-{i:06d}", "x": digits_to_text(x), "y": digits_to_text(y),
                     "strategy": s, "bayes_nll": nll, "n_consistent": m})
    return rows


def _draw(cfg: DataConfig, rng: np.random.Generator) -> tuple[Digits, str]:
    """One x (length uniform in [n_min, n_max], digits uniform) and its strategy s ~ pi(s | x)."""
    n = int(rng.integers(cfg.n_min, cfg.n_max + 1))
    x = tuple(int(v) for v in rng.integers(0, cfg.vocab_size, size=n))
    pi = strategy_prior(x, cfg.strategies, cfg.prior, cfg.prior_strength)
    return x, cfg.strategies[int(rng.choice(len(cfg.strategies), p=pi))]


def sample_pairs(cfg: DataConfig, rng: np.random.Generator, n_rows: int) -> list:
    """``n_rows`` fresh (x, y) pairs from the benchmark's distribution, as ``Pair`` (ids ``fresh-<i>``)."""
    out = []
    for i in range(n_rows):
        x, s = _draw(cfg, rng)
        out.append(Pair(f"fresh-{i}", digits_to_text(x), digits_to_text(STRATEGIES[s](x)), s))
    return out


def write_benchmark(cfg: DataConfig, out_dir: Path | str) -> Path:
    """Generate train/val/test JSONL and ``metadata.json`` (parameters, sha256 per split).

    Each file is written atomically; a folder whose metadata matches ``cfg`` and whose files match
    their sha256 is reused untouched. ``FileExistsError`` (nothing overwritten) for a folder with other
    parameters, split files but no metadata, or files that no longer match their sha256.
    """
    out = Path(out_dir)
    meta_path = out / "metadata.json"
    params = asdict(cfg)
    params["strategies"] = list(cfg.strategies)
    if meta_path.exists():
        old = json.loads(meta_path.read_text())
        if old.get("parameters") != params:
            raise FileExistsError(f"{out} holds a benchmark with other parameters; choose another --out")
        for split, digest in old.get("sha256", {}).items():
            f = out / f"{split}.jsonl"
            if not f.exists() or sha256_file(f) != digest:
                raise FileExistsError(f"{f} is missing or does not match the sha256 in {meta_path}; "
                                      "delete the folder to regenerate it")
        return out
    present = [s for s in _SPLITS if (out / f"{s}.jsonl").exists()]
    if present:
        raise FileExistsError(f"{out} holds {present} files but no metadata.json; not overwriting them")

    sha = {}
    for split, n in (("train", cfg.n_train), ("val", cfg.n_val), ("test", cfg.n_test)):
        rows = generate_split(cfg, split, n)
        atomic_write_text(out / f"{split}.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
        sha[split] = sha256_file(out / f"{split}.jsonl")
    atomic_write_json(meta_path, {"kind": "zfree.synthetic_strategy_benchmark", "parameters": params, "sha256": sha})
    return out
