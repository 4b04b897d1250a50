"""zfree_lab.report.plotting_aids: the switch-on figures drawn headless (matplotlib Agg) from small
hand-made tables, checked by their artists: one panel per weighting, one line per group and
prediction, the predicted and measured half-plateau betas, the gate's threshold line and labels."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from zfree_lab.report.plotting_aids import plot_handover_gate, plot_phase_boundary, plot_use_by_length  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _render(fig) -> None:
    fig.canvas.draw()  # every artist actually renders
    assert fig.canvas.buffer_rgba() is not None


def _runs() -> pd.DataFrame:
    betas = [0.1, 0.3, 1.0, 3.0]
    rows = [{"weighting": w, "beta": b, "kl_prior_loss": r / (1 + b), "aid": aid}
            for w in ("plain", "distribution") for aid, r in (("none", 2.0), ("hard_em_then_soft", 2.5)) for b in betas]
    return pd.DataFrame(rows)


def test_phase_boundary_panels_lines_and_markers():
    runs = _runs()
    curves = pd.DataFrame({"weighting": ["plain"] * 5, "beta": [0.01, 0.1, 1.0, 3.0, 100.0],
                           "predicted_rate": [2.0, 1.8, 1.0, 0.5, 0.0]})
    boundary = pd.DataFrame({"weighting": ["plain", "distribution"], "aid": ["none", "none"],
                             "beta_half_measured": [1.0, np.nan], "beta_half_predicted": [0.8, 0.5],
                             "ratio": [1.25, np.nan]})
    fig = plot_phase_boundary(runs, curves, boundary)
    _render(fig)
    axes = fig.axes
    assert [ax.get_title() for ax in axes] == ["plain", "distribution"]
    assert all(ax.get_xscale() == "log" and ax.get_xlabel() == "β" and ax.get_ylabel().startswith("rate KL")
               for ax in axes)
    plain, dist = axes
    labels = [line.get_label() for line in plain.get_lines()]
    assert "measured plain, no aid" in labels and "measured plain, hard_em_then_soft" in labels
    assert "predicted rate" in labels and "predicted rate" not in [line.get_label() for line in dist.get_lines()]
    pred = next(line for line in plain.get_lines() if line.get_label() == "predicted rate")
    assert list(pred.get_xdata()) == [0.1, 1.0, 3.0]  # clipped to [min beta / 3, max beta * 3]
    assert any(line.get_label().startswith("measured β½ 1 (no aid; 1.25× predicted)") for line in plain.get_lines())
    assert len(plain.patches) == 1 and len(dist.patches) == 1  # the ±25% band around each prediction
    assert not any(line.get_label().startswith("measured β½") for line in dist.get_lines())  # NaN: not drawn
    measured = next(line for line in plain.get_lines() if line.get_label() == "measured plain, no aid")
    np.testing.assert_allclose(measured.get_ydata(), 2.0 / (1 + np.array([0.1, 0.3, 1.0, 3.0])))
    assert fig._suptitle.get_text().startswith("Phase boundary")


def test_phase_boundary_without_curves_or_boundary_rows():
    fig = plot_phase_boundary(_runs(), None, pd.DataFrame(columns=["weighting", "aid", "beta_half_measured",
                                                                   "beta_half_predicted", "ratio"]))
    _render(fig)
    assert [ax.get_title() for ax in fig.axes] == ["plain", "distribution"]  # the runs' weightings
    assert all("predicted rate" not in [line.get_label() for line in ax.get_lines()] for ax in fig.axes)


def test_use_by_length_one_predicted_line_per_beta():
    rows = [{"n_tokens": n, "measured_use": min(1.0, b * n / 6), "predicted_use": float(b * n > 3), "beta": b, "aid": aid}
            for b in (0.5, 1.0) for aid in ("none", "beta0_warmup") for n in (6, 2, 4)]
    fig = plot_use_by_length(pd.DataFrame(rows))
    _render(fig)
    (ax,) = fig.axes
    labels = [line.get_label() for line in ax.get_lines()]
    # "no aid", not the column's "none": "β=0.3 none measured" read as "nothing measured" (the smoke study)
    assert labels == ["β=0.5 no aid, measured", "β=0.5 predicted", "β=0.5 beta0_warmup, measured",
                      "β=1 no aid, measured", "β=1 predicted", "β=1 beta0_warmup, measured"]
    assert list(ax.get_lines()[0].get_xdata()) == [2, 4, 6]  # sorted by |S|
    assert ax.get_ylim() == (-0.05, 1.05) and ax.get_xlabel().startswith("|S|")
    assert ax.get_lines()[1].get_linestyle() == "--"


def test_handover_gate_lines_threshold_and_log_scale():
    traces = pd.DataFrame({"label": ["a"] * 3 + ["b"] * 3, "step": [0, 2, 4] * 2,
                           "ratio": [1.2, 1.0, 0.9, 1.1, 1.05, 1.0]})
    fig = plot_handover_gate(traces)
    _render(fig)
    (ax,) = fig.axes
    assert [line.get_label() for line in ax.get_lines()][:2] == ["a", "b"]
    assert any(list(line.get_ydata()) == [1.0, 1.0] for line in ax.get_lines())  # the gate at 1
    assert ax.get_yscale() == "linear" and ax.get_xlabel() == "step (hard phase)"
    far = traces.assign(ratio=[40.0, 20.0, 10.0, 1.1, 1.0, 0.9])  # max / min > 4: log scale
    assert plot_handover_gate(far).axes[0].get_yscale() == "log"


def test_figures_leave_the_callers_rcparams_alone():
    before = dict(plt.rcParams)
    plot_handover_gate(pd.DataFrame({"label": ["a"], "step": [0], "ratio": [1.0]}))
    assert plt.rcParams["axes.spines.top"] == before["axes.spines.top"]


def test_train_distortion_counts_whole_steps_and_dots_every_oracle():
    """The smoke study's curve (window means at steps 10 and 12) ticked steps 10.25, 10.5, …; its null
    oracle was drawn solid like a CVAE run although the report says label oracles are dotted."""
    from zfree_lab.report.plotting_aids import plot_train_distortion

    key = "loss/train/reconstruction_loss"
    curves = {n: pd.DataFrame({"step": [10, 12], key: [1.51, 1.45]})
              for n in ("control_plain_5e966e6c", "plain_beta0.3_d4b49546", "oracle-strategy_plain_c5bf1793",
                        "null-strategy_plain_1f41e815")}
    fig = plot_train_distortion(curves)
    _render(fig)
    (ax,) = fig.axes
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    styles = {ln.get_label(): ln.get_linestyle() for ln in ax.get_lines()}
    assert styles == {"control_plain_5e966e6c": "--", "plain_beta0.3_d4b49546": "-",
                      "oracle-strategy_plain_c5bf1793": ":", "null-strategy_plain_1f41e815": ":"}


def test_train_distortion_of_one_window_per_run_draws_points_and_says_why_there_is_no_curve():
    """An own-data smoke study (4 steps: one window mean per run) drew axes and a six-run legend with nothing on
    them: a line of one point draws no pixel. Each run is now a marker, and the axes say there is no curve yet."""
    from zfree_lab.report.plotting_aids import plot_train_distortion

    key = "loss/train/reconstruction_loss"
    one = {n: pd.DataFrame({"step": [4], key: [v]}) for n, v in (("control_a", 2.1), ("plain_b", 2.0))}
    fig = plot_train_distortion(one)
    _render(fig)
    (ax,) = fig.axes
    assert [ln.get_marker() for ln in ax.get_lines()] == ["o", "o"]
    assert any("one window mean" in t.get_text() for t in ax.texts)
    many = {"plain_b": pd.DataFrame({"step": [10, 20, 30], key: [2.0, 1.9, 1.8]}),
            "control_a": pd.DataFrame({"step": [10], key: [2.1]})}
    fig = plot_train_distortion(many)
    (ax,) = fig.axes
    assert {ln.get_label(): ln.get_marker() for ln in ax.get_lines()} == {"plain_b": "None", "control_a": "o"}
    assert not ax.texts
