"""Figures, checked for the data they draw (line data, scatter offsets), not their pixels."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.collections import PathCollection  # noqa: E402

from zfree_lab.report import plotting as P  # noqa: E402
from zfree_lab.report import rate_distortion as RD  # noqa: E402
from zfree_lab.report import plotting_aids as PA  # noqa: E402
from zfree_lab.report import plotting_study as PS  # noqa: E402
from zfree_lab.report.figstyle import log_axis  # noqa: E402

C_BASE = 0.25


def _runs(latent_kinds=("discrete",)) -> pd.DataFrame:
    rows = []
    for lk in latent_kinds:
        for w, rw in (("plain", 1.0), ("distribution", 1 / C_BASE), ("example", 3.0)):
            for beta in (0.03, 0.3, 1.0):
                rows.append({"run_id": f"{w}_{beta}_{lk}", "weighting": w, "latent_kind": lk, "aid": "none",
                             "beta": beta, "recon_weight": rw, "kl_prior_loss": 1 / (beta * rw),
                             "baseline_normalized_reconstruction_loss": 1 - 0.01 / beta, "alignment_nmi": beta / 2,
                             "task_correctness": 0.5, "rate": 1.0 / beta + rw, "distortion": 10 - 1 / beta, "seed": 0,
                             "oracle_rho": 0.9, "predicted_use_fraction": 0.5, "measured_use_fraction": 0.1})
    return pd.DataFrame(rows)


def _per_example() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    parts = []
    for w in ("plain", "distribution"):
        for beta in (0.1, 1.0):
            n = 20
            b = rng.uniform(0.5, 2.0, n)
            lbar = b * rng.uniform(0.8, 1.1, n)
            parts.append(pd.DataFrame({"weighting": w, "latent_kind": "discrete", "aid": "none", "beta": beta,
                                       "b": b, "lbar": lbar, "rho_i": lbar / b, "n_tokens": rng.integers(4, 12, n),
                                       "beta_eff": rng.uniform(0.1, 5, n), "kl": rng.uniform(0, 1, n)}))
    return pd.concat(parts, ignore_index=True)


def _scatters(ax):
    return [c for c in ax.collections if isinstance(c, PathCollection)]


def test_phase_diagram_draws_each_run_at_beta_w_with_boundary_and_iso_lines():
    runs = _runs()
    fig = P.plot_phase_diagram(runs, c_base=C_BASE, beta_over_w=0.1, critical_betas={"example": 0.05},
                               highlight=(0.3, 1.0))
    ax = fig.axes[0]  # rate panel
    cells = _scatters(ax)[0]
    got = pd.DataFrame(cells.get_offsets(), columns=["beta", "w"]).assign(v=cells.get_array())
    want = runs[["beta", "recon_weight", "kl_prior_loss"]].sort_values(["beta", "recon_weight"]).to_numpy()
    np.testing.assert_allclose(got.sort_values(["beta", "w"]).to_numpy(), want)
    boundary = [ln for ln in ax.lines if ln.get_label().startswith("predicted boundary")][0]
    np.testing.assert_allclose(boundary.get_xdata() / boundary.get_ydata(), 0.1)
    iso = [ln for ln in ax.lines if ln.get_linestyle() == ":"]
    assert len(iso) >= 5
    for ln in iso:  # lines of constant beta / w
        r = np.asarray(ln.get_xdata()) / np.asarray(ln.get_ydata())
        np.testing.assert_allclose(r, r[0])
    assert any(np.allclose(ln.get_ydata(), 1 / C_BASE) for ln in ax.lines)  # the 1/c_base row
    marks = [c for c in _scatters(ax) if c.get_offsets().shape == (1, 2)]
    offsets = {tuple(np.round(c.get_offsets()[0], 6)) for c in marks}
    assert (0.05, 3.0) in offsets and (0.3, 1.0) in offsets  # example's beta*, the highlighted cell
    assert len([a for a in fig.axes if a.get_visible() and a.get_xlabel() == "β"]) == 4


def test_rate_distortion_one_curve_per_weighting_and_reference_points():
    runs = _runs()
    fig = P.plot_rate_distortion(runs, z_free=12.0, bayes_rate=1.2)
    ax = fig.axes[0]
    curves = {ln.get_label(): ln for ln in ax.lines if not ln.get_label().startswith("_")}
    for w in ("plain", "distribution", "example"):
        s = runs[runs["weighting"] == w].sort_values("beta")
        np.testing.assert_allclose(curves[w].get_xdata(), s["rate"])
        np.testing.assert_allclose(curves[w].get_ydata(), s["distortion"])
    pts = {c.get_label(): c.get_offsets()[0] for c in _scatters(ax)}
    np.testing.assert_allclose(pts["z-free (R = 0, D = mean |S|·b)"], [0, 12.0])
    np.testing.assert_allclose([v for k, v in pts.items() if k.startswith("analytic optimum")][0], [1.2, 0.0])
    iso = [ln for ln in ax.lines if ln.get_linestyle() in (":", "--")]
    for ln in iso:  # iso-ELBO: D + R constant along the line
        s = np.asarray(ln.get_xdata()) + np.asarray(ln.get_ydata())
        np.testing.assert_allclose(s, s[0])


def test_facets_get_their_own_line_style():
    fig = P.plot_rate_distortion(_runs(("discrete", "continuous")))
    styles = {ln.get_label(): ln.get_linestyle() for ln in fig.axes[0].lines if not ln.get_label().startswith("_")}
    assert styles["plain, discrete"] != styles["plain, continuous"]
    assert len([k for k in styles if k.startswith(("plain", "distribution", "example"))]) == 6


def test_effective_beta_draws_the_median_use_threshold_where_the_base_falls_short_of_bayes():
    """A smoke report read "predicted use 0.983" beside β_eff points all right of the β_eff = 1 line: the
    predicted use counts the base's excess (threshold 1 + |S|·excess / Bayes NLL per row). Its median is
    drawn (in every panel) where every row's Bayes NLL is known and the median lies above 1; not otherwise."""
    pe = _per_example()
    pe = pe[pe["beta"] == 0.1].copy()
    pe["bayes_nll"] = 0.5 * pe["n_tokens"] * pe["b"]  # the base's excess equals the Bayes NLL: threshold 2
    labels = [[ln.get_label() for ln in ax.lines] for ax in P.plot_effective_beta(pe).axes[:3]]
    assert all("use threshold, median 2 (base's excess)" in ls for ls in labels), labels
    ax_k = P.plot_effective_beta(pe).axes[2]
    (line,) = [ln for ln in ax_k.lines if ln.get_label().startswith("use threshold")]
    assert line.get_xdata()[0] == pytest.approx(2.0)
    for no_line in (pe.assign(bayes_nll=np.nan), pe.assign(bayes_nll=pe["n_tokens"] * pe["b"]), pe.drop(columns="bayes_nll")):
        assert not any(ln.get_label().startswith("use threshold") for ax in P.plot_effective_beta(no_line).axes
                       for ln in ax.lines)


def test_effective_beta_panels_draw_b_length_and_kl_with_the_unit_line():
    pe = _per_example()
    pe = pe[pe["beta"] == 0.1]
    fig = P.plot_effective_beta(pe)
    ax_b, ax_n, ax_k = fig.axes
    s = pe[pe["weighting"] == "plain"]
    np.testing.assert_allclose(_scatters(ax_b)[0].get_offsets(), s[["b", "beta_eff"]].to_numpy())
    np.testing.assert_allclose(_scatters(ax_n)[0].get_offsets(), s[["n_tokens", "beta_eff"]].to_numpy())
    np.testing.assert_allclose(_scatters(ax_k)[0].get_offsets(), s[["beta_eff", "kl"]].to_numpy())
    assert any(np.allclose(ln.get_ydata(), 1.0) for ln in ax_b.lines)
    assert any(np.allclose(ln.get_xdata(), 1.0) for ln in ax_k.lines)


def test_effective_beta_tells_apart_runs_that_share_every_beta_eff():
    """Issue 35: an aided and an unaided run at one beta and weighting have the same beta_eff on every
    row; both were drawn as identical dots. Now: another marker, open over filled, and a note."""
    pe = _per_example()
    pe = pe[(pe["beta"] == 0.1) & (pe["weighting"] == "distribution")]
    both = pd.concat([pe, pe.assign(aid="hard_em_then_soft", kl=pe["kl"] + 1)], ignore_index=True)
    fig = P.plot_effective_beta(both)
    unaided, aided = _scatters(fig.axes[0])
    np.testing.assert_allclose(unaided.get_offsets(), aided.get_offsets())  # the same places, so:
    assert unaided.get_paths()[0].vertices.shape != aided.get_paths()[0].vertices.shape  # circle vs triangle
    assert unaided.get_facecolors()[0][3] > 0 and len(aided.get_facecolors()) == 0  # filled vs open
    assert [unaided.get_label(), aided.get_label()] == ["distribution, no aid", "distribution, hard_em_then_soft"]
    assert "share every β_eff" in fig.axes[0].get_title(loc="left")
    assert P.plot_effective_beta(pe).axes[0].get_title(loc="left") == ""  # one run per place: no note


def test_rho_distributions_mark_ratio_of_means_and_mean_of_ratios():
    pe = _per_example()
    fig = P.plot_rho_distributions(pe)
    assert len(fig.axes) == 2
    ax = fig.axes[0]
    s = pe[pe["weighting"] == "plain"]
    lines = {ln.get_label(): ln.get_ydata() for ln in ax.lines}
    ratio = [k for k in lines if k.startswith("ratio of means")][0]
    mean = [k for k in lines if k.startswith("mean of ratios")][0]
    np.testing.assert_allclose(lines[ratio], [s[s.beta == b].lbar.mean() / s[s.beta == b].b.mean() for b in (0.1, 1.0)])
    np.testing.assert_allclose(lines[mean], [s[s.beta == b].rho_i.mean() for b in (0.1, 1.0)])
    assert not np.allclose(lines[ratio], lines[mean])


def test_training_curves_draw_every_term_and_mark_the_collapse():
    df = pd.DataFrame({"step": [0, 5, 10], "loss/val/kl_prior_loss": [0.0, 0.2, 0.01],
                       "loss/val/baseline_normalized_reconstruction_loss": [1.0, 0.99, 1.0],
                       "structure/alignment_nmi": [0.1, 0.3, 0.0],
                       "loss_contrib/fraction_abs/reconstruction_loss": [1.0, 0.9, 0.99],
                       "loss_contrib/fraction_abs/kl_prior_loss": [0.0, 0.1, 0.01]})
    fig = P.plot_training_curves({"run": df})
    fr, kl = fig.axes[0], fig.axes[1]
    assert {ln.get_label() for ln in fr.lines} == {"run: reconstruction_loss", "run: kl_prior_loss"}
    np.testing.assert_allclose([ln for ln in kl.lines if ln.get_label() == "run"][0].get_ydata(), [0.0, 0.2, 0.01])
    vlines = [ln for ln in kl.lines if ln.get_linestyle() == ":"]
    assert [ln.get_xdata()[0] for ln in vlines] == [10]  # first evaluation after step 0 with KL < 0.05


def test_rate_and_rho_vs_beta_and_loss_fractions_accept_facets():
    runs = _runs(("discrete", "continuous"))
    runs["loss_contrib/fraction_abs/kl_prior_loss"] = 0.1
    fig = PS.plot_rate_and_rho_vs_beta(runs)
    assert len(fig.axes) == 6 and len(fig.axes[0].lines) == 2
    fig = PS.plot_loss_fractions(runs)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]  # horizontal bars: one label a row
    assert len(set(labels)) == len(runs) and not any("\n" in t for t in labels)


@pytest.fixture(autouse=True)
def _close():
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def test_phase_boundary_draws_measured_rate_prediction_and_both_half_betas():
    runs = _runs()
    curves = pd.DataFrame({"weighting": "plain", "beta": np.geomspace(0.01, 3, 50)})
    curves["predicted_rate"] = np.where(curves["beta"] < 0.1, 1.4, 0.0)
    boundary = pd.DataFrame([{"weighting": "plain", "aid": "none", "beta_half_measured": 0.2,
                              "beta_half_predicted": 0.1, "ratio": 2.0}])
    fig = PA.plot_phase_boundary(runs, curves, boundary)
    ax = fig.axes[0]
    measured = [ln for ln in ax.lines if ln.get_label().startswith("measured plain")][0]
    np.testing.assert_allclose(measured.get_xdata(), [0.03, 0.3, 1.0])
    np.testing.assert_allclose(measured.get_ydata(), [1 / 0.03, 1 / 0.3, 1.0])
    vlines = {round(float(ln.get_xdata()[0]), 6) for ln in ax.lines if len(set(ln.get_xdata())) == 1}
    assert {0.1, 0.2} <= vlines
    assert any("2.00× predicted" in ln.get_label() for ln in ax.lines)
    assert any(ln.get_label() == "predicted rate" for ln in ax.lines)


def test_use_by_length_draws_measured_and_predicted_per_beta():
    use = pd.DataFrame({"n_tokens": [5, 9, 13] * 2, "measured_use": [1, 0.5, 0, 1, 1, 1],
                        "predicted_use": [1, 1, 0, 1, 1, 1], "beta": [0.9] * 3 + [0.3] * 3, "aid": "hard_em_then_soft"})
    ax = PA.plot_use_by_length(use).axes[0]
    by = {ln.get_label(): ln for ln in ax.lines}
    np.testing.assert_allclose(by["β=0.9 hard_em_then_soft, measured"].get_ydata(), [1, 0.5, 0])
    np.testing.assert_allclose(by["β=0.9 predicted"].get_ydata(), [1, 1, 0])
    assert len(ax.lines) == 4


def _minor_labels(axis) -> list[str]:
    return [t.get_text() for t in axis.get_ticklabels(minor=True) if t.get_text()]


def test_log_axes_label_major_ticks_only_as_plain_numbers():
    """A log axis over less than a decade (betas 0.03-0.3) would get "3×10⁻² 4×10⁻² …" minor
    labels from matplotlib's default; ours labels the data's betas, as plain numbers, and nothing else."""
    runs = _runs()
    fig = PS.plot_rate_and_rho_vs_beta(runs)
    fig.canvas.draw()
    ax = [a for a in fig.axes if a.get_xlabel() == "β"][0]  # the bottom row carries the shared β labels
    assert ax.get_xscale() == "log" and not _minor_labels(ax.xaxis)
    shown = sorted(float(t.get_text()) for t in ax.get_xticklabels() if t.get_text())
    assert shown == sorted(runs["beta"].unique())
    fig = P.plot_effective_beta(_per_example())  # many distinct values: 1-2-5 or decades, no minor labels
    fig.canvas.draw()
    for ax, axis in ((fig.axes[0], fig.axes[0].yaxis), (fig.axes[2], fig.axes[2].xaxis)):
        labels = [t.get_text() for t in axis.get_ticklabels() if t.get_text()]
        assert labels and all("×" not in t and "$" not in t for t in labels) and not _minor_labels(axis)


def test_a_log_axis_over_decades_with_one_beta_labels_its_decades_too():
    """The reviewer's smoke study: one beta (0.3) under theory's predicted rate over five decades; the
    shared β axis was labelled "0.3" alone. Now the powers of ten in view are labelled too, as plain
    numbers, none within 0.3 decades of the data's beta, no minor labels."""
    runs = _runs()
    runs = runs[(runs["beta"] == 0.3) & (runs["weighting"].isin(["plain", "distribution"]))]
    betas = np.geomspace(1e-4, 3.0, 40)
    curves = pd.concat([pd.DataFrame({"weighting": w, "beta": betas, "predicted_use_fraction": (betas < 1).astype(float),
                                      "predicted_rate": 1.2 * (betas < 1)}) for w in ("plain", "distribution")])
    fig = PS.plot_rate_and_rho_vs_beta(runs, curves)
    fig.canvas.draw()
    ax = [a for a in fig.axes if a.get_xlabel() == "β"][0]
    lo, hi = ax.get_xlim()
    shown = sorted(float(t.get_text()) for t, v in zip(ax.get_xticklabels(), ax.get_xticks())
                   if t.get_text() and lo <= v <= hi)
    assert 0.3 in shown and {0.001, 0.01, 0.1, 1.0} <= set(shown) and len(shown) >= 4, shown
    assert not _minor_labels(ax.xaxis) and all("×" not in t.get_text() for t in ax.get_xticklabels())
    from zfree_lab.report.figstyle import decade_ticks

    assert decade_ticks([0.3], (0.05, 2.0)) == [0.1, 0.3, 1.0]  # 0.1 and 1 are 0.48 and 0.52 decades off
    assert decade_ticks([0.03, 0.3, 1.0], (1e-4, 3)) == [0.03, 0.3, 1.0]  # three of the data's own: as before
    assert decade_ticks([0.3], (0.2, 0.5)) == [0.3]  # within a decade: the data's values alone
    assert decade_ticks([0.12], (0.01, 1.5)) == [0.01, 0.12, 1.0]  # 0.1 is 0.08 decades from 0.12: left out


def test_legends_sit_outside_the_data():
    """Training-dynamics, rate/rho and effective-beta legends lie outside every axes' box."""
    df = pd.DataFrame({"step": [0, 5, 10], "loss/val/kl_prior_loss": [0.0, 0.2, 0.01],
                       "loss_contrib/fraction_abs/reconstruction_loss": [1.0, 0.9, 0.99]})
    for fig in (P.plot_training_curves({"a": df, "b": df}), PS.plot_rate_and_rho_vs_beta(_runs()),
                P.plot_effective_beta(_per_example()),
                PS.plot_loss_fractions(_runs().assign(**{"loss_contrib/fraction_abs/kl_prior_loss": 0.2}))):
        fig.canvas.draw()
        r = fig.canvas.get_renderer()
        legends = [*fig.legends, *(a.get_legend() for a in fig.axes if a.get_legend())]
        assert legends
        for lg in legends:
            box = lg.get_window_extent(r)
            for ax in fig.axes:
                assert not box.overlaps(ax.get_window_extent(r)), (lg, ax.get_title())


def test_phase_diagram_merges_row_labels_that_would_overprint():
    runs = _runs()
    runs = pd.concat([runs, runs[runs["weighting"] == "distribution"].assign(weighting="token",
                                                                           recon_weight=1 / C_BASE * 1.05)])
    assert [names for _, names in P._row_labels(runs)] == [["plain"], ["example"], ["distribution", "token"]]
    fig = P.plot_phase_diagram(runs, c_base=C_BASE)
    ticks = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert ticks == ["plain\nw = 1", "example\nw = 3", "distribution / token\nw = 4–4.2"]


def test_handover_gate_draws_one_line_per_run():
    traces = pd.DataFrame({"label": ["a", "a", "b"], "step": [0, 50, 0], "ratio": [1.2, 0.9, 1.1]})
    ax = PA.plot_handover_gate(traces).axes[0]
    runs = {ln.get_label(): ln for ln in ax.lines if not ln.get_label().startswith("_")}
    np.testing.assert_allclose(runs["a"].get_ydata(), [1.2, 0.9])
    assert any(np.allclose(ln.get_ydata(), 1.0) for ln in ax.lines)


def test_log_ticks_at_nearby_betas_are_thinned_so_labels_do_not_overprint():
    """Betas 0.0043 and 0.0045 (two weightings' β*/3 in the e2e preset) are 0.02 decades apart: one
    label each would overprint ("0.00445"); the thinned set keeps one of them and the far value."""
    from zfree_lab.report.figstyle import thin_log_ticks

    assert thin_log_ticks([0.0111, 0.0045, 0.0043]) == [0.0043, 0.0111]
    assert thin_log_ticks([0.03, 0.1, 0.3, 1.0]) == [0.03, 0.1, 0.3, 1.0]  # a sweep's betas: all kept
    assert thin_log_ticks([]) == []
    fig, ax = plt.subplots()
    ax.plot([0.0043, 0.0045, 0.0111], [1, 2, 3], "o")
    log_axis(ax, "x", [0.0043, 0.0045, 0.0111])
    fig.canvas.draw()
    assert [t.get_text() for t in ax.get_xticklabels() if t.get_text()] == ["0.0043", "0.0111"]
    plt.close(fig)


def test_a_log_axis_over_less_than_a_decade_labels_the_data():
    """β_eff from 2.6 to 4.5 (one weighting at one β): 1-2-5 ticks left the data with no label
    inside it; within a decade the ticks are 1-1.5-2-3-5-7."""
    fig, ax = plt.subplots()
    ax.plot([1, 2], [2.6, 4.5], "o")
    ax.axhline(1.0)
    log_axis(ax, "y")
    fig.canvas.draw()
    lo, hi = 2.6, 4.5
    inside = [float(t.get_text()) for t in ax.get_yticklabels() if t.get_text() and lo <= float(t.get_text()) <= hi]
    assert inside == [3.0], [t.get_text() for t in ax.get_yticklabels()]
    plt.close(fig)


def test_training_curves_name_the_collapse_marks_and_count_whole_steps():
    df = pd.DataFrame({"step": [0, 2, 4], "loss/val/kl_prior_loss": [0.2, 0.01, 0.01],
                       "loss/val/baseline_normalized_reconstruction_loss": [1.0, 0.99, 1.0]})
    fig = P.plot_training_curves({"run": df}, collapse_kl=0.05)
    fig.canvas.draw()
    texts = [t.get_text() for lg in fig.legends for t in lg.get_texts()]
    assert "KL = 0.05: collapsed below (KL panel)" in texts and "a run's first evaluation after step 0 below it (KL panel)" in texts
    ticks = [float(t.get_text().replace("−", "-")) for t in fig.axes[1].get_xticklabels() if t.get_text()]
    assert ticks and all(v == int(v) for v in ticks), ticks


def test_training_curves_leave_the_nmi_panel_out_without_strategies():
    """Real data (no strategy labels): no empty NMI panel is drawn (the notebook says why in one line)."""
    df = pd.DataFrame({"step": [0, 50], "loss/val/kl_prior_loss": [0.01, 0.02],
                       "loss/val/baseline_normalized_reconstruction_loss": [1.0, 0.99],
                       "structure/alignment_nmi": [None, None]})
    fig = P.plot_training_curves({"run": df})
    assert not fig.axes[3].get_visible() and all(a.get_visible() for a in fig.axes[:3])
    df["structure/alignment_nmi"] = [0.1, 0.2]
    fig = P.plot_training_curves({"run": df})
    assert fig.axes[3].get_visible()
    plt.close("all")


def test_rate_distortion_on_real_data_spans_the_data_and_lists_no_synthetic_optimum():
    """NaN Bayes rate (real text): no optimum drawn or in the legend; D axis near the points, not from 0."""
    runs = _runs().assign(distortion=lambda d: 73.0 + 0.01 * np.arange(len(d)), rate=0.01)
    links = pd.DataFrame({"run_id": runs["run_id"], "control_run_id": "c", "D_control": 73.2, "rate": runs["rate"],
                          "distortion": runs["distortion"], "weighting": runs["weighting"], "label": runs["run_id"]})
    fig = P.plot_rate_distortion(runs, z_free=73.5, bayes_rate=float("nan"), controls=links)
    ax = fig.axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert not any("optimum" in t or "Bayes" in t for t in labels) and any("control" in t for t in labels)
    lo, hi = ax.get_ylim()
    assert 72 < lo < 73 and 73.5 < hi < 75


def test_rate_distortion_draws_each_control_once_and_joins_it_to_its_own_runs():
    """Issue 35: two controls (D 51.23 for the unaided run, 35.13 for the aided one, which trained
    longer) were drawn as one "z-free control" at their mean 43.18."""
    from zfree_lab.report.gains_report import control_links

    runs = pd.DataFrame({"run_id": ["u", "a"], "weighting": ["distribution"] * 2, "aid": ["none", "hard_em_then_soft"],
                         "latent_kind": "discrete", "beta": [0.0043] * 2, "rate": [0.01, 0.04],
                         "distortion": [51.3, 37.5], "seed": 0})
    gains = pd.DataFrame({"run_id": ["u", "a"], "control_run_id": ["control_u", "control_a"],
                          "D_control": [51.23, 35.13]})
    links = control_links(runs, gains)
    assert links["control_run_id"].tolist() == ["control_u", "control_a"]
    assert links["label"].tolist() == ["distribution, β=0.0043", "distribution, hard_em_then_soft, β=0.0043"]
    ax = P.plot_rate_distortion(runs, z_free=52.0, bayes_rate=float("nan"), controls=links).axes[0]
    ctrl = {c.get_label(): c.get_offsets()[0] for c in _scatters(ax) if c.get_label().startswith("z-free control")}
    assert sorted(round(float(v[1]), 2) for v in ctrl.values()) == [35.13, 51.23]  # each control, no mean (43.18)
    assert {k.split(" (")[0] for k in ctrl} == {"z-free control C1", "z-free control C2"}
    assert any(k.startswith("z-free control C1") and k.endswith("of:\n  distribution, hard_em_then_soft, β=0.0043")
               for k in ctrl)  # C1: the lower D, the aided run's
    joins = {ln.get_gid(): (tuple(ln.get_xdata()), tuple(ln.get_ydata())) for ln in ax.lines
             if str(ln.get_gid()).startswith("control-link")}
    assert joins == {"control-link control_u u": ((0.0, 0.01), (51.23, 51.3)),
                     "control-link control_a a": ((0.0, 0.04), (35.13, 37.5))}
    one = P.plot_rate_distortion(runs, controls=links.assign(control_run_id="c", D_control=40.0)).axes[0]
    (label,) = [c.get_label() for c in _scatters(one) if c.get_label().startswith("z-free control")]
    assert label.startswith("z-free control (R = 0") and "C1" not in label
    assert control_links(runs, gains.iloc[:1])["run_id"].tolist() == ["u"]  # a run whose control is missing: no link
    plt.close("all")


def test_phase_diagram_is_drawn_per_variant_so_aided_and_unaided_cells_are_not_averaged():
    """The default study has aided and unaided runs at the same (beta, w): one diagram per aid,
    each cell the run's own value (an averaged cell showed a rate of 0.7 where one run had 1.4
    and the other 0)."""
    from zfree_lab.report.figstyle import variants

    runs = pd.concat([_runs(), _runs().assign(aid="hard_em_then_soft", kl_prior_loss=1.4,
                                              run_id=lambda d: d["run_id"] + "_aided")], ignore_index=True)
    parts = variants(runs)
    assert [label for label, _ in parts] == ["aid=none", "aid=hard_em_then_soft"]
    for label, rows in parts:
        fig = P.plot_phase_diagram(rows, c_base=C_BASE, variant=label)
        cells = _scatters(fig.axes[0])[0]
        np.testing.assert_allclose(np.sort(cells.get_array()), np.sort(rows["kl_prior_loss"].to_numpy()))
        assert label in fig._suptitle.get_text()
    assert variants(_runs())[0][0] == "" and len(variants(_runs())) == 1


def test_rate_panels_share_one_scale_from_zero():
    """A collapsed weighting (rates of 1e-4 nats) must not fill its panel as if z were used."""
    runs = _runs()
    runs.loc[runs["weighting"] == "plain", "kl_prior_loss"] = 1e-4
    fig = PS.plot_rate_and_rho_vs_beta(runs)
    tops = {round(ax.get_ylim()[1], 9) for ax in fig.axes[:3]}
    assert len(tops) == 1 and tops.pop() >= runs["kl_prior_loss"].max()
    assert all(ax.get_ylim()[0] <= 0 for ax in fig.axes[:3])


def test_rate_and_rho_vs_beta_tells_facets_apart_by_marker_when_a_run_draws_no_line():
    """One beta per run draws no line, so the facet's line style alone is invisible: each facet
    gets its own marker, named in the legend."""
    runs = pd.concat([_runs(), _runs().assign(aid="hard_em_then_soft")], ignore_index=True)
    runs = runs[runs["beta"] == 0.3]
    fig = PS.plot_rate_and_rho_vs_beta(runs)
    markers = {ln.get_marker() for ln in fig.axes[0].lines}
    assert markers == {"o", "^"}
    legend = {t.get_text(): h.get_marker() for t, h in zip(fig.legends[0].get_texts(), fig.legends[0].legend_handles)}
    assert legend["no aid"] != legend["hard_em_then_soft"]


def test_rate_distortion_labels_each_place_once():
    """Runs that sit on one point (the default study's three aided runs at beta 0.3) get one beta
    label there, not three printed over each other; distinct betas at one place are listed."""
    rows = [{"weighting": w, "latent_kind": "discrete", "aid": "hard_em_then_soft", "beta": 0.3, "rate": 1.41 + d,
             "distortion": 0.06 + d} for w, d in (("distribution", 0.0), ("example", 0.001), ("token", 0.002))]
    rows += [{"weighting": "plain", "latent_kind": "discrete", "aid": "hard_em_then_soft", "beta": 1.0, "rate": 0.0,
              "distortion": 1.49}, {"weighting": "plain", "latent_kind": "discrete", "aid": "none", "beta": 0.03,
                                    "rate": 0.0, "distortion": 1.491}]
    fig = P.plot_rate_distortion(pd.DataFrame(rows))
    labels = sorted(t.get_text() for t in fig.axes[0].texts)
    # the markers there hide each other: the label names whose they are (their shared aid once)
    assert labels == ["β=0.03: plain, no aid\nβ=1: plain, hard_em_then_soft",
                      "β=0.3: distribution, example,\n    token (hard_em_then_soft)"], labels  # wrapped between names


def test_rate_distortion_labels_close_together_are_stacked_not_overprinted():
    """Runs at separate places a few pixels apart (a collapsed study: every run near the z-free
    point) get one label each, moved apart on the drawn figure, each in its run's color."""
    from zfree_lab.report.figstyle import label_box

    rows = [{"weighting": w, "latent_kind": "discrete", "aid": "none", "beta": b, "rate": r, "distortion": d}
            for w, b, r, d in (("plain", 0.01, 0.0, 78.0), ("example", 0.02, 0.06, 78.15), ("token", 0.03, 0.12, 78.3),
                               ("plain", 1.0, 1.0, 70.0))]
    fig = P.plot_rate_distortion(pd.DataFrame(rows), z_free=78.0)
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    boxes = {t.get_text(): label_box(t, renderer) for t in ax.texts}  # the text, without its line
    assert set(boxes) == {"β=0.01", "β=1", "β=0.02", "β=0.03"}, set(boxes)
    names = sorted(boxes)
    assert not any(boxes[a].overlaps(boxes[b]) for i, a in enumerate(names) for b in names[i + 1:]), boxes
    moved = [t for t in ax.texts if t.xyann[1] > 8]
    assert moved and all(t.arrow_patch.get_visible() for t in moved)  # a moved label keeps a line to its point
    assert {t.get_text(): t.get_color() for t in ax.texts}["β=0.02"] == RD.color_of("example")
    runs_z = {ln.get_zorder() for ln in ax.lines if ln.get_label() in ("plain", "example", "token")}
    star = [c for c in ax.collections if c.get_label().startswith("z-free")][0]
    assert min(runs_z) > star.get_zorder()  # a run on the z-free point is drawn over it, not hidden


def test_rate_distortion_one_label_per_pile_whatever_the_order():
    """Markers that touch, chained (a collapsed study's runs piled at R = 0), share one label, the
    same whichever run comes first; the groups drawn at the same betas are named on one line."""
    pts = [(0.0, 1.40 + 0.01 * i, b, g, "k") for i, (b, g) in enumerate(
        [(0.01, "plain, no aid"), (0.1, "plain, no aid"), (0.01, "token, no aid"), (0.1, "token, no aid"),
         (1.0, "plain, aided")])]
    pts.append((1.4, 0.05, 0.3, "plain, no aid", "k"))
    for order in (pts, pts[::-1]):
        labels = sorted(text for text, _ in RD._label_clusters(order, (1.5, 1.6)).values())
        assert labels == ["β=0.01, 0.1: plain, token (no aid)\nβ=1: plain, aided", "β=0.3"], labels


def test_rate_distortion_label_lines_break_between_names():
    text = RD._wrap_items("β=0.01, 0.03, 0.1, 0.3, 1:", ["distribution, hard_em_then_soft", "distribution, no aid",
                                                         "example, hard_em_then_soft", "plain, no aid"], 44)
    assert text == ("β=0.01, 0.03, 0.1, 0.3, 1:\n    distribution, hard_em_then_soft;\n    distribution, no aid;"
                    "\n    example, hard_em_then_soft;\n    plain, no aid")  # names holding a comma: "; " between them
    assert RD._wrap_items("β=0.3:", ["plain, no aid"], 44) == "β=0.3: plain, no aid"
    assert RD._wrap_items("β=0.3:", ["plain", "token (no aid)"], 44) == "β=0.3: plain, token (no aid)"


def test_group_labels_read_as_words_not_the_aid_none():
    """The reviewer's "distribution none" (gains and ρ figures): the aid "none" reads "no aid", facets
    are joined by ", ", and where no run has an aid the label is the weighting alone; colors and line
    styles are as before (the weighting's color; the facet's line style)."""
    from zfree_lab.report.figstyle import WEIGHTING_COLORS, groups

    df = pd.DataFrame({"weighting": ["distribution", "distribution", "plain"], "latent_kind": "discrete",
                       "aid": ["none", "hard_em_then_soft", "none"], "beta": [0.1, 0.1, 0.3]})
    got = [(label, color, ls) for label, color, ls, _ in groups(df)]
    assert got == [("distribution, no aid", WEIGHTING_COLORS["distribution"], "-"),
                   ("distribution, hard_em_then_soft", WEIGHTING_COLORS["distribution"], "--"),
                   ("plain, no aid", WEIGHTING_COLORS["plain"], "-")]
    assert [label for label, *_ in groups(df[df["aid"] == "none"])] == ["distribution", "plain"]
    aided = [label for label, *_ in groups(df[df["aid"] != "none"])]
    assert aided == ["distribution, hard_em_then_soft"]  # an aid every run shares is still named
    fig = P.plot_rho_distributions(_per_example().assign(aid="none").pipe(
        lambda pe: pd.concat([pe, pe.assign(aid="hard_em_then_soft")], ignore_index=True)))
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible() and ax.get_title()]
    assert titles and not [t for t in titles if "none" in t.split(", ")[-1:]] and any("no aid" in t for t in titles)


def test_rate_distortion_many_labels_near_the_origin_stay_apart_inside_the_axes():
    """Ten piles of three runs a few pixels apart at R = 0 (a collapsed study): each pile's label is
    placed apart from every other label, every marker and the legend, within the axes' height (not
    over the title) and the figure, a moved one joined to its pile by a line."""
    from zfree_lab.report.figstyle import label_box

    rows = [{"weighting": w, "latent_kind": "discrete", "aid": "none", "beta": k * (i + 1), "rate": 0.0,
             "distortion": 10 + 0.6 * i} for i in range(10) for w, k in (("plain", 0.01), ("distribution", 0.02),
                                                                         ("example", 0.03))]
    rows.append({"weighting": "plain", "latent_kind": "discrete", "aid": "none", "beta": 5.0, "rate": 3.0,
                 "distortion": 0.0})
    fig = P.plot_rate_distortion(pd.DataFrame(rows), z_free=12.0)
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    boxes = [label_box(t, renderer) for t in ax.texts]
    assert len(boxes) == 11 and sum(t.get_text().count("\n") == 2 for t in ax.texts) == 10
    assert not [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:] if a.overlaps(b)]
    frame, legend = ax.get_window_extent(renderer), ax.get_legend().get_window_extent(renderer)
    assert all(frame.y0 <= b.y0 and b.y1 <= frame.y1 and frame.x0 <= b.x0 and b.x1 <= fig.bbox.x1 for b in boxes)
    assert not [b for b in boxes if b.overlaps(legend)]
    px = fig.dpi / 72
    markers = [type(boxes[0]).from_bounds(x - 3 * px, y - 3 * px, 6 * px, 6 * px)
               for x, y in (ax.transData.transform((r["rate"], r["distortion"])) for r in rows)]
    assert not [b for b in boxes for m in markers if b.overlaps(m)]
    assert all(t.arrow_patch.get_visible() for t in ax.texts if np.hypot(t.xyann[0] - 4, t.xyann[1] - 3) > 5)


def test_rate_distortion_controls_piled_at_one_place_share_one_tag():
    """Controls whose Xs pile up at R = 0 (a study's eight controls within a few pixels) get one tag
    per pile, not C1 ... C8 printed over each other and over the D axis' tick labels."""
    tags = [(1.40, "C1"), (1.41, "C2"), (1.42, "C3"), (1.60, "C4"), (1.61, "C5"), (1.90, "C6")]
    assert RD._control_tags(tags, span_d=1.0) == {1.41: "C1–C3", 1.61: "C4, C5", 1.90: "C6"}
    runs = pd.DataFrame({"run_id": list("abcd"), "weighting": "plain", "aid": "none", "latent_kind": "discrete",
                         "beta": [0.01, 0.1, 1.0, 3.0], "rate": [0.0, 0.0, 0.0, 1.2], "distortion": [1.4, 1.41, 1.42, 0.1]})
    links = runs.assign(control_run_id=[f"c{i}" for i in range(4)], D_control=[1.401, 1.405, 1.41, 1.43], label=runs["run_id"])
    ax = P.plot_rate_distortion(runs, controls=links).axes[0]
    assert sorted(t.get_text() for t in ax.texts if t.get_text().startswith("C")) == ["C1–C4"]
    plt.close("all")


def test_rate_and_rho_vs_beta_says_shaded_only_where_it_shades_and_what_the_rule_counts():
    """Without a predicted curve (real data: no Bayes loss per row) nothing is shaded, so the title
    must not say so; with one, the shading counts the base model's excess over the Bayes loss
    (docs/concepts/theory.md), so neither it nor the predicted-use axis may read a bare "β_eff < 1":
    the smoke study shaded β up to ~1 and put predicted use at 98 % with every row at β_eff ≥ 1.2."""
    runs = _runs()
    assert "shaded" not in PS.plot_rate_and_rho_vs_beta(runs)._suptitle.get_text()
    curves = pd.DataFrame({"weighting": "plain", "beta": [0.1, 1.0, 10.0], "predicted_use_fraction": [1.0, 1.0, 0.0],
                           "predicted_rate": [1.0, 1.0, 0.0]})
    title = PS.plot_rate_and_rho_vs_beta(runs, curves)._suptitle.get_text()
    assert "shaded" in title and "excess" in title and "β_eff < 1)" not in title
    assert "β_eff < 1)" not in PS.plot_predicted_vs_measured(runs).axes[0].get_xlabel()


def test_phase_diagram_names_its_boundary_by_what_it_is_drawn_from():
    """The solid line is β*/w from the predicted use, which counts the base model's excess over the
    Bayes loss: in the smoke study it ran through plain β* = 1.16 at |S| of 4 to 7, far from
    β·|S|/w = 1, the label it carried."""
    fig = P.plot_phase_diagram(_runs(), c_base=C_BASE, beta_over_w=0.1)
    (label,) = {ln.get_label() for ln in fig.axes[0].lines if ln.get_label().startswith("predicted boundary")}
    assert "= 1" not in label and "half of the rows" in label


def test_training_curves_that_coincide_stay_both_visible():
    """A new user's smoke report: plain and distribution weighting drew the same curves (as a relabelled β
    does under Adam) in the same marker, so one hid the other. Each run now has its own marker, in the legend too."""
    df = pd.DataFrame({"step": [0, 4, 8], "loss/val/kl_prior_loss": [0.1, 0.05, 0.01],
                       "loss/val/baseline_normalized_reconstruction_loss": [1.0, 0.99, 0.98],
                       "loss_contrib/fraction_abs/reconstruction_loss": [0.9, 0.95, 0.99]})
    fig = P.plot_training_curves({"plain": df, "distribution": df.copy()})
    for ax in fig.axes[:3]:
        assert {ln.get_marker() for ln in ax.lines if ln.get_marker() != "None"} == {".", "x"}
    legend = {t.get_text(): h.get_marker() for t, h in zip(fig.legends[0].get_texts(), fig.legends[0].legend_handles)}
    assert legend["plain"] != legend["distribution"]
