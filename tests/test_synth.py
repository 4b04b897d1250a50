"""zfree.data.synth: determinism, the Bayes-optimal z-free loss against brute force, row
correctness, metadata checksums and the no-overwrite contract (docs/concepts/problem.md#benchmark)."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from zfree.data.synth import STRATEGIES, DataConfig, bayes_nll, generate_split, strategy_prior, text_to_digits, write_benchmark

SMALL = dict(vocab_size=5, n_min=2, n_max=6, n_train=120, n_val=40, n_test=30)
ALL = tuple(STRATEGIES)
SHIPPED = Path(__file__).resolve().parents[1] / "data" / "synth" / "default"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# ----------------------------------------------------------------------------- Bayes-optimal loss


@pytest.mark.parametrize("strategies", [ALL, ("sort_asc", "sort_desc", "reverse", "copy"), ("copy", "rotate_left")])
def test_bayes_nll_uniform_equals_brute_force_log_k_over_m(strategies):
    """Every x over V = 3 with n in 1..4 and every strategy: -log p*(y|x) = log(K/m)."""
    K = len(strategies)
    for n in range(1, 5):
        for x in itertools.product(range(3), repeat=n):
            outputs = [tuple(STRATEGIES[s](x)) for s in strategies]
            for y in outputs:
                m = sum(o == y for o in outputs)
                got, got_m = bayes_nll(x, y, strategies)
                assert got_m == m
                assert math.isclose(got, math.log(K / m), rel_tol=1e-12, abs_tol=1e-15), (x, y)
                assert got >= 0


@pytest.mark.parametrize("strength", [3.0, 0.5])
def test_bayes_nll_x_dependent_is_minus_log_summed_prior_mass(strength):
    strategies = ("sort_asc", "sort_desc", "reverse", "copy", "rotate_left")
    K = len(strategies)
    for n in range(1, 5):
        for x in itertools.product(range(3), repeat=n):
            # prior written out independently: index x[0] mod K has weight `strength`, the others 1
            w = [strength if i == x[0] % K else 1.0 for i in range(K)]
            for s in strategies:
                y = STRATEGIES[s](x)
                mass = sum(wi for wi, s2 in zip(w, strategies) if STRATEGIES[s2](x) == y) / sum(w)
                got, m = bayes_nll(x, y, strategies, "x_dependent", strength)
                assert math.isclose(got, -math.log(mass), rel_tol=1e-12, abs_tol=1e-12), (x, s)
                assert got >= 0 and m == sum(STRATEGIES[s2](x) == y for s2 in strategies)


def test_bayes_nll_is_exactly_zero_when_every_strategy_agrees():
    for prior in ("uniform", "x_dependent"):
        got, m = bayes_nll((2, 2, 2), (2, 2, 2), ALL, prior, 3.0)
        assert got == 0.0 and m == len(ALL)


def test_bayes_nll_rejects_an_unreachable_y():
    with pytest.raises(ValueError, match="no strategy"):
        bayes_nll((1, 2, 3), (9, 9, 9), ALL)


@given(x=st.lists(st.integers(0, 9), min_size=1, max_size=8), strength=st.floats(0.1, 10.0))
def test_strategy_prior_is_a_distribution(x, strength):
    for prior in ("uniform", "x_dependent"):
        pi = strategy_prior(tuple(x), ALL, prior, strength)
        assert pi.shape == (len(ALL),) and np.all(pi > 0)
        assert math.isclose(pi.sum(), 1.0, rel_tol=1e-12)


@given(x=st.lists(st.integers(0, 9), min_size=1, max_size=10))
def test_every_strategy_preserves_length_and_multiset(x):
    for s, f in STRATEGIES.items():
        y = f(tuple(x))
        assert isinstance(y, tuple) and sorted(y) == sorted(x), s


# ----------------------------------------------------------------------------- generated rows


@pytest.mark.parametrize("prior", ["uniform", "x_dependent"])
def test_every_row_is_produced_by_its_strategy(prior):
    cfg = DataConfig(**SMALL, strategies=("sort_asc", "reverse", "copy", "swap_pairs"), prior=prior)
    rows = generate_split(cfg, "val", 300)
    assert [r["id"] for r in rows] == [f"val-{i:06d}" for i in range(300)]
    for r in rows:
        x, y = text_to_digits(r["x"]), text_to_digits(r["y"])
        assert cfg.n_min <= len(x) <= cfg.n_max and all(0 <= v < cfg.vocab_size for v in x)
        assert r["strategy"] in cfg.strategies
        assert y == STRATEGIES[r["strategy"]](x)
        nll, m = bayes_nll(x, y, cfg.strategies, prior, cfg.prior_strength)
        assert (r["bayes_nll"], r["n_consistent"]) == (nll, m)


@pytest.mark.parametrize("prior", ["uniform", "x_dependent"])
def test_strategy_frequencies_follow_the_prior(prior):
    """Empirical frequency of each strategy within 4 standard errors of its mean prior mass."""
    cfg = DataConfig(**SMALL, prior=prior, prior_strength=4.0)
    rows = generate_split(cfg, "train", 3000)
    for i, s in enumerate(cfg.strategies):
        p = np.mean([strategy_prior(text_to_digits(r["x"]), cfg.strategies, prior, 4.0)[i] for r in rows])
        freq = np.mean([r["strategy"] == s for r in rows])
        assert abs(freq - p) <= 4 * math.sqrt(p * (1 - p) / len(rows)), (s, freq, p)


def test_generate_split_rejects_an_unknown_split():
    with pytest.raises(ValueError, match="split"):
        generate_split(DataConfig(**SMALL), "dev", 3)


# ----------------------------------------------------------------------------- files and metadata


def test_generator_is_deterministic_per_seed(tmp_path):
    a = write_benchmark(DataConfig(**SMALL, seed=3), tmp_path / "a")
    b = write_benchmark(DataConfig(**SMALL, seed=3), tmp_path / "b")
    c = write_benchmark(DataConfig(**SMALL, seed=4), tmp_path / "c")
    assert files(a) == files(b)
    for split in ("train", "val", "test"):
        assert sha256(a / f"{split}.jsonl") != sha256(c / f"{split}.jsonl")
    # splits are independent streams: more training rows do not change val
    d = write_benchmark(DataConfig(**{**SMALL, "n_train": 7}, seed=3), tmp_path / "d")
    assert (d / "val.jsonl").read_bytes() == (a / "val.jsonl").read_bytes()


def test_metadata_records_parameters_and_sha256_of_the_files(tmp_path):
    cfg = DataConfig(**SMALL, prior="x_dependent")
    out = write_benchmark(cfg, tmp_path / "bench")
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["kind"] == "zfree.synthetic_strategy_benchmark"
    assert DataConfig(**meta["parameters"]) == cfg
    assert set(meta["sha256"]) == {"train", "val", "test"}
    for split, n in (("train", cfg.n_train), ("val", cfg.n_val), ("test", cfg.n_test)):
        path = out / f"{split}.jsonl"
        assert meta["sha256"][split] == sha256(path)
        assert len(path.read_text().splitlines()) == n


def test_existing_folder_same_parameters_is_reused_untouched(tmp_path):
    out = write_benchmark(DataConfig(**SMALL), tmp_path / "bench")
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.iterdir()}
    assert write_benchmark(DataConfig(**SMALL), out) == out
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.iterdir()} == before


def test_existing_folder_other_parameters_raises_and_leaves_files_untouched(tmp_path):
    out = write_benchmark(DataConfig(**SMALL), tmp_path / "bench")
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.iterdir()}
    for other in (DataConfig(**SMALL, seed=1), DataConfig(**{**SMALL, "n_val": 41}), DataConfig(**SMALL, prior="x_dependent")):
        with pytest.raises(FileExistsError, match="other parameters"):
            write_benchmark(other, out)
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.iterdir()} == before


def test_modified_files_or_foreign_files_are_not_reused_or_overwritten(tmp_path):
    out = write_benchmark(DataConfig(**SMALL), tmp_path / "bench")
    with open(out / "val.jsonl", "a") as f:
        f.write('{"id": "extra", "x": "1", "y": "1", "strategy": "copy"}\n')
    with pytest.raises(FileExistsError, match="sha256"):
        write_benchmark(DataConfig(**SMALL), out)
    foreign = tmp_path / "user_data"
    foreign.mkdir()
    (foreign / "train.jsonl").write_text('{"x": "hello", "y": "world"}\n')
    with pytest.raises(FileExistsError, match="no metadata"):
        write_benchmark(DataConfig(**SMALL), foreign)
    assert (foreign / "train.jsonl").read_text() == '{"x": "hello", "y": "world"}\n'


@pytest.mark.skipif(not (SHIPPED / "metadata.json").exists(), reason="no shipped benchmark")
def test_shipped_benchmark_regenerates_byte_for_byte():
    """The generator still produces the shipped data (val and test; train is the same code path)."""
    meta = json.loads((SHIPPED / "metadata.json").read_text())
    cfg = DataConfig(**meta["parameters"])
    for split in ("val", "test"):
        rows = generate_split(cfg, split, getattr(cfg, f"n_{split}"))
        text = "".join(json.dumps(r) + "\n" for r in rows)
        assert hashlib.sha256(text.encode()).hexdigest() == meta["sha256"][split] == sha256(SHIPPED / f"{split}.jsonl")
