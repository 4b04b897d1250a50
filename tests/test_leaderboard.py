"""The remedies leaderboard (issue "A remedies leaderboard"): the seed interval against
``scipy.stats.bootstrap`` itself, the cells against a pandas groupby of the same rows (counts,
means, ranks, compute ratios, sides), the winners in words with and without overlapping intervals,
leaderboard.csv written only for a study with seeds or remedies, the figure's data, and the report
section rendered on a fabricated seeded study."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from scipy.stats import bootstrap

from zfree_lab.experiment import leaderboard as LB

REMEDIES = ("none", "free_bits", "switch_on")
#: (remedy, weighting) -> z gain per seed; free_bits overlaps switch_on under distribution, not under plain
GAINS = {("none", "plain"): [0.0, 0.02, 0.04], ("free_bits", "plain"): [0.2, 0.25, 0.3],
         ("switch_on", "plain"): [0.5, 0.6, 0.7],
         ("none", "distribution"): [-0.01, 0.0, 0.01], ("free_bits", "distribution"): [0.4, 0.55, 0.6],
         ("switch_on", "distribution"): [0.5, 0.6, 0.7]}
TOKENS = {"none": 1000.0, "free_bits": 1000.0, "switch_on": 1500.0}
OUTSIDE = ("switch_on", "plain")


def _summary(seeds=(0, 1, 2), remedies=REMEDIES) -> pd.DataFrame:
    """summary.csv rows of a fabricated study: 3 seeds × 3 remedies × 2 weightings, one cell outside."""
    rows = []
    for (rem, w), gains in GAINS.items():
        if rem not in remedies:
            continue
        for s in seeds:
            g = gains[s]
            rows.append({"run_id": f"{rem}_{w}_s{s}", "control_run_id": f"control_{w}_s{s}", "remedy": rem,
                         "weighting": w, "beta": 0.01 if w == "plain" else 0.0043, "latent_kind": "discrete",
                         "aid": "hard_em_then_soft" if rem == "switch_on" else "none", "seed": s, "steps": 50,
                         "z_gain": g, "rate": 2 * g + 0.01 * s, "kl_prior_loss": 9.0, "z_used": g > 0.1 or s > 0,
                         "alignment_nmi": 0.5 + g / 2 + 0.01 * s, "task_correctness": 0.7 + 0.01 * s,
                         "predicted_use_fraction": 0.2 if (rem, w) == OUTSIDE else 0.9,
                         "forward_tokens": TOKENS[rem] * (1 + 0.01 * s), "train_wall_s": TOKENS[rem] / 100 + s})
    return pd.DataFrame(rows)


def test_seed_interval_is_scipys_percentile_bootstrap_of_the_mean():
    v = np.array([0.12, 0.31, 0.2])
    mean, lo, hi = LB.seed_interval(v, n_boot=2000, seed=0)
    ref = bootstrap((v,), np.mean, n_resamples=2000, confidence_level=0.95, method="percentile",
                    random_state=np.random.default_rng(0)).confidence_interval
    assert mean == np.mean(v) and (lo, hi) == (ref.low, ref.high)
    assert v.min() <= lo < mean < hi <= v.max()  # a percentile interval of 3 seeds stays inside their range
    assert LB.seed_interval([0.12, np.nan, 0.31, 0.2]) == (mean, lo, hi)  # a missing seed is dropped
    one = LB.seed_interval([0.4])
    assert one[0] == 0.4 and np.isnan(one[1]) and np.isnan(one[2])  # one seed: no interval
    assert all(np.isnan(LB.seed_interval([np.nan])))


def test_cells_are_the_groupby_means_over_seeds_with_ranks_ratios_and_sides():
    s = _summary()
    board = LB.leaderboard(s)
    assert len(board) == 6 and (board["n_seeds"] == 3).all() and (board["seeds"] == "0 1 2").all()
    ref = s.groupby(["remedy", "weighting"])[["z_gain", "rate", "alignment_nmi", "task_correctness", "forward_tokens",
                                              "train_wall_s"]].mean()
    got = board.set_index(["remedy", "weighting"]).loc[ref.index]
    for c in ref.columns:
        np.testing.assert_allclose(got[c], ref[c], rtol=1e-12, err_msg=c)
    for c in ("z_gain", "rate"):
        assert (got[f"{c}_lo"] <= got[c]).all() and (got[c] <= got[f"{c}_hi"]).all()
    assert (got["alignment_label"] == "strategy").all()
    # sides: the one cell with predicted use 0.2 lies outside
    assert got.loc[OUTSIDE, "side"] == "outside" and (got.drop(OUTSIDE)["side"] == "inside").all()
    # ranks by mean z gain within each side, 1 = best
    inside = board[board["side"] == "inside"]
    assert inside["rank"].tolist() == [1, 2, 3, 4, 5]
    assert list(zip(inside["remedy"], inside["weighting"]))[:2] == [("switch_on", "distribution"),
                                                                   ("free_bits", "distribution")]
    assert board.loc[board["side"] == "outside", "rank"].tolist() == [1]
    # compute: ratio of means to the "none" cell at the same weighting and beta
    for (rem, w), r in got.iterrows():
        none = ref.loc[("none", w)]
        assert r["forward_tokens_ratio"] == pytest.approx(ref.loc[(rem, w), "forward_tokens"] / none["forward_tokens"])
        assert r["train_wall_ratio"] == pytest.approx(ref.loc[(rem, w), "train_wall_s"] / none["train_wall_s"])
        assert r["compute_ref"] == "none"
    assert got.loc[("switch_on", "plain"), "forward_tokens_ratio"] == pytest.approx(1.5)
    # z used on 2 of 3 seeds of the "none" cells (seed 0 has no gain above 0.1)
    assert got.loc[("none", "plain"), "z_used_share"] == pytest.approx(2 / 3)


def test_controls_and_oracles_are_left_out_and_summary_keeps_one_row_per_run():
    s = _summary()
    extra = pd.DataFrame([{**s.iloc[0].to_dict(), "run_id": "control_plain_s0", "latent_source": "control",
                           "z_gain": 99.0}, {**s.iloc[0].to_dict(), "run_id": "oracle_x", "latent_source": "label:x",
                                            "z_gain": 99.0}])
    board = LB.leaderboard(pd.concat([s, extra], ignore_index=True))
    assert board["n_seeds"].sum() == len(s) and board["z_gain"].max() < 1
    # a control run id among the rows (a table joined with its controls) is left out too
    ctrl = {**s.iloc[0].to_dict(), "run_id": "control_plain_s1", "z_gain": 99.0}
    assert LB.leaderboard(pd.concat([s, pd.DataFrame([ctrl])]))["z_gain"].max() < 1


def test_a_study_gets_a_leaderboard_only_with_seeds_or_several_remedies(tmp_path):
    one = _summary(seeds=(0,), remedies=("none",))
    assert not LB.wants_leaderboard(one) and not LB.wants_leaderboard(one.iloc[:0])
    assert LB.wants_leaderboard(_summary(seeds=(0, 1), remedies=("none",)))
    assert LB.wants_leaderboard(_summary(seeds=(0,)))
    # a grid axis the cell key does not name (n_latent) is its own cell, not a second "seed"
    two = pd.concat([one.assign(n_latent=4), one.assign(n_latent=6, run_id=one["run_id"] + "k6")])
    assert not LB.wants_leaderboard(two) and len(LB.leaderboard(two)) == 2 * len(one)
    one.to_csv(tmp_path / "summary.csv", index=False)
    (tmp_path / "leaderboard.csv").write_text("stale")
    assert LB.write_leaderboard(tmp_path) is None and not (tmp_path / "leaderboard.csv").exists()
    assert LB.read_leaderboard(tmp_path) is None
    s = _summary()
    s.to_csv(tmp_path / "summary.csv", index=False)
    f = LB.write_leaderboard(tmp_path)
    back = LB.read_leaderboard(tmp_path)
    assert f == tmp_path / "leaderboard.csv" and len(back) == 6
    pd.testing.assert_frame_equal(back, LB.leaderboard(pd.read_csv(tmp_path / "summary.csv")), check_dtype=False)


def test_winners_name_the_winner_the_overlaps_and_the_cost():
    board = LB.leaderboard(_summary())
    inside, outside = LB.winners(board)
    g = {k: LB.seed_interval(v) for k, v in GAINS.items()}

    def ci(k):
        return f"[{g[k][1]:.3g}, {g[k][2]:.3g}]"

    assert inside.startswith("inside the predicted boundary: switch_on (distribution β=0.0043) has the highest mean "
                             f"z gain, {g[('switch_on', 'distribution')][0]:.3g} {ci(('switch_on', 'distribution'))}")
    # free_bits under distribution: [0.4, 0.6] against switch_on's [0.5, 0.7]: overlap
    assert (f"free_bits's interval {ci(('free_bits', 'distribution'))} overlaps switch_on's "
            f"{ci(('switch_on', 'distribution'))}: not distinguishable at 3 seeds") in inside
    # none's best cell (plain, up to 0.04) lies below
    assert f"none's interval {ci(('none', 'plain'))} lies below switch_on's" in inside
    assert "switch_on costs 1.50× the forward tokens" in inside
    assert outside.startswith("outside the predicted boundary: switch_on (plain β=0.01)") and "overlaps" not in outside
    # the plain cells alone, all inside: free_bits's [0.2, 0.3] lies below switch_on's [0.5, 0.7]
    plain = LB.leaderboard(_summary().query("weighting == 'plain'").assign(predicted_use_fraction=0.9))
    (text,) = LB.winners(plain)
    assert "switch_on (plain β=0.01) has the highest" in text and "overlaps" not in text
    assert (f"free_bits's interval {ci(('free_bits', 'plain'))} lies below switch_on's "
            f"{ci(('switch_on', 'plain'))}") in text
    # no control: no z gain, no winner
    (none,) = LB.winners(LB.leaderboard(_summary().drop(columns=["z_gain"]).assign(predicted_use_fraction=0.9)))
    assert "no z gain measured" in none


def test_real_text_nmi_is_the_best_labels_and_compute_falls_back_on_the_control(tmp_path):
    s = _summary(remedies=("free_bits", "switch_on")).assign(alignment_nmi=np.nan)
    s["structure/alignment_nmi/complete"] = 0.1
    s["structure/alignment_nmi/first_slot"] = np.where(s["remedy"] == "switch_on", 0.3, 0.05)
    for cid in s["control_run_id"].unique():
        (tmp_path / "runs" / cid).mkdir(parents=True)
        (tmp_path / "runs" / cid / "summary.json").write_text(json.dumps({"compute/forward_tokens": 500.0,
                                                                          "compute/train_wall_s": 2.0}))
    board = LB.leaderboard(s, tmp_path).set_index(["remedy", "weighting"])
    assert board.loc[("switch_on", "plain"), "alignment_label"] == "first_slot"
    assert board.loc[("switch_on", "plain"), "alignment_nmi"] == pytest.approx(0.3)
    assert board.loc[("free_bits", "plain"), "alignment_label"] == "complete"
    assert (board["compute_ref"] == "control").all()
    assert board.loc[("switch_on", "plain"), "forward_tokens_ratio"] == pytest.approx(1515.0 / 500.0)
    assert board.loc[("free_bits", "plain"), "train_wall_ratio"] == pytest.approx(11.0 / 2.0)


def test_the_figure_draws_one_point_per_cell_with_both_intervals_faceted_by_side():
    from zfree_lab.report.figstyle import REMEDY_STYLES, remedy_style
    from zfree_lab.report.plotting_study import plot_leaderboard
    from zfree.objective.remedies import REMEDIES as ALL

    assert set(ALL) <= set(REMEDY_STYLES) and len(set(REMEDY_STYLES.values())) == len(REMEDY_STYLES)
    board = LB.leaderboard(_summary())
    fig = plot_leaderboard(board)
    inside, outside = fig.axes
    assert inside.get_title() == "inside the predicted boundary"
    assert outside.get_title() == "outside the predicted boundary"
    assert len(inside.containers) == 5 and len(outside.containers) == 1  # errorbar containers: one per cell
    for ax, rows in ((inside, board[board["side"] == "inside"]), (outside, board[board["side"] == "outside"])):
        pts = sorted((c.lines[0].get_xdata()[0], c.lines[0].get_ydata()[0]) for c in ax.containers)
        assert pts == sorted(zip(rows["rate"], rows["z_gain"]))
        assert any(ln.get_ydata()[0] == 0 == ln.get_ydata()[-1] for ln in ax.lines)  # the gain-0 line
    c = outside.containers[0]
    assert c.lines[0].get_color() == remedy_style("switch_on")[0] and c.lines[0].get_marker() == "*"
    assert c.has_xerr and c.has_yerr
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_the_report_markdown_and_table():
    from zfree_lab.report.leaderboard_report import leaderboard_table, method_markdown, winner_markdown

    board = LB.leaderboard(_summary())
    t = leaderboard_table(board)
    assert t.index.names == ["side", "rank"] and len(t) == 6
    assert t["z gain [nats/ex]"].iloc[0] == "0.6 [0.5, 0.7]" and t["tokens ×"].iloc[0] == "1.50×"
    assert "aid" not in t  # set by the remedy itself: named by it
    md = method_markdown(board)
    assert "95 % percentile bootstrap" in md and "coarse at 3 seeds" in md and "50 steps" in md
    assert "forward tokens" in md and "wall time" in md
    w = winner_markdown(board)
    assert w.startswith("**Winners**") and w.count("\n- ") == 2 and "<" not in w


@pytest.mark.timeout(600)
def test_the_report_section_renders_for_a_seeded_remedies_study(tmp_path):
    from tests.real_study import make_remedy_study
    from tests.smoke_study import agg_backend
    from zfree.core.paths import NOTEBOOKS
    from zfree_lab.experiment.render import render_report

    d = make_remedy_study(tmp_path)
    with agg_backend():
        html = render_report(d, NOTEBOOKS / "study_report.ipynb").read_text()
    assert len(pd.read_csv(d / "summary.csv")) == 9  # one row per CVAE run, not per cell
    section = html.split("Remedies leaderboard")[1].split("Predicted against measured latent use")[0]
    for text in ("Method.", "percentile bootstrap", "switch_on", "free_bits", "first_slot", "Winners", "lies below",
                 "1.50×"):
        assert text in section, text
    assert section.count("<img") == 1 and "Traceback" not in html
