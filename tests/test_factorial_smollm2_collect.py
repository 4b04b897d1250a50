"""analysis/results/factorial-smollm2/collect.py (issue 58's preregistered weighting × aid study) on a stand-in study
folder: only the files the script reads (controls.json's links, notes.json's predicted boundaries and setting, each
run's config.json, summary.json and per_example.parquet), fabricated with planted per-seed U, G and N; the SmolLM2
study itself is not run. Its per-seed quantities are recomputed here from the planted rows, its tests against scipy's
one-sample t-test, a TOST of two scipy one-sided tests and Holm's rule written out, and its decision follows the
preregistered rule in each outcome (H1 supported; H1 not supported; a partial study: pending)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from tests.test_shipped_results import MACHINE_PATH, shipped_bytes
from tests.scripts import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "analysis" / "results" / "factorial-smollm2" / "collect.py"
ROWS = 40
BETA_STAR = {"plain": 0.02, "distribution": 0.006, "example": 0.01}
#: the preset's arms: (weighting, aid, β factor)
ARMS = [(w, a, "1/3") for w in ("plain", "distribution", "example") for a in ("none", "hard_em")] + \
       [("distribution", "hard_em", "3")]


def _collect():
    return load_script(SCRIPT, "factorial_smollm2_collect")


def _write_run(runs: Path, rid: str, cfg: dict, D, d_shuffled=None, marginal=None, kl=0.0, summary=None) -> None:
    d = runs / rid
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "summary.json").write_text(json.dumps(summary or {"steps": 300}))
    n = np.full(len(D), 20)
    pd.DataFrame({"id": [f"r{i}" for i in range(len(D))], "n_tokens": n, "lbar": D / n, "kl": np.full(len(D), kl),
                  "b": D / n + 0.1, "beta_eff": 0.01, "d_prior": D,
                  "d_shuffled": D if d_shuffled is None else d_shuffled,
                  "marginal_nll": D if marginal is None else marginal}).to_parquet(d / "per_example.parquet", index=False)


def make_study(root: Path, U: dict, G: dict, N: dict, seeds=(0, 1, 2), drop=()) -> dict:
    """A stand-in factorial-smollm2 study: per seed a control per weighting, per arm a run with D_q = D_control −
    G + noise, D_shuffled = D_q + U + noise and marginal NLL = D_control − N + noise (arm -> per-seed lists), and the
    n_sentences oracle (ΔR 0.6 + seed/10) with its null (ΔR_null 0) against plain's control. Runs named in ``drop``
    are linked but never finished. Returns the planted per-row arrays {(arm, seed): dict} and {seed: oracle dict}."""
    rng = np.random.default_rng(1)
    runs, links, planted, oracle = root / "runs", {"controls": {}, "oracles": {}, "nulls": {}, "texts": {}}, {}, {}
    base = 60 + 10 * rng.random(ROWS)
    root.mkdir(parents=True)
    bounds = [{"weighting": w, "beta_star": b, "betas": [float(f"{b / 3:.4g}")]} for w, b in BETA_STAR.items()]
    (root / "notes.json").write_text(json.dumps({"setting": "entangled_run", "predicted_boundaries": bounds,
                                                 "base_dir": str(root / "base"), "notes": ["fabricated"]}))
    for seed in seeds:
        dc = {}
        for w in BETA_STAR:
            cid, dc[w] = f"control_{w}_s{seed}", base + seed + 0.1 * rng.standard_normal(ROWS)
            if cid not in drop:
                _write_run(runs, cid, {"seed": seed, "weighting": w, "latent_source": "control",
                                       "data_dir": str(root / "data")}, dc[w])
        for arm in ARMS:
            w, aid, f = arm
            beta = float(f"{(1 / 3 if f == '1/3' else 3.0) * BETA_STAR[w]:.4g}")
            rid = f"{w}_beta{beta:g}{'_hard_em_then_soft' if aid == 'hard_em' else ''}_s{seed}"
            dq = dc[w] - G[arm][seed] + 0.05 * rng.standard_normal(ROWS)
            dsh = dq + U[arm][seed] + 0.05 * rng.standard_normal(ROWS)
            marg = dc[w] - N[arm][seed] + 0.05 * rng.standard_normal(ROWS)
            links["controls"][rid] = f"control_{w}_s{seed}"
            planted[(arm, seed)] = {"Dc": dc[w], "Dq": dq, "Dsh": dsh, "marg": marg}
            if rid not in drop:
                _write_run(runs, rid, {"seed": seed, "weighting": w, "beta": beta,
                                       "aid": "hard_em_then_soft" if aid == "hard_em" else "none"}, dq, dsh, marg,
                           kl=0.3 + seed / 100, summary={"latent/mutual_information": 0.5 + seed / 10,
                                                         "latent/codes_used": 4, "latent/predicted_use_fraction": 0.9})
        oid, nid = f"oracle-n_sentences_plain_s{seed}", f"null-n_sentences_plain_s{seed}"
        do, dn = dc["plain"] - 0.6 - seed / 10 + 0.05 * rng.standard_normal(ROWS), dc["plain"] + 0.05 * rng.standard_normal(ROWS)
        links["oracles"][oid] = {"label": "n_sentences", "n_values": 3, "control": f"control_plain_s{seed}"}
        links["nulls"][oid] = nid
        for rid, d, src in ((oid, do, "label:n_sentences"), (nid, dn, "null:n_sentences")):
            if rid not in drop:
                _write_run(runs, rid, {"seed": seed, "weighting": "plain", "latent_source": src}, d)
        oracle[seed] = {"Dc": dc["plain"], "Do": do, "Dn": dn}
    (root / "controls.json").write_text(json.dumps(links))
    return planted, oracle


def _values(h1_dist, h1_ex, g_aided, n_aided=(0.05, -0.03, 0.02), seeds=3) -> tuple[dict, dict, dict]:
    """Per arm the planted per-seed U, G, N: plain unaided U near 0; U(W, none) = it + ``h1_*``; the aided arms'
    G = ``g_aided`` and N = ``n_aided``; the 3 β* arm at 0."""
    plain_u = [0.01, 0.02, 0.015, 0.0, 0.01, 0.02][:seeds]
    zero = [0.0] * seeds
    U = {a: zero for a in ARMS}
    U[("plain", "none", "1/3")] = plain_u
    U[("distribution", "none", "1/3")] = [p + d for p, d in zip(plain_u, h1_dist)]
    U[("example", "none", "1/3")] = [p + d for p, d in zip(plain_u, h1_ex)]
    G = {a: (list(g_aided) if a[1] == "hard_em" and a[2] == "1/3" else zero) for a in ARMS}
    N = {a: (list(n_aided) if a[1] == "hard_em" else zero) for a in ARMS}
    return U, G, N


def _collected(tmp_path, U, G, N, **kw):
    m = _collect()
    study, out = tmp_path / "study", tmp_path / "out"
    planted = make_study(study, U, G, N, **kw)
    return m, m.main(study, out), planted, out


def _holm(p: list[float]) -> list[float]:
    """Holm (1979) written out: the i-th smallest of m times (m − i), running maximum, capped at 1."""
    order = np.argsort(p)
    adj, running = [0.0] * len(p), 0.0
    for i, j in enumerate(order):
        running = max(running, min(1.0, (len(p) - i) * p[j]))
        adj[j] = running
    return adj


def _per_seed(planted, arm, q, seeds=(0, 1, 2)) -> np.ndarray:
    f = {"U": lambda r: r["Dsh"] - r["Dq"], "G": lambda r: r["Dc"] - r["Dq"], "N": lambda r: r["Dc"] - r["marg"]}[q]
    return np.array([f(planted[(arm, s)]).mean() for s in seeds])


def _check_t(test: dict, values: np.ndarray) -> None:
    ref = stats.ttest_1samp(values, 0.0, alternative="greater")
    ci = stats.ttest_1samp(values, 0.0).confidence_interval(0.95)
    assert list(test["per_seed"].values()) == pytest.approx(list(values), abs=1e-9)
    assert (test["mean"], test["lo"], test["hi"], test["p"]) == pytest.approx(
        (values.mean(), ci.low, ci.high, ref.pvalue), rel=1e-9)


def test_h1_supported_the_weightings_keep_z_on(tmp_path):
    U, G, N = _values(h1_dist=[0.5, 0.6, 0.45], h1_ex=[0.3, 0.42, 0.35], g_aided=[0.8, 0.9, 0.7])
    m, d, (planted, oracle), out = _collected(tmp_path, U, G, N)
    # the written tables: every arm × seed, every evaluated row, strict JSON, no machine path
    rows, arm_seeds = pd.read_parquet(out / "rows.parquet"), pd.read_csv(out / "arm_seeds.csv")
    assert len(rows) == 7 * 3 * ROWS and len(arm_seeds) == 21
    assert set(map(tuple, arm_seeds[["weighting", "aid", "beta_factor"]].astype(str).to_numpy())) == set(ARMS)
    assert json.loads((out / "decisions.json").read_text()) == json.loads(json.dumps(m._jsonable(d)))
    for f in out.iterdir():
        assert not MACHINE_PATH.search(shipped_bytes(f)), f
    # per arm × seed: the planted rows' means, the rate and the run's own metrics
    a = arm_seeds.set_index(["weighting", "aid", "beta_factor", "seed"])
    for arm in ARMS:
        for q in ("U", "G", "N"):
            assert a.loc[arm, q].to_numpy() == pytest.approx(_per_seed(planted, arm, q), abs=1e-9)
        assert a.loc[arm, "rate"].to_numpy() == pytest.approx([0.30, 0.31, 0.32])
        assert a.loc[arm, "mutual_information"].to_numpy() == pytest.approx([0.5, 0.6, 0.7])
    # H1 and H2: one-sided t over seeds, Holm across the five
    d0 = d["analyses"]["0-2"]
    t = d0["tests"]
    plain = _per_seed(planted, ("plain", "none", "1/3"), "U")
    want = {f"H1-{w}": _per_seed(planted, (w, "none", "1/3"), "U") - plain for w in ("distribution", "example")}
    want.update({f"H2-{w}": _per_seed(planted, (w, "hard_em", "1/3"), "G") for w in ("plain", "distribution", "example")})
    assert list(t) == list(want)
    for name, v in want.items():
        _check_t(t[name], v)
    ps = [stats.ttest_1samp(v, 0.0, alternative="greater").pvalue for v in want.values()]
    assert [t[n]["p_holm"] for n in want] == pytest.approx(_holm(ps), rel=1e-9)
    assert all(t[n]["status"] == "supported" for n in want) and d0["complete"] and not d0["missing"]
    # H3: N planted within ±0.25 of 0 for the four aided arms: TOST as two scipy one-sided tests
    assert len(d0["h3"]) == 4
    for name, h in d0["h3"].items():
        w, aid, f = name.split()
        n = _per_seed(planted, (w, aid, f), "N")
        tost = max(stats.ttest_1samp(n, -0.25, alternative="greater").pvalue,
                   stats.ttest_1samp(n, 0.25, alternative="less").pvalue)
        assert h["tost_p"] == pytest.approx(tost, rel=1e-9) and h["status"] == "within ±0.25 of 0"
    # the oracle (read): ΔR = D_control − D_oracle per seed, its null at 0
    o = d0["oracle"]["n_sentences"]
    _check_t(o["delta_R"], np.array([(oracle[s]["Dc"] - oracle[s]["Do"]).mean() for s in (0, 1, 2)]))
    _check_t(o["delta_R_null"], np.array([(oracle[s]["Dc"] - oracle[s]["Dn"]).mean() for s in (0, 1, 2)]))
    # the bootstrap beside each interval holds the mean; the mixed model fitted or said skipped
    for name in want:
        lo, hi = t[name]["two_stage_95"]
        assert lo < t[name]["mean"] < hi
    try:
        import statsmodels  # noqa: F401
        assert d0["mixed_model"]["status"] == "fitted"
    except ImportError:
        assert d0["mixed_model"]["status"].startswith("skipped: statsmodels is not installed")
    assert d0["decision"] == "weightings" and list(d["analyses"]) == ["0-2"]
    text = (out / "table.md").read_text()
    assert "PARTIAL" not in text and "**decision: weightings**" in text and text.count("\n| ") == 8


@pytest.mark.parametrize("g_aided, decision", [([0.8, 0.9, 0.7], "aid"), ([0.02, -0.03, 0.01], "nothing")])
def test_h1_not_supported_the_aid_or_nothing(tmp_path, g_aided, decision):
    U, G, N = _values(h1_dist=[0.05, -0.06, 0.01], h1_ex=[-0.02, 0.03, -0.01], g_aided=g_aided)
    _, d, (planted, _), _ = _collected(tmp_path, U, G, N)
    t = d["analyses"]["0-2"]["tests"]
    plain = _per_seed(planted, ("plain", "none", "1/3"), "U")
    for w in ("distribution", "example"):
        _check_t(t[f"H1-{w}"], _per_seed(planted, (w, "none", "1/3"), "U") - plain)
        assert t[f"H1-{w}"]["status"] == "not supported"
    h2 = {t[f"H2-{w}"]["status"] for w in ("plain", "distribution", "example")}
    assert h2 == ({"supported"} if decision == "aid" else {"not supported"})
    assert d["analyses"]["0-2"]["decision"] == decision


def test_a_partial_study_is_pending_and_says_what_is_missing(tmp_path):
    U, G, N = _values(h1_dist=[0.5, 0.6, 0.45], h1_ex=[0.3, 0.42, 0.35], g_aided=[0.8, 0.9, 0.7])
    beta_ex = float(f"{BETA_STAR['example'] / 3:.4g}")
    drop = {f"example_beta{beta_ex:g}_s2", "control_distribution_s1", "null-n_sentences_plain_s0"}
    _, d, (planted, _), out = _collected(tmp_path, U, G, N, drop=drop)
    d0 = d["analyses"]["0-2"]
    t = d0["tests"]
    assert t["H1-example"]["missing_seeds"] == [2] and t["H1-distribution"]["missing_seeds"] == [1]
    assert t["H2-distribution"]["missing_seeds"] == [1] and t["H2-plain"]["missing_seeds"] == []
    assert all(t[n]["status"] == "pending" for n in ("H1-example", "H1-distribution", "H2-distribution"))
    assert t["H2-plain"]["status"] == "supported"  # Holm over the five, one test with its 3 seeds
    plain = _per_seed(planted, ("plain", "none", "1/3"), "U", (0, 1))
    _check_t(t["H1-example"], _per_seed(planted, ("example", "none", "1/3"), "U", (0, 1)) - plain)
    assert not d0["complete"] and d0["decision"] == "pending"
    assert "example none 1/3 seed 2" in d0["missing"] and "distribution hard_em 3 seed 1" in d0["missing"]
    assert "null oracle n_sentences seed 0" in d0["missing"]
    assert d0["oracle"]["n_sentences"]["delta_R_null"]["n"] == 2
    assert (out / "table.md").read_text().splitlines()[4].startswith("**PARTIAL STUDY: decision pending.**")
    assert len(pd.read_csv(out / "arm_seeds.csv")) == 21 - 1 - 3


def test_a_fourth_seed_adds_the_six_seed_analysis_pending_beside_the_three(tmp_path):
    U, G, N = _values(h1_dist=[0.5, 0.6, 0.45, 0.5], h1_ex=[0.3, 0.42, 0.35, 0.3], g_aided=[0.8, 0.9, 0.7, 0.8],
                      n_aided=[0.05, -0.03, 0.02, 0.0], seeds=4)
    _, d, _, _ = _collected(tmp_path, U, G, N, seeds=(0, 1, 2, 3))
    assert d["analyses"]["0-2"]["decision"] == "weightings" and d["analyses"]["0-2"]["tests"]["H1-example"]["n"] == 3
    six = d["analyses"]["0-5"]
    assert six["decision"] == "pending" and six["tests"]["H1-example"]["missing_seeds"] == [4, 5]


def test_runs_computed_against_another_base_are_refused_by_name(tmp_path):
    """A base fine-tuned again on a replaced machine that does not reproduce the first one: the runs record two
    ``reference/c_base`` values and collect.py names them instead of mixing them in one table."""
    U, G, N = _values(h1_dist=[0.5, 0.6, 0.45], h1_ex=[0.3, 0.42, 0.35], g_aided=[0.8, 0.9, 0.7])
    m, study = _collect(), tmp_path / "study"
    make_study(study, U, G, N)
    runs = sorted((study / "runs").iterdir())
    for i, d in enumerate(runs):
        s = json.loads((d / "summary.json").read_text())
        s["reference/c_base"] = 1.1850070234762358 if i else 1.1850070234762358 * (1 + 1e-6)
        (d / "summary.json").write_text(json.dumps(s))
    with pytest.raises(ValueError, match=rf"2 different z-free bases .*1\.1850082.*: {runs[0].name}$"):
        m.main(study, tmp_path / "out")
    s = json.loads((runs[0] / "summary.json").read_text())
    s["reference/c_base"] = 1.1850070234762358 * (1 + 1e-12)  # the same base's float noise
    (runs[0] / "summary.json").write_text(json.dumps(s))
    assert m.check_one_base(study / "runs", [d.name for d in runs]) == pytest.approx(1.1850070234762358, rel=1e-9)
    assert m.main(study, tmp_path / "out")["analyses"]["0-2"]["decision"] == "weightings"
