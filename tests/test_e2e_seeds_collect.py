"""The preregistered e2e-smollm2 3-seed study's decision rules (analysis/results/e2e-smollm2-seeds/collect.py):
its t-tests and TOST against scipy's one-sample t-test, each rule's verdict on constructed seeds, and, once the
study's tables are shipped, its decisions recomputed from them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from tests.scripts import load_script
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "analysis" / "results" / "e2e-smollm2-seeds"


def _collect():
    return load_script(FOLDER / "collect.py", "e2e_seeds_collect")


def _shipped_decisions(c):
    """``decide`` on the shipped per-row tables and runs.csv (the study's published inputs)."""
    return c.decide(pd.read_parquet(FOLDER / "seed_rows.parquet"), pd.read_parquet(FOLDER / "oracle_rows.parquet"),
                    pd.read_csv(FOLDER / "runs.csv"))


def _tables(gain, net, use, codes=(4, 4, 4), rows=40, seed=0):
    """Per-row tables whose per-seed means are exactly ``gain``/``net``/``use`` (row noise of mean 0)."""
    rng = np.random.default_rng(seed)
    parts, runs = [], []
    for s, (g, n, u) in enumerate(zip(gain, net, use)):
        noise = rng.normal(size=(3, rows))
        noise -= noise.mean(axis=1, keepdims=True)
        parts.append(pd.DataFrame({"id": np.arange(rows), "seed": s, "run_id": f"run{s}",
                                   "z_gain": g + noise[0], "net_gain": n + noise[1], "use_shuffled": u + noise[2],
                                   "gain_minus_rate": g - 1.0 + noise[0]}))
        runs.append({"run_id": f"run{s}", "seed": s, "codes_used": codes[s]})
    return pd.concat(parts, ignore_index=True), pd.DataFrame(runs)


def test_the_one_sided_t_test_and_tost_are_scipys():
    c = _collect()
    per_seed = [0.77, 0.95, 0.61]
    got = c.one_sided(per_seed)
    ref = stats.ttest_1samp(per_seed, 0.0, alternative="greater")
    np.testing.assert_allclose(got["p"], ref.pvalue, rtol=1e-12)
    ci = stats.ttest_1samp(per_seed, 0.0).confidence_interval(0.95)
    np.testing.assert_allclose([got["lo"], got["hi"]], [ci.low, ci.high], rtol=1e-12)
    net = [0.11, -0.05, 0.02]
    lower = stats.ttest_1samp(net, -0.25, alternative="greater").pvalue
    upper = stats.ttest_1samp(net, 0.25, alternative="less").pvalue
    np.testing.assert_allclose(c.tost(net), max(lower, upper), rtol=1e-12)


def test_each_rule_gives_its_preregistered_verdict():
    c = _collect()
    rows, runs = _tables(gain=[0.77, 0.95, 0.61], net=[0.11, -0.05, 0.02], use=[1.3, 1.1, 1.5])
    d = c.decide(rows, pd.DataFrame(), runs)
    assert d["finished"] and d["seeds"] == [0, 1, 2]
    assert d["H_gain"]["decision"] == "lowers D against its control"
    np.testing.assert_allclose(d["H_gain"]["per_seed"], [0.77, 0.95, 0.61], atol=1e-9)
    assert d["H_net"]["decision"] == "as good as its control within +/-0.25"
    assert d["H_use"]["decision"] == "z switched on inside the model"
    # the two-stage bootstrap check: seeds drawn, then rows; it holds the seeds' mean and lies inside the
    # range a resample of the seeds' row means can reach
    for h, col in (("H_gain", "z_gain"), ("H_net", "net_gain"), ("H_use", "use_shuffled")):
        lo, hi = d[h]["two_stage_95"]
        means = rows.groupby("seed")[col].mean()
        assert lo < means.mean() < hi
        assert means.min() - 0.5 < lo and hi < means.max() + 0.5
    # a seed with one code fails the per-seed floor, whatever the t-test says
    rows, runs = _tables(gain=[0.77, 0.95, 0.61], net=[0.11, -0.05, 0.02], use=[1.3, 1.1, 1.5], codes=(4, 1, 4))
    assert c.decide(rows, pd.DataFrame(), runs)["H_use"]["decision"] == "not shown at 3 seeds"
    # a net gain spread wider than the margin: neither better nor equivalent
    rows, runs = _tables(gain=[0.2, -0.1, 0.05], net=[0.6, -0.5, 0.1], use=[0.0, 0.02, -0.01])
    d = c.decide(rows, pd.DataFrame(), runs)
    assert d["H_net"]["decision"] == "undecided at 3 seeds"
    assert d["H_gain"]["decision"] == "not shown at 3 seeds"
    assert d["H_use"]["decision"] == "not shown at 3 seeds"
    # fewer than three seeds: every decision is "not finished", the interval is absent
    rows, runs = _tables(gain=[0.77, 0.95, 0.61], net=[0.1, 0.1, 0.1], use=[1, 1, 1])
    d = c.decide(rows[rows["seed"] < 2], pd.DataFrame(), runs)
    assert not d["finished"] and {d[h]["decision"] for h in ("H_gain", "H_net", "H_use")} == {"not finished"}
    one = c.decide(rows[rows["seed"] == 0], pd.DataFrame(), runs)
    assert all(np.isnan(one[h]["two_stage_95"]).all() for h in ("H_gain", "H_net", "H_use"))


def test_the_shipped_decisions_are_recomputed_from_the_shipped_rows():
    if not (FOLDER / "decisions.json").exists():
        pytest.skip("the study's tables are not shipped yet (PREREGISTRATION.md: it resumes across sessions)")
    c = _collect()
    d = _shipped_decisions(c)
    assert c._nan_to_null(d) == json.loads((FOLDER / "decisions.json").read_text(encoding="utf-8"))
    readme = (FOLDER / "README.md").read_text(encoding="utf-8")
    for line in c.markdown(json.loads(json.dumps(c._nan_to_null(d)))).splitlines():  # the README's table, as computed
        assert line in readme, line


def test_the_readme_table_shows_each_decision_with_its_seeds_and_both_intervals():
    c = _collect()
    rows, runs = _tables(gain=[0.77, 0.95, 0.61], net=[0.11, -0.05, 0.02], use=[1.3, 1.1, 1.5])
    d = json.loads(json.dumps(c._nan_to_null(c.decide(rows, pd.DataFrame(), runs))))
    table = c.markdown(d).splitlines()
    assert len(table) == 2 + 3  # header, rule, the three hypotheses (no oracle rows given)
    gain = next(line for line in table if line.startswith("| z gain"))
    cells = [x.strip() for x in gain.strip("|").split("|")]
    assert cells[1] == "0.770, 0.950, 0.610" and cells[2] == f"{np.mean([0.77, 0.95, 0.61]):.3f}"
    assert cells[3] == f"[{d['H_gain']['lo']:.3f}, {d['H_gain']['hi']:.3f}]"
    assert cells[5] == "[{:.3f}, {:.3f}]".format(*d["H_gain"]["two_stage_95"])
    assert cells[6] == "lowers D against its control"
    # below 2 seeds the intervals are absent, said as n/a
    one = json.loads(json.dumps(c._nan_to_null(c.decide(rows[rows["seed"] == 0], pd.DataFrame(), runs))))
    assert "[n/a, n/a]" in c.markdown(one)


def test_the_project_readme_states_the_3_seed_result_as_recomputed():
    if not (FOLDER / "decisions.json").exists():
        pytest.skip("the study's tables are not shipped yet")
    c = _collect()
    d = _shipped_decisions(c)
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())  # line breaks as spaces

    def ci(q):
        return "{:.3f} [{}, {}]".format(q["mean"], *(f"{v:.3f}".replace("-", "−") for v in (q["lo"], q["hi"])))

    oracle = d["oracle"]["delta_R"]
    stated = [f"by {ci(d['H_gain'])} nats/example (p = {d['H_gain']['p']:.3f})",
              f"below the control's by {ci(d['H_net'])} (p = {d['H_net']['p']:.3f}: \"better than its control\"",
              f"costs {ci(d['H_use'])} nats/example (p = {d['H_use']['p']:.3f})",
              f"ends {-oracle['mean']:.3f} [{-oracle['hi']:.3f}, {-oracle['lo']:.3f}] nats/example *worse*",
              "3 seeds under a preregistration"]
    assert d["H_net"]["decision"] == "better than its control"
    missing = [x for x in stated if x not in readme]
    assert not missing, f"README.md does not state the recomputed: {missing}"
