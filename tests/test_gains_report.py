"""The report on real data (issue "Real data, true numbers", items 1-6): the available-gain table and
its plain "no label" line, the gain verdicts under both exchange-rate rules, the gain figure, the
majority baselines, full-length samples, multiref.csv, the launch panel's β range, and a real-data
study (no strategies) rendering without the synthetic-only sections, each replaced by one line."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.real_study import LONG_Y, make_real_study
from zfree_lab.report import gains_report as G
from zfree_lab.report import labels_report as L
from zfree_lab.report import report as R
from zfree_lab.report.explore import launch_beta_range


def _oracles(lo=(0.08, -0.09), rows=(60, 60)) -> pd.DataFrame:
    return pd.DataFrame({"label": ["complete", "n<b>s</b>"], "n_values": [2, 3], "rows": list(rows),
                         "D_control": [76.0, 76.0], "delta_R": [0.2, 0.08], "delta_R_lo": list(lo),
                         "delta_R_hi": [0.32, 0.26], "H": [0.645, 1.03], "H_lo": [0.59, 0.92], "H_hi": [0.70, 1.16],
                         "eta": [0.31, 0.08], "eta_lo": [0.12, -0.09], "eta_hi": [0.52, 0.25],
                         "distinguishable": [lo[0] > 0, lo[1] > 0], "finetune_gain": [1.4, 1.4],
                         "oracle_run_id": ["o1", "o2"], "control_run_id": ["c", "c"]})


def test_available_gain_names_the_best_label_or_says_plainly_that_none_is_distinguishable():
    md = G.available_gain_markdown(_oracles())
    assert "complete" in md and "η = ΔR/H = 0.310" in md and "excludes 0" not in md
    assert G.measured_eta(_oracles()) == (0.31, "complete")
    none = _oracles(lo=(-0.01, -0.09))
    md = G.available_gain_markdown(none)
    assert "No label's ΔR interval lies above 0" in md and G.measured_eta(none) is None
    assert "[-0.01, 0.32], <code>n&#60;b&#62;s&#60;&#47;b&#62;</code> [-0.09, 0.26] holds 0" in md and "below 0" not in md
    t = G.available_gain_table(_oracles())
    assert list(t.index) == ["complete", "n<b>s</b>"] and t.loc["complete", "ΔR 95% CI"] == "[0.08, 0.32]"
    assert t["ΔR interval"].tolist() == ["above 0", "holds 0"]


def test_a_wide_oracle_table_of_few_labels_is_shown_turned_a_quarter():
    """A newcomer's report scrolled sideways at the label-oracle table (ten columns and more once the null,
    flipped and net columns are there): with more columns than the limit and few labels, each label is a
    column and each quantity a row; a narrow or long table is shown as it is."""
    from zfree_lab.report.table_view import turned_when_wide

    t = G.available_gain_table(_oracles())
    assert turned_when_wide(t, max_columns=len(t.columns)) is t  # narrow enough: unchanged
    view = turned_when_wide(t, max_columns=len(t.columns) - 1)
    assert list(view.columns) == ["complete", "n<b>s</b>"] and list(view.index) == list(t.columns)
    assert view.loc["ΔR 95% CI", "complete"] == "[0.08, 0.32]" and view.index.name == "quantity"
    assert view.columns.name == "label"
    assert turned_when_wide(t, max_columns=1) is t  # more labels than the limit: rows stay labels


def test_the_oracle_sentence_tells_intervals_below_0_from_intervals_that_hold_0():
    """Issue 35: both ΔR intervals lay below 0 ([-0.43, -0.15], [-1.03, -0.47]) and the report said
    "No label's ΔR interval excludes 0"."""
    below = _oracles(lo=(-0.43, -1.03)).assign(delta_R=[-0.29, -0.75], delta_R_hi=[-0.15, -0.47])
    md = G.available_gain_markdown(below)
    assert "excludes" not in md and "No label's ΔR interval lies above 0" in md
    assert "<code>complete</code> [-0.43, -0.15], <code>n&#60;b&#62;s&#60;&#47;b&#62;</code> [-1.03, -0.47] lies below 0" in md
    assert "holds 0" not in md and G.measured_eta(below) is None
    mixed = below.assign(delta_R_hi=[0.1, -0.47])
    md = G.available_gain_markdown(mixed)
    assert "[-1.03, -0.47] lies below 0" in md and "<code>complete</code> [-0.43, 0.1] holds 0" in md
    assert G.available_gain_table(mixed)["ΔR interval"].tolist() == ["holds 0", "below 0"]
    assert [G.interval_side(*b) for b in ((0.1, 2), (-2, -0.1), (-1, 1), (float("nan"), 1))] == \
        ["above 0", "below 0", "holds 0", "unknown"]
    assert "No label oracle" in G.available_gain_markdown(_oracles().iloc[:0])


def test_a_label_below_its_control_but_above_its_null_oracle_is_said_to_carry_information():
    """Issue 59: on unconditional SmolLM2 data (33 steps, 1 seed) the `food` oracle's ΔR was -0.87 [-1.36, -0.36]
    and the report said only that the label made D worse, while its null oracle (the label permuted, trained the
    same way) was worse still (-1.78): the true label is worth +0.91 [0.32, 1.52] over a permuted one."""
    o = _oracles(lo=(-1.36, -0.09)).assign(
        delta_R=[-0.872, 0.08], delta_R_hi=[-0.362, 0.26], delta_R_null=[-1.777, np.nan],
        delta_R_null_lo=[-2.40, np.nan], delta_R_null_hi=[-1.16, np.nan], label_value=[0.905, np.nan],
        label_value_lo=[0.324, np.nan], label_value_hi=[1.52, np.nan])
    md = G.available_gain_markdown(o)
    assert "lies below 0" in md
    (line,) = G.null_oracle_lines(o)  # the label without a null oracle gets no line
    assert line in md and line.startswith("- <code>complete</code> against its null oracle")
    assert "D_null − D_oracle = 0.905 nats/example [0.324, 1.52], the true label lowers D" in line
    assert "its ΔR below 0 is the oracle arm's training, not the label: the null oracle's ΔR is -1.777 [-2.4, -1.16]" in line
    holds = o.assign(label_value_lo=[-0.2, np.nan])
    (line,) = G.null_oracle_lines(holds)
    assert "no measurable value over a permuted label" in line and "oracle arm's training" not in line
    assert G.null_oracle_lines(_oracles()) == []  # no null oracles in the table: nothing said


def test_label_warnings_flag_few_rows_and_are_escaped():
    md = G.available_gain_markdown(_oracles(rows=(60, 12)))
    assert "12 evaluated rows &#40;&#60; 50&#41;" in md and "<b>" not in md


def _runs(tmp_path, beta_eff) -> pd.DataFrame:
    rows = []
    for i, (rid, measured) in enumerate((("a", 0.9), ("b", 0.9), ("c", 0.0))):
        d = tmp_path / rid
        d.mkdir()
        pd.DataFrame({"beta_eff": beta_eff, "n_tokens": 20, "b": 2.0, "bayes_nll": np.nan}).to_parquet(
            d / "per_example.parquet")
        rows.append({"run_id": rid, "run_dir": str(d), "weighting": "plain", "beta": 0.01 * (i + 1),
                     "measured_use_fraction": measured, "predicted_use_fraction": 1.0})
    return pd.DataFrame(rows)


def test_gain_verdict_needs_measured_use_and_a_gain_interval_above_zero(tmp_path):
    runs = _runs(tmp_path, beta_eff=[0.1, 0.2, 0.4, 0.5])
    gains = pd.DataFrame({"run_id": ["a", "b", "c"], "z_gain": [0.5, 0.01, 0.0], "z_gain_lo": [0.2, -0.1, -0.01],
                          "z_gain_hi": [0.8, 0.1, 0.01], "rate": [0.4, 0.4, 0.0], "gain_share": [2.5, 0.05, 0.0]})
    v = G.gain_verdicts(runs, gains, (0.31, "complete"))
    assert list(v["z used"]) == [True, False, False]
    assert v["verdict"].tolist() == ["z used: measured use, gain > 0", "z not used: rate paid, no gain", "z unused"]
    np.testing.assert_allclose(v["predicted use (η measured)"], 0.5)  # beta_eff < 0.31 on 2 of 4 rows
    assert v["η = 1 agrees"].tolist() == [True, False, False] and v["η measured agrees"].tolist() == [False, True, True]
    md = G.gain_verdict_markdown(v, (0.31, "complete"))
    assert md.startswith("**1 of 3 runs used z**") and "with η = 0.310" in md
    assert "over its control" not in md  # one control (here none named): nothing to tell apart
    own = G.gain_verdicts(runs, gains.assign(control_run_id=["c1", "c1", "c2"]), None)
    assert own["control"].tolist() == ["c1", "c1", "c2"]
    assert "[0.2, 0.8] over its control <code>c1</code>" in G.gain_verdict_markdown(own, None)
    worse = G.gain_verdicts(runs, gains.assign(z_gain_lo=[-2.81, -0.1, -0.3], z_gain_hi=[-1.95, 0.1, -0.1]), None)
    assert worse["verdict"].tolist() == ["z not used: rate paid, D worse than its control's",
                                         "z not used: rate paid, no gain", "z unused, D worse than its control's"]
    nv = G.gain_verdicts(runs, gains.iloc[:0], None)  # no control finished: unknown, not "unused"
    assert nv["z used"].isna().all() and nv["verdict"].str.startswith("unknown").all()


def test_predicted_use_at_eta_one_is_the_beta_eff_below_one_rule(tmp_path):
    runs = _runs(tmp_path, beta_eff=[0.5, 0.9, 1.1, 2.0])
    assert G.predicted_use_at(runs["run_dir"][0], 1.0) == 0.5 and G.predicted_use_at(runs["run_dir"][0], 3.0) == 1.0


def test_gain_figure_draws_each_run_with_its_interval_and_each_oracle():
    from zfree_lab.report.plotting_study import plot_gains

    runs = pd.DataFrame({"run_id": ["a", "b"], "weighting": ["plain", "distribution"], "aid": ["none", "none"],
                         "beta": [0.01, 0.004], "rate": [0.03, 0.006], "z_gain": [0.12, 0.0],
                         "z_gain_lo": [0.03, -0.003], "z_gain_hi": [0.22, 0.007]})
    fig = plot_gains(runs, _oracles(), eta=0.31)
    ax, ax_o = fig.axes
    labels = ax.get_legend_handles_labels()[1]
    assert {"plain", "distribution", "gain = rate (η = 1)"} <= set(labels) and any("0.31" in t for t in labels)
    assert sorted(t.get_text() for t in ax_o.texts) == sorted(["complete", "n<b>s</b>"])
    assert ax.get_xlim()[1] < 0.05  # scaled to the runs' rates, not to the oracles' H


def test_drop_empty_and_left_out_lines():
    t, gone = G.drop_empty(pd.DataFrame({"a": [1.0, np.nan], "b": [None, None], "c": [np.nan, np.nan]}), keep=("c",))
    assert list(t.columns) == ["a", "c"] and gone == ["b"] and "b" in G.dropped_markdown(gone)
    assert G.dropped_markdown([]) == "" and G.left_out("The staircase").startswith("*The staircase: left out — ")
    assert not G.has_generator_truth(pd.DataFrame({"bayes_rate": [np.nan]}))
    assert G.has_generator_truth(pd.DataFrame({"bayes_rate": [1.2]}))


def test_launch_beta_range_spans_the_study_beta_and_beta_star():
    assert launch_beta_range([0.0043], [0.0129]) == (-3.0, -1.25)
    assert launch_beta_range([], [float("nan")]) == (-2.0, 0.0)


def test_switch_on_targets_judge_what_is_known_and_only_the_gain_on_real_data():
    row = {"weighting": "distribution", "beta": 0.0043, "predicted_use_fraction": 1.0, "measured_use_fraction": 0.0,
           "alignment_nmi_unambiguous": np.nan, "baseline_normalized_reconstruction_loss": 1.02,
           "kl_prior_loss": 0.03, "bayes_rate": np.nan, "task_correctness": np.nan, "base_task_correctness": np.nan,
           "z_gain_lo": 0.03}
    t = R.switch_on_targets(pd.DataFrame([row]))
    assert t["ρ_recon ≤ 0.3"].iloc[0] is False or t["ρ_recon ≤ 0.3"].iloc[0] == False  # noqa: E712 - known: judged
    assert pd.isna(t["NMI (m=1) ≥ 0.9"].iloc[0]) and t["z gain > 0 (95% interval)"].iloc[0]
    real = R.switch_on_targets(pd.DataFrame([row]), synthetic=False)
    assert list(real.columns) == ["run", "predicted", "use measured", "z gain > 0 (95% interval)", "z unused", "all met"]
    assert not real["all met"].iloc[0]  # a gain without measured use: z not used, as the verdict says


def test_a_run_is_named_with_its_aid_in_every_table_whatever_the_other_runs():
    """Issue 35: "Targets met?" (the aided runs alone) dropped the aid, so an aided run read as the
    unaided one of the verdict above it."""
    rows = pd.DataFrame([{"weighting": "distribution", "beta": 0.0043, "aid": a, "latent_kind": "discrete",
                          "remedy": "none", "seed": 0, "predicted_use_fraction": 1.0, "measured_use_fraction": 0.0,
                          "alignment_nmi_unambiguous": np.nan, "baseline_normalized_reconstruction_loss": 1.0,
                          "kl_prior_loss": 0.03, "bayes_rate": np.nan, "task_correctness": np.nan,
                          "base_task_correctness": np.nan} for a in ("none", "hard_em_then_soft")])
    aided = R.aided_runs(rows)
    named = R.switch_on_targets(aided, synthetic=False)["run"].tolist()
    assert named == ["distribution, hard_em_then_soft, β=0.0043"] == [R.run_label(aided.iloc[0], rows)]
    assert R.run_verdicts(rows)["run"].tolist() == ["distribution, β=0.0043", named[0]]
    assert R.run_label(rows.iloc[1].to_dict() | {"latent_kind": "continuous", "remedy": "free_bits"}) == \
        "distribution, continuous, hard_em_then_soft, free_bits, β=0.0043"


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    return make_real_study(tmp_path_factory.mktemp("real"))


def test_label_table_puts_the_majority_baseline_beside_each_label(real):
    from zfree_lab.experiment.results import collect_runs

    t = L.label_table(collect_runs(real / "runs"))
    cols = list(t.columns)
    assert cols.index("complete majority") == cols.index("complete probe accuracy") + 1
    assert t["complete majority"].iloc[0] == round(40 / 60, 3) and t["first_slot majority"].iloc[0] == 0.5
    few = L.label_table(collect_runs(real / "runs"), min_rows=100)
    assert few["warning"].iloc[0] == "complete: 60 rows; first_slot: 60 rows; lexfile: 60 rows"
    # the rate is headed as the report's run tables head it (it read "rate (KL)" here, "KL [nats]" there)
    assert "KL [nats]" in cols and "rate (KL)" not in cols


def test_samples_at_full_length_and_multiref_read_defensively(real, tmp_path):
    t = L.samples_table(real / "runs" / "cvae_aid_b")
    assert LONG_Y in set(t["greedy"]) and len(LONG_Y) > 150
    assert L.samples_table(real / "runs" / "cvae_aid_b", max_chars=20)["greedy"].str.len().max() == 20
    m = L.multiref_table(real)
    assert list(m.columns[:4]) == ["run", "pairwise BLEU among z values", "references covered", "MRs"]
    (tmp_path / "multiref.csv").write_text("")
    assert L.multiref_table(tmp_path) is None and L.multiref_table(tmp_path / "nowhere") is None


def test_samples_read_as_text_left_aligned_with_line_breaks_and_no_empty_x(real, tmp_path):
    """The reviewer's greedy/sampled table on real data: sentences right-aligned, a newline shown as the
    two characters "\\n", and an index column of empty x on unconditional data. Now: the index is the
    latent value alone where every x is empty, and ``samples_view`` draws each cell from the left with its
    line breaks kept, every text escaped."""
    pd.DataFrame({"id": ["v0", "v0"], "x": ["", ""], "reference": ["r", "r"], "latent": [0, 1],
                  "greedy": ["Line one.\nLine two <b>bold</b>", "Short."], "sampled": ["A pub.", LONG_Y]}
                 ).to_parquet(tmp_path / "samples.parquet")
    t = L.samples_table(tmp_path)
    assert list(t.index.names) == ["latent"] and list(t.columns) == ["greedy", "sampled"]
    assert list(L.samples_table(real / "runs" / "cvae_aid_b").index.names) == ["x", "latent"]  # x given: kept
    html = L.samples_view(t).to_html()
    assert "text-align: left" in html and "white-space: pre-wrap" in html
    assert "Line one.\nLine two &lt;b&gt;bold&lt;/b&gt;" in html and "\\n" not in html and "<b>" not in html
    assert LONG_Y in html  # at full length


def test_a_many_valued_label_is_drawn_as_a_heatmap_and_missing_control_values_are_explained():
    """Issue 35: a 44-value label's confusion ran off the page as a table pandas cut to "…"; the
    44-value oracle's multi-reference control columns showed NaN with no word why."""
    from zfree.evaluate.latent_stats import label_confusion
    from zfree_lab.report.plotting_study import plot_label_confusion
    from tests.real_study import LEXFILES

    pe = pd.DataFrame({"posterior_argmax": np.arange(88) % 3, "label/lexfile": LEXFILES * 2})
    conf = label_confusion(pe, "lexfile")
    assert L.confusion_is_wide(conf) and not L.confusion_is_wide(label_confusion(pe.assign(**{
        "label/lexfile": ["a", "b"] * 44}), "lexfile"))
    ax = plot_label_confusion(conf).axes[0]
    assert ax.images[0].get_array().shape == (44, 3)  # every value drawn: one row each, none cut
    np.testing.assert_allclose(ax.images[0].get_array().sum(axis=1), 1.0)  # shares of each value's rows
    assert [t.get_text() for t in ax.get_yticklabels()] == list(conf.columns) and "adj.$ppl_" in LEXFILES
    assert sorted(float(t.get_text()) for t in ax.texts) == sorted(conf.to_numpy()[conf.to_numpy() > 0].tolist())
    t = pd.DataFrame({"run": ["a", "o<b>", "n"], "outputs per MR": [4, 44, 4], "control": ["c", "c", np.nan],
                      "control pairwise BLEU": [0.6, np.nan, np.nan]})
    note = L.multiref_note(t)
    assert note.startswith("*– in the control columns: ") and "<code>a</code>" not in note
    assert "<code>o&#60;b&#62;</code>: its control draws 6 samples per MR, fewer than its 44 outputs" in note
    assert "<code>n</code>: no z-free control is linked to it" in note and L.multiref_note(t.iloc[:1]) == ""
    assert L.dashes(t)["control pairwise BLEU"].tolist() == [0.6, "–", "–"]


@pytest.mark.timeout(600)
def test_a_real_data_report_leaves_out_the_synthetic_sections_with_one_line_each(real):
    from tests.smoke_study import agg_backend
    from zfree_lab.experiment.render import render_report

    with agg_backend():
        html = render_report(real).read_text()
    for text in ("What z could gain: the label oracles", "Available gain.", "z gain", "runs used z",
                 "c_base the runs used", "The alignment-NMI panel: left out",
                 "The predicted boundary line and β* marks: left out", "Columns left out", "complete majority",
                 "Multi-reference evidence", "pairwise BLEU among z values", LONG_Y):
        assert text in html, text
    # the sections with nothing to show fold into the closing list, each with its one left-out line
    folded = html.split("Sections with nothing to show in this study")[-1].split("<li>")[1:]
    for title in ("The phase boundary", "The staircase", "Latent value against strategy"):
        item = next((i for i in folded if i.startswith(f"<strong>{title}")), None)
        assert item is not None and item.count("left out — ") == 1, (title, folded)
        assert html.count(f">{title}") == 1, title  # no heading of its own left in the page
    assert "analytic I(z;y|x)</th>" not in html and "log K/m</th>" not in html and "task correct</th>" not in html
    assert "Remedies leaderboard" not in html and not (real / "leaderboard.csv").exists()  # one seed, one remedy
    assert "…" not in html.split("Greedy and sampled y")[-1]  # samples at full length
    # issue 35: the report opens with the budget, the estimate and the cuts, before any result
    opening = html.split("What was run against what was asked")[1].split("What z could gain")[0]
    for text in ("a budget of 30.0 min", "about 22.0 min for the grid", "Cut to fit the budget, in this order",
                 "batch 32 -&gt; 8 rows a step", "A smoke test, not a result", "fewer than 50",
                 "grid (runs, controls, oracles)", "39.4 min in all"):
        assert text in opening, text
    assert html.index("What was run against what was asked") < html.index("What z could gain")
    # each run against its own control; where an interval lies; the aid in every table
    assert "over its control <code>control_distribution_aid</code>" in html and "below 0</td>" in html
    assert "D worse than its control" in html
    targets = html.split("Targets met?")[1].split("The barrier")[0]
    assert "distribution, hard_em_then_soft, β=0.0043" in targets
    # a 44-value label's confusion is a figure, not a table cut to "…"; wide tables scroll; "–" explained
    confusion = html.split("Latent values against each label")[1].split("Greedy and sampled y")[0]
    assert "<img" in confusion and "…" not in confusion and "lexfile</th>" not in confusion
    assert "overflow-x: auto" in html
    assert "– in the control columns" in html and "fewer than its 44 outputs per MR" in html


def test_oracles_of_one_label_on_several_routes_are_named_by_route_arm_and_seed(tmp_path):
    """The oracle-smollm2 study's report listed 24 lines "`n_sentences` against its null oracle ..." with no word of
    which route, arm or seed each was; each oracle is now named as its runs are (a route and ``shared_delta`` when
    not the defaults, then the seed), in the table and in the value lines alike."""
    import json

    six = pd.concat([_oracles().iloc[:1]] * 3, ignore_index=True).assign(
        oracle_run_id=["e0", "m0", "m1"], label_value=0.2, label_value_lo=0.1, label_value_hi=0.3)
    for rid, cfg in (("e0", {"seed": 0}), ("m0", {"seed": 0, "injection": "memory", "latent_capacity": "shared_delta"}),
                     ("m1", {"seed": 1, "injection": "memory", "latent_capacity": "shared_delta"})):
        (tmp_path / "runs" / rid).mkdir(parents=True)
        (tmp_path / "runs" / rid / "config.json").write_text(json.dumps(cfg))
    named = G.with_oracle_seeds(six, tmp_path)
    names = ["complete, seed 0", "complete, memory route, shared_delta, seed 0", "complete, memory route, shared_delta, seed 1"]
    assert list(G.available_gain_table(named).index) == names
    lines = G.null_oracle_lines(named)
    assert [ln.split(" against")[0] for ln in lines] == [f"- {G.md_code(n)}" for n in names], lines


def test_the_verdict_head_says_when_a_better_model_is_not_zs_doing(tmp_path):
    """Issue 59's run (1 seed, 33 steps): an unaided run beat its control by 0.72 nats net of rate with z unused
    (use in the model -0.001), and the head counted it under "a better model of y given x" with no word that z was
    not switched on there. The head states the use rule as theory computes it (the base's excess counted)."""
    runs = _runs(tmp_path, beta_eff=[0.1, 0.2, 0.4, 0.5])
    gains = pd.DataFrame({"run_id": ["a", "b", "c"], "z_gain": [0.5, 0.7, 0.0], "z_gain_lo": [0.2, 0.45, -0.01],
                          "z_gain_hi": [0.8, 1.0, 0.01], "rate": [0.4, 0.003, 0.0], "gain_share": [2.5, 0.05, 0.0],
                          "use_shuffled": [0.3, -0.001, 0.0], "use_shuffled_lo": [0.1, -0.002, -0.01],
                          "use_shuffled_hi": [0.5, 0.0007, 0.01], "z_switched_on": [True, False, False],
                          "z_better_model": [True, True, False], "net_gain": [0.1, 0.72, 0.0],
                          "net_gain_lo": [0.05, 0.46, -0.01], "net_gain_hi": [0.2, 1.04, 0.01]})
    v = G.gain_verdicts(runs, gains, None)
    md = G.gain_verdict_markdown(v, None)
    assert "**z switched on in 1**" in md and "≥ 2 codes" in md and ">= 2" not in md
    assert ("**a better model of y given x than its control in 2** (net gain: the control's D minus the CVAE's "
            "marginal NLL, the rate paid, interval above 0; 1 of them with z not shown switched on: there the better "
            "model is not z's doing)") in md
    assert "Theory: z pays where β_eff < η·(1 + |S|·excess / Bayes NLL)" in md
    both = G.gain_verdict_markdown(G.gain_verdicts(runs, gains.assign(z_better_model=[True, False, False]), None), None)
    assert "in 1** (net gain" in both and "not z's doing" not in both


def test_a_use_whose_interval_is_above_0_but_under_the_floor_is_said_to_be_under_it(tmp_path):
    """A smoke study's run (1 seed): use in the model 2e-05 [8.03e-06, 3.15e-05] nats/example with 3 codes was "not
    shown switched on" while the head's rule read "interval above 0, ≥ 2 codes": the rule's floor
    (``zfree_lab.experiment.gains.USE_FLOOR``) is said in the head and in the run's line. Each run's line reads its
    flags whatever bool type the frame holds."""
    runs = _runs(tmp_path, beta_eff=[0.1, 0.2, 0.4, 0.5])
    gains = pd.DataFrame({"run_id": ["a", "b"], "z_gain": [0.5, 0.01], "z_gain_lo": [0.2, -0.01],
                          "z_gain_hi": [0.8, 0.03], "rate": [0.4, 0.003], "gain_share": [2.5, 0.05],
                          "use_shuffled": [0.3, 2e-05], "use_shuffled_lo": [0.1, 8.03e-06],
                          "use_shuffled_hi": [0.5, 3.15e-05], "z_switched_on": [True, False],
                          "z_better_model": [True, False], "net_gain": [0.1, 0.0],
                          "net_gain_lo": [0.05, -0.01], "net_gain_hi": [0.2, 0.01]})
    md = G.gain_verdict_markdown(G.gain_verdicts(runs, gains, None), None)
    assert f"interval above 0, at least {G.USE_FLOOR:g} nats/example, ≥ 2 codes" in md
    (line,) = [ln for ln in md.splitlines() if "not shown switched on" in ln]
    assert f"(use in the model 2e-05 [8.03e-06, 3.15e-05], under the floor of {G.USE_FLOOR:g} nats/ex)" in line
    assert md.count("under the floor") == 1  # the switched-on run's line has no such clause
    # numpy's bools in a column that also holds NaN (run c has no gains) were not `is True`: run a, switched on and
    # a better model, read "z is not shown switched on" and "not shown to model y given x better"
    assert "z is switched on: the decoder reads 0.3 nats/ex [0.1, 0.5]" in md
    assert "the CVAE models y given x better than its control: net gain 0.1" in md


def test_oracles_of_one_label_at_several_seeds_are_named_by_their_seed(tmp_path):
    """A 3-seed study's `complete` oracles read "complete" three times in the available-gain table and the
    oracle figure; each is named by its run's seed now ("complete, seed 0"), a single oracle by its label."""
    import json

    from zfree_lab.report.plotting_study import plot_gains

    three = pd.concat([_oracles().iloc[:1]] * 3, ignore_index=True).assign(oracle_run_id=["o2", "o0", "o1"])
    for rid, seed in (("o2", 2), ("o0", 0), ("o1", 1)):
        (tmp_path / "runs" / rid).mkdir(parents=True)
        (tmp_path / "runs" / rid / "config.json").write_text(json.dumps({"seed": seed}))
    named = G.with_oracle_seeds(three, tmp_path)
    assert list(G.available_gain_table(named).index) == ["complete, seed 2", "complete, seed 0", "complete, seed 1"]
    runs = pd.DataFrame({"run_id": ["a"], "weighting": ["plain"], "aid": ["none"], "beta": [0.01], "rate": [0.03],
                         "z_gain": [0.12], "z_gain_lo": [0.03], "z_gain_hi": [0.22]})
    texts = sorted(t.get_text() for t in plot_gains(runs, named).axes[1].texts)
    assert texts == ["complete, seed 0", "complete, seed 1", "complete, seed 2"]
    one = G.with_oracle_seeds(_oracles(), tmp_path)  # distinct labels: unchanged, no seed read
    assert "seed" not in one and list(G.available_gain_table(one).index) == ["complete", "n<b>s</b>"]
    (tmp_path / "runs" / "o1" / "config.json").write_text("{")  # unreadable: that oracle keeps its bare label
    assert G.oracle_names(G.with_oracle_seeds(three, tmp_path))[2] == "complete"
    below = named.assign(delta_R=-1.0, delta_R_lo=-1.2, delta_R_hi=-0.8, distinguishable=False)
    md = G.available_gain_markdown(below)
    assert "(1 label(s), 3 oracles, 60 evaluated rows)" in md and "<code>complete&#44; seed 0</code> [-1.2, -0.8]" in md
