"""analysis/results/oracle-smollm2/collect.py (issue 55's preregistered oracle study) on a stand-in study folder:
the files such a study writes that the script reads (controls.json's links, each run's config.json, summary.json
and per_example.parquet, and available_gain.csv as ``zfree_lab.experiment.gains.oracle_table`` computes it),
fabricated with planted gains; the SmolLM2 study itself is not run. Its per-seed quantities are recomputed here
from the planted rows, its tests against scipy's t-test and Holm's rule, and its decision follows the
preregistered rule in each outcome (the deficit the oracle arm's; not items 1-2; a study short of a seed: pending)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from tests.test_shipped_results import MACHINE_PATH, shipped_bytes
from tests.scripts import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "analysis" / "results" / "oracle-smollm2" / "collect.py"
ROWS = 40
#: recipe -> (router_clip, latent_capacity, injection)
RECIPES = {"shipped": ("global", "per_value", "embedding"), "decoupled embedding": ("own", "shared_delta", "embedding"),
           "decoupled mid": ("own", "shared_delta", "mid"), "decoupled memory": ("own", "shared_delta", "memory")}
#: the preset's oracle arms: (recipe, label, n_values)
ORACLES = [("shipped", "complete", 2), ("decoupled embedding", "complete", 2),
           *[(f"decoupled {r}", lab, 3) for lab in ("n_sentences", "y_words") for r in ("embedding", "mid", "memory")]]


def _collect():
    return load_script(SCRIPT, "oracle_smollm2_collect")


def _write_run(runs: Path, run_id: str, cfg: dict, D: np.ndarray, flipped: np.ndarray | None = None) -> None:
    d = runs / run_id
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "summary.json").write_text(json.dumps({"steps": 100, "wall_s": 60.0,
                                                "init/loss/val/baseline_normalized_reconstruction_loss": 1.0}))
    n = np.full(len(D), 10)
    pd.DataFrame({"id": [f"r{i}" for i in range(len(D))], "n_tokens": n, "lbar": D / n, "kl": np.full(len(D), 0.4),
                  "b": D / n + 0.1, "beta_eff": 0.0, "d_prior": D, "d_shuffled": D if flipped is None else flipped,
                  "marginal_nll": D}).to_parquet(d / "per_example.parquet", index=False)


def make_study(root: Path, gains: dict, nulls: dict | None = None, seeds=(0, 1, 2), drop_null_of=None) -> dict:
    """A stand-in oracle-smollm2 study folder: per seed a control per recipe and, per oracle arm, the oracle
    (D_control − ``gains[(recipe, label)][seed]`` per row, plus row noise) and its null (D_control −
    ``nulls[...]``); the flipped evaluation 0.2 above the oracle. Returns the planted per-row D's
    {(recipe, label, seed): (control, oracle, null)}."""
    from zfree_lab.experiment.gains import oracle_table

    rng = np.random.default_rng(0)
    runs, links, planted = root / "runs", {"controls": {}, "oracles": {}, "nulls": {}, "texts": {}}, {}
    base = 30 + 5 * rng.random(ROWS)
    for seed in seeds:
        controls = {}
        for recipe, (clip, cap, route) in RECIPES.items():
            cid = f"control-{recipe.replace(' ', '-')}-s{seed}"
            controls[recipe] = (cid, base + seed + 0.1 * rng.standard_normal(ROWS))
            _write_run(runs, cid, {"seed": seed, "router_clip": clip, "latent_capacity": cap, "injection": route,
                                   "latent_source": "control", "n_latent": 1}, controls[recipe][1])
        for recipe, label, k in ORACLES:
            clip, cap, route = RECIPES[recipe]
            cid, dc = controls[recipe]
            oid, nid = f"oracle-{recipe.replace(' ', '-')}-{label}-s{seed}", f"null-{recipe.replace(' ', '-')}-{label}-s{seed}"
            do = dc - gains[(recipe, label)][seed] + 0.05 * rng.standard_normal(ROWS)
            dn = dc - (nulls or {}).get((recipe, label), [0.0] * 3)[seed] + 0.05 * rng.standard_normal(ROWS)
            cfg = {"seed": seed, "router_clip": clip, "latent_capacity": cap, "injection": route, "n_latent": k}
            _write_run(runs, oid, {**cfg, "latent_source": f"label:{label}"}, do, flipped=do + 0.2)
            links["oracles"][oid] = {"label": label, "n_values": k, "control": cid}
            if drop_null_of != (recipe, label, seed):
                _write_run(runs, nid, {**cfg, "latent_source": f"null:{label}"}, dn)
                links["nulls"][oid] = nid
            planted[(recipe, label, seed)] = (dc, do, dn)
    (root / "controls.json").write_text(json.dumps(links))
    oracle_table(root).to_csv(root / "available_gain.csv", index=False)
    return planted


def _gains(shipped, decoupled, v_nsent=0.5, v_ywords=0.0) -> dict:
    g = {("shipped", "complete"): shipped, ("decoupled embedding", "complete"): decoupled}
    for r in ("embedding", "mid", "memory"):
        g[(f"decoupled {r}", "n_sentences")] = [v_nsent + d for d in (0.02, -0.03, 0.01)]
        g[(f"decoupled {r}", "y_words")] = [v_ywords + d for d in (0.04, -0.05, 0.0)]
    return g


def _collected(tmp_path, **kw):
    m = _collect()
    study, out = tmp_path / "study", tmp_path / "shipped"
    out.mkdir(parents=True)
    planted = make_study(study, **kw)
    m.main(study, out)
    return m, m.headline(out), planted, out


def test_the_collect_script_computes_the_preregistered_tests_and_decides_for_the_oracle_arm(tmp_path):
    shipped, decoupled = [-1.0, -1.08, -0.95], [0.30, 0.22, 0.35]
    m, h, planted, out = _collected(tmp_path, gains=_gains(shipped, decoupled))
    # the shipped tables: every oracle run, its per-row table, every run with its step-0 check; no machine path
    oracles, rows, runs = pd.read_csv(out / "oracles.csv"), pd.read_parquet(out / "oracle_rows.parquet"), \
        pd.read_csv(out / "runs.csv")
    assert len(oracles) == 24 and len(rows) == 24 * ROWS and set(oracles["arm"]) == {"shipped", "decoupled"}
    assert len(runs) == 24 * 2 + 4 * 3 and set(runs["role"]) == {"oracle", "control", "null_oracle"}
    for f in out.iterdir():
        assert not MACHINE_PATH.search(shipped_bytes(f)), f
    # the per-row table is what the study's available_gain.csv averaged (the preregistration's source)
    for o in oracles.itertuples():
        r = rows[rows["oracle_run_id"] == o.oracle_run_id]
        assert (r["D_control"] - r["D_oracle"]).mean() == pytest.approx(o.delta_R)
        assert (r["D_null"] - r["D_oracle"]).mean() == pytest.approx(o.label_value)
        assert (r["D_flipped"] - r["D_oracle"]).mean() == pytest.approx(o.flipped)
    # per seed: the row means of the planted D's
    a = h["arms"].set_index(["arm", "label", "route"])
    for (recipe, label, seed), (dc, do, dn) in planted.items():
        arm, route = ("shipped", "embedding") if recipe == "shipped" else ("decoupled", recipe.split()[1])
        r = rows[(rows["arm"] == arm) & (rows["label"] == label) & (rows["route"] == route) & (rows["seed"] == seed)]
        assert r["D_oracle"].to_numpy() == pytest.approx(do) and r["D_null"].to_numpy() == pytest.approx(dn)
        assert (r["D_flipped"] - r["D_oracle"]).mean() == pytest.approx(0.2)
    dR = {s: float(np.mean(planted[("decoupled embedding", "complete", s)][0] - planted[("decoupled embedding", "complete", s)][1]))
          for s in (0, 1, 2)}
    dS = {s: float(np.mean(planted[("shipped", "complete", s)][0] - planted[("shipped", "complete", s)][1])) for s in (0, 1, 2)}
    assert a.loc[("decoupled", "complete", "embedding"), "delta_R"] == pytest.approx(np.mean(list(dR.values())))
    assert a.loc[("decoupled", "complete", "embedding"), "flipped"] == pytest.approx(0.2)
    assert (a["n_seeds"] == 3).all()
    # H1 and H2: one-sided t over the 3 seeds, Holm across the two
    C = [dR[s] - dS[s] for s in (0, 1, 2)]
    assert h["h1"]["per_seed"] == pytest.approx(dict(enumerate(C)))
    p1 = stats.ttest_1samp(C, 0, alternative="greater").pvalue
    p2 = stats.ttest_1samp(list(dR.values()), 0, alternative="greater").pvalue
    assert (h["h1"]["p"], h["h2"]["p"]) == pytest.approx((p1, p2))
    lo, hi = sorted((p1, p2))
    holm = {lo: 2 * lo, hi: max(2 * lo, hi)}
    assert (h["h1"]["p_holm"], h["h2"]["p_holm"]) == pytest.approx((min(1, holm[p1]), min(1, holm[p2])))
    assert h["h1"]["supported"] and h["h2"]["supported"] and h["criterion"]["not_below"]
    # H3: the 7 decoupled nulls planted at 0 are shown null (TOST ±0.25); the routes: n_sentences' V > 0 on
    # each route (Holm within six), y_words' (planted 0) not
    assert len(h["h3"]["decoupled"]) == 7 and h["h3"]["decoupled"]["equivalent"].all()
    r = h["routes"].set_index(["label", "route"])
    assert r.loc["n_sentences", "supported"].all() and not r.loc["y_words", "supported"].any()
    assert len(h["route_differences"]) == 6 and h["checks"]["rho0_ok"] and h["checks"]["n_runs"] == 24 * 2 + 12
    b = h["checks"]["bootstrap"]["C"]
    assert b[0] < np.mean(C) < b[1]
    assert h["complete"] and h["decision"] == "oracle arm"
    text = "\n".join(m.markdown(h))
    assert "H1: C = ΔR(complete, decoupled) − ΔR(complete, shipped)" in text and ": supported" in text
    assert text.splitlines()[-1] == f"decision: {m.DECISIONS['oracle arm']}"


def test_the_decision_is_not_items_1_2_when_decoupling_leaves_the_deficit(tmp_path):
    shipped = [-1.0, -1.08, -0.95]
    m, h, _, _ = _collected(tmp_path, gains=_gains(shipped, [s + 0.01 for s in shipped]),
                            nulls={("decoupled embedding", "complete"): [-0.9, -1.0, -0.95]})
    assert not h["h1"]["supported"] and not h["criterion"]["not_below"]
    nulls = h["h3"]["decoupled"].set_index(["label", "route"])
    assert not nulls.loc[("complete", "embedding"), "equivalent"]  # the null is not null: K vectors cost
    assert h["decision"] == "not items 1-2"


def test_a_study_short_of_a_null_or_a_seed_is_pending(tmp_path):
    g = _gains([-1.0, -1.08, -0.95], [0.30, 0.22, 0.35])
    _, h, _, _ = _collected(tmp_path / "a", gains=g, drop_null_of=("decoupled mid", "y_words", 2))
    assert not h["complete"] and h["decision"] == "pending"
    _, h, _, _ = _collected(tmp_path / "b", gains=g, seeds=(0, 1))
    assert not h["complete"] and h["decision"] == "pending" and h["h1"]["n"] == 2


def test_a_running_study_without_its_available_gain_table_collects_the_same_tables(tmp_path):
    """While the study runs it has no available_gain.csv yet: the script computes the same table from the runs
    finished so far (``oracle_table``), so its outputs equal those of the finished folder; a folder where no
    oracle has finished beside its control, or that is no oracle study, exits with one line."""
    m = _collect()
    study = tmp_path / "study"
    make_study(study, gains=_gains([-1.0, -1.1, -0.9], [0.1, 0.2, 0.15]))
    finished, running = tmp_path / "finished", tmp_path / "running"
    finished.mkdir(), running.mkdir()
    m.main(study, finished)
    (study / "available_gain.csv").unlink()
    m.main(study, running)
    for name in ("oracles.csv", "runs.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(running / name), pd.read_csv(finished / name))
    pd.testing.assert_frame_equal(pd.read_parquet(running / "oracle_rows.parquet"),
                                  pd.read_parquet(finished / "oracle_rows.parquet"))
    for run in (study / "runs").glob("control-*"):
        (run / "per_example.parquet").unlink()
    with pytest.raises(SystemExit, match="no oracle of .* has finished beside its control yet"):
        m.main(study, running)
    with pytest.raises(SystemExit, match="is not an oracle-smollm2 study folder"):
        m.main(tmp_path / "finished", running)


SHIPPED = SCRIPT.parent


def test_the_shipped_result_is_recomputed_from_the_shipped_tables():
    """Once the study's tables are shipped: every table and test line of its README is what ``headline`` computes
    from oracles.csv, oracle_rows.parquet and runs.csv (no number typed by hand), the decision is not pending, and
    no shipped file names a machine path."""
    if not (SHIPPED / "oracles.csv").exists():
        pytest.skip("the study's tables are not shipped yet (PREREGISTRATION.md: it resumes across sessions)")
    m = _collect()
    h = m.headline(SHIPPED)
    assert h["complete"] and h["decision"] != "pending" and h["n_oracle_runs"] == 24
    readme = (SHIPPED / "README.md").read_text(encoding="utf-8")
    missing = [line for line in m.markdown(h) if line not in readme]
    assert not missing, missing
    for name in ("oracles.csv", "oracle_rows.parquet", "runs.csv", "README.md"):
        assert not MACHINE_PATH.search(shipped_bytes(SHIPPED / name)), name


def test_the_project_readme_and_docs_state_the_result_as_recomputed():
    if not (SHIPPED / "oracles.csv").exists():
        pytest.skip("the study's tables are not shipped yet")
    m = _collect()
    h = m.headline(SHIPPED)
    root = SHIPPED.parents[2]
    arms = h["arms"].set_index(["arm", "label", "route"])

    def ci(row, q):
        return m._ci(row[q], row[f"{q}_lo"], row[f"{q}_hi"])

    dec, ship = arms.loc[("decoupled", "complete", "embedding")], arms.loc[("shipped", "complete", "embedding")]
    memory = h["routes"].set_index(["label", "route"]).loc[("n_sentences", "memory")]
    stated = [f"ΔR = {m._num(ship['delta_R'], 3)} to {ci(dec, 'delta_R')}",
              f"C = {m._ci(h['h1']['mean'], h['h1']['lo'], h['h1']['hi'])}, Holm p = {m._num(h['h1']['p_holm'], 3)}",
              f"lost nearly as much, {ci(ship, 'delta_R_null')}",
              f"{m._ci(memory['mean'], memory['lo'], memory['hi'])} nats/example against its null",
              "{} through the input embedding, {} at mid-depth".format(
                  *(m._num(h["routes"].set_index(["label", "route"]).loc[("n_sentences", r), "mean"], 3)
                    for r in ("embedding", "mid")))]
    assert h["decision"] == "oracle arm"
    readme = " ".join((root / "README.md").read_text(encoding="utf-8").split())
    missing = [x for x in stated if x not in readme]
    assert not missing, f"README.md does not state the recomputed: {missing}"
    docs = " ".join((root / "docs" / "results" / "oracles-and-routes.md").read_text(encoding="utf-8").split())
    for x in (f"ΔR = {ci(dec, 'delta_R')} nats/example), up {m._ci(h['h1']['mean'], h['h1']['lo'], h['h1']['hi'])}",
              f"shipped arm's {m._num(ship['delta_R'], 3)}, whose null oracle lost nearly as much ({ci(ship, 'delta_R_null')})"):
        assert x in docs, x
