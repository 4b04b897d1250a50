"""zfree_lab.report.report on hand-made rows: the per-run verdict, the tables that fit a page, the runs at the
nearest beta, and ``show`` handing a PNG to IPython whatever the backend."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from zfree_lab.report import report as R  # noqa: E402


def _summary() -> pd.DataFrame:
    return pd.DataFrame([
        # predicted use, used: agree
        {"run_id": "a", "weighting": "distribution", "beta": 0.1, "aid": "hard_em_then_soft",
         "predicted_use_fraction": 0.98, "measured_use_fraction": 0.91, "kl_prior_loss": 1.31234},
        # predicted use, collapsed: disagree (the seeds' failure mode)
        {"run_id": "b", "weighting": "distribution", "beta": 0.3, "aid": "none",
         "predicted_use_fraction": 0.97, "measured_use_fraction": 0.0, "kl_prior_loss": 1e-5},
        # predicted no use, unused: agree (plain at beta = 1 with the aid)
        {"run_id": "c", "weighting": "plain", "beta": 1.0, "aid": "hard_em_then_soft",
         "predicted_use_fraction": 0.0, "measured_use_fraction": 0.02, "kl_prior_loss": 0.01},
        # predicted no use, used: disagree (an aid that forces z on)
        {"run_id": "d", "weighting": "plain", "beta": 1.0, "aid": "random_init_jsd",
         "predicted_use_fraction": 0.1, "measured_use_fraction": 0.8, "kl_prior_loss": 1.0},
        # no measurement
        {"run_id": "e", "weighting": "token", "beta": 0.3, "aid": "none",
         "predicted_use_fraction": 0.6, "measured_use_fraction": np.nan, "kl_prior_loss": np.nan},
    ])


def test_verdict_per_run_from_the_two_fractions():
    v = R.run_verdicts(_summary())
    assert list(v["predicted"]) == ["use", "use", "no use", "no use", "use"]
    assert list(v["measured"]) == ["use", "no use", "no use", "use", "unknown"]
    assert list(v["agree"].iloc[:4]) == [True, False, True, False] and pd.isna(v["agree"].iloc[4])
    assert v["verdict"].iloc[1] == "DISAGREE: collapsed where theory predicts use"
    assert v["verdict"].iloc[3] == "DISAGREE: z used where theory predicts no use"
    partly = R.run_verdicts(_summary().iloc[:1].assign(measured_use_fraction=0.39))
    assert partly["verdict"].iloc[0] == "DISAGREE: only partly used where theory predicts use"
    assert not partly["agree"].iloc[0]
    assert v["run"].iloc[0] == "distribution, hard_em_then_soft, β=0.1" and v["run"].iloc[1] == "distribution, β=0.3"
    np.testing.assert_allclose(v["predicted use"], _summary()["predicted_use_fraction"])


def test_verdict_threshold_is_strict_and_the_markdown_counts_agreement():
    s = _summary().iloc[:1].assign(predicted_use_fraction=0.5, measured_use_fraction=0.5000001)
    assert R.run_verdicts(s)["verdict"].iloc[0] == "DISAGREE: z used where theory predicts no use"
    md = R.verdict_markdown(R.run_verdicts(_summary()))
    assert md.startswith("**2 of 5 runs agree with theory** (1 without a prediction or a measurement).")
    assert "predicted use 98% of rows, measured 91%" in md and md.count("\n- ") == 5
    assert R.verdict_markdown(R.run_verdicts(_summary().iloc[:0])) == "**No finished runs.**"


def test_verdict_names_a_missing_column():
    with pytest.raises(KeyError, match="measured_use_fraction"):
        R.run_verdicts(_summary().drop(columns="measured_use_fraction"))


def test_run_table_selects_renames_rounds_and_labels():
    t = R.run_table(_summary(), {"kl_prior_loss": "KL [nats]", "missing": "gone"})
    assert list(t.columns) == ["KL [nats]"] and t.index.name == "run"
    assert t["KL [nats]"].iloc[0] == 1.312 and t.index[2] == "plain, hard_em_then_soft, β=1"


def test_run_labels_name_each_field_apart_as_the_figures_do_and_tell_every_run_apart():
    """The review's "distribution 0.3 hard_em_then_soft": fields joined by spaces read as one phrase.
    A run's name joins its fields by ", " as the figures' legends join facets (``figstyle.groups``:
    "distribution, no aid"), β and the seed named; every run of a grid still has its own name."""
    from zfree_lab.report.figstyle import groups

    runs = pd.DataFrame([{"weighting": w, "beta": b, "aid": a, "latent_kind": "discrete", "remedy": "none", "seed": s}
                         for w in ("distribution", "plain") for b in (0.03, 0.3) for a in ("none", "hard_em_then_soft")
                         for s in (0, 1)])
    labels = [R.run_label(r, runs) for _, r in runs.iterrows()]
    assert labels[:4] == ["distribution, β=0.03, seed 0", "distribution, β=0.03, seed 1",
                          "distribution, hard_em_then_soft, β=0.03, seed 0",
                          "distribution, hard_em_then_soft, β=0.03, seed 1"]
    assert len(set(labels)) == len(runs)  # the label tells runs apart
    aided = runs[runs["aid"] != "none"]
    legend = {label for label, *_ in groups(aided)}  # the figure's name of a run's curve starts its table name
    assert all(any(R.run_label(r, runs).startswith(g + ", β=") for g in legend) for _, r in aided.iterrows())
    one_seed = runs[runs["seed"] == 0]
    assert R.run_label(one_seed.iloc[1], one_seed) == "distribution, hard_em_then_soft, β=0.03"  # one seed: unnamed
    routed = one_seed.iloc[1].to_dict() | {"injection": "memory", "latent_capacity": "shared_delta"}
    assert R.run_label(routed) == "distribution, hard_em_then_soft, memory route, shared_delta, β=0.03"
    assert R.run_label(one_seed.iloc[1].to_dict() | {"injection": "embedding", "latent_capacity": "per_value"}) == \
        "distribution, hard_em_then_soft, β=0.03"  # the defaults are not named


def test_runs_at_beta_picks_the_log_nearest_beta_per_facet_with_every_seed():
    runs = pd.DataFrame({"run_id": list("abcdef"), "weighting": ["plain"] * 4 + ["example"] * 2,
                         "beta": [0.03, 0.3, 0.3, 1.0, 0.01, 1.0], "seed": [0, 0, 1, 0, 0, 0]})
    got = R.runs_at_beta(runs, 0.12)  # log-distance: 0.3 is nearer 0.12 than 0.03 is; 1.0 nearer than 0.01
    assert sorted(got["run_id"]) == ["b", "c", "f"]
    assert R.nearest([0.01, 0.1, 1.0], 0.02) == 0.01 and R.nearest([], 0.5) == 0.5


def test_rho_table_is_the_ratio_of_means_and_the_mean_of_ratios():
    pe = pd.DataFrame({"weighting": "plain", "beta": 0.3, "lbar": [1.0, 3.0], "b": [2.0, 2.0],
                       "rho_i": [0.5, 1.5]})
    t = R.rho_table(pe)
    assert t["ratio_of_means"].iloc[0] == 1.0 and t["mean_of_ratios"].iloc[0] == 1.0
    pe["b"] = [1.0, 3.0]
    pe["rho_i"] = pe["lbar"] / pe["b"]
    t = R.rho_table(pe)
    assert t["ratio_of_means"].iloc[0] == 1.0 and t["mean_of_ratios"].iloc[0] == 1.0
    pe["lbar"] = [2.0, 3.0]
    pe["rho_i"] = pe["lbar"] / pe["b"]
    t = R.rho_table(pe)
    assert t["ratio_of_means"].iloc[0] == 1.25 and t["mean_of_ratios"].iloc[0] == 1.5


def test_aided_tables_split_in_two_and_skip_unaided_runs():
    runs = _summary().assign(n_latent=4, steps=500)
    aided = R.aided_runs(runs)
    assert list(aided["run_id"]) == ["a", "c", "d"]
    recipe, outcome = R.aided_tables(aided)
    assert {"aid", "β", "K", "steps"} <= set(recipe.columns) and "KL [nats]" in outcome.columns
    assert not set(recipe.columns) & set(outcome.columns) and outcome["KL [nats]"].iloc[0] == 1.312
    assert R.aided_runs(runs.drop(columns="aid")).empty


def test_aided_tables_keep_small_betas_and_rates_and_count_steps_in_whole_numbers():
    """A real-data study's β (β*/3 = 0.002199) and a latent rate of 1e-4 keep their digits (rounding
    to 3 decimals showed β 0.002 beside 0.002199 everywhere else, and lr 1e-4 as 0.0); the
    switch-on and hand-over steps read as steps (16, not 16.0), a gate never passed as NaN."""
    aided = pd.DataFrame({"run_id": ["run_a16b365b", "run_b"], "aid": ["hard_em_then_soft"] * 2,
                          "weighting": ["distribution"] * 2, "beta": [0.002199, 0.3], "lr_new": [1e-4, 1e-2],
                          "gate_first_pass_step": [16.0, np.nan], "handover_step": [16.0, 200.0],
                          "steps": [66, 400], "kl_prior_loss": [0.0056712, 1.4]})
    recipe, outcome = R.aided_tables(aided)
    assert list(recipe["β"]) == [0.002199, 0.3] and list(recipe["lr new"]) == [1e-4, 1e-2]
    html = recipe.to_html()
    assert ">16<" in html and ">16.0<" not in html and ">200<" in html and "NaN" in html
    assert outcome["KL [nats]"].iloc[0] == 0.006  # the outcome still rounds to 3 decimals


def test_show_hands_a_png_to_ipython_and_closes_the_figure(monkeypatch):
    import IPython.display
    import matplotlib.pyplot as plt

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj: shown.append(obj))
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    R.show(fig)
    assert len(shown) == 1 and shown[0].data[:8] == b"\x89PNG\r\n\x1a\n"
    assert fig.number not in plt.get_fignums()


def test_reference_and_errors_markdown():
    assert "ratio 1.100" in R.reference_markdown({"c_base": 1.1, "c_base_analytic": 1.0, "n_rows": 5})
    assert R.reference_markdown(None).startswith("**No reference")
    assert R.errors_markdown([]) == "No run failed."
    assert R.errors_markdown([], finished=3) == "No run failed (3 finished)."
    assert R.errors_markdown([{"run_id": "x", "error": "boom" * 100}], width=8) == "- <code>x</code>: boomboom"


def test_boundary_table_short_headers_indexed_by_facets():
    b = pd.DataFrame([{"weighting": "plain", "aid": "none", "n_betas": 3, "beta_half_measured": 0.21234,
                       "beta_half_predicted": 0.1, "ratio": 2.1234, "within": False, "note": ""}])
    t = R.boundary_table(b)
    assert t.index.names == ["weighting", "aid"] and t.loc[("plain", "none"), "β½ measured"] == 0.212
    assert list(t.columns) == ["β values", "β½ measured", "β½ predicted", "measured / predicted", "within ±25%", "note"]


def test_run_table_makes_json_null_columns_numeric():
    """A column read from summary.json files holds None where a metric is absent: the table shows
    one missing-value marker (NaN) and rounds the numbers, not "None" beside "NaN"."""
    s = _summary()
    s["alignment_nmi"] = pd.Series([None, 0.123456, None, None][: len(s)], dtype=object)
    t = R.run_table(s, {"alignment_nmi": "NMI"})
    assert t["NMI"].dtype.kind == "f" and t["NMI"].isna().sum() == s["alignment_nmi"].isna().sum()
    assert t["NMI"].dropna().iloc[0] == 0.123


def _aided_outcomes() -> pd.DataFrame:
    base = {"weighting": "distribution", "beta": 0.3, "aid": "hard_em_then_soft", "predicted_use_fraction": 0.99,
            "measured_use_fraction": 0.98, "alignment_nmi_unambiguous": 0.93,
            "baseline_normalized_reconstruction_loss": 0.2, "kl_prior_loss": 1.30, "bayes_rate": 1.36,
            "task_correctness": 0.995, "base_task_correctness": 1.0}
    return pd.DataFrame([
        base,  # every target met
        {**base, "weighting": "example", "alignment_nmi_unambiguous": 0.899},  # NMI just short
        {**base, "weighting": "token", "kl_prior_loss": 1.36 * 0.79},  # KL 21% low
        {**base, "weighting": "token", "beta": 0.1, "task_correctness": 0.985},  # 1.5 points below the base
        {**base, "weighting": "plain", "beta": 1.0, "predicted_use_fraction": 0.0, "measured_use_fraction": 0.01},
        {**base, "weighting": "plain", "beta": 2.0, "predicted_use_fraction": 0.0, "measured_use_fraction": 0.7},
        {**base, "weighting": "example", "beta": 0.1, "alignment_nmi_unambiguous": np.nan},  # no labels
    ])


def test_switch_on_targets_per_run_and_side_of_the_prediction():
    t = R.switch_on_targets(_aided_outcomes())
    assert list(t["predicted"]) == ["use"] * 4 + ["no use"] * 2 + ["use"]
    assert list(t["all met"].iloc[:6]) == [True, False, False, False, True, False] and pd.isna(t["all met"].iloc[6])
    assert not t["NMI (m=1) ≥ 0.9"].iloc[1] and t["ρ_recon ≤ 0.3"].iloc[1]
    assert not t["KL within 20% of I(z;y|x)"].iloc[2] and t["KL within 20% of I(z;y|x)"].iloc[0]
    assert not t["task correct ≥ base − 0.01"].iloc[3] and t["task correct ≥ base − 0.01"].iloc[0]
    assert t["z unused"].iloc[4] and not t["z unused"].iloc[5] and pd.isna(t["z unused"].iloc[0])
    assert pd.isna(t["NMI (m=1) ≥ 0.9"].iloc[4])  # no switch-on targets where theory predicts no use
    with pytest.raises(KeyError, match="bayes_rate"):
        R.switch_on_targets(_aided_outcomes().drop(columns="bayes_rate"))


def test_checkmarks_show_booleans_as_marks_and_missing_as_a_dash():
    t = R.checkmarks(R.switch_on_targets(_aided_outcomes()))
    assert list(t["all met"]) == ["✓", "✗", "✗", "✗", "✓", "✗", "–"]
    assert t["run"].iloc[0] == "distribution, hard_em_then_soft, β=0.3" and t["z unused"].iloc[4] == "✓"  # aid named
