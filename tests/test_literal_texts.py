"""Every string from data reaches matplotlib as literal text (issue 34 item 5): run, weighting, aid,
remedy, data set, label and oracle names and label values that hold ``$`` are drawn as the characters
they are in every report figure, never as mathtext ("$x_$" stopped the report with a
ParseSyntaxException, "$\\frac{a}{b}$" was typeset as a fraction). Each figure is drawn from small
hand-made tables with such names and saved to PNG (so its text is laid out); then every Text of the
figure is read back as matplotlib draws it (``Text._preprocess_math``)."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from zfree_lab.report import plotting as P  # noqa: E402
from zfree_lab.report import plotting_aids as PA  # noqa: E402
from zfree_lab.report import plotting_study as PS  # noqa: E402

#: names a study can hold: invalid mathtext, valid mathtext, a ``\$`` already escaped, and characters
#: that are special elsewhere (paths, % formats, str.format); no spaces (figures split group labels on them)
HOSTILE = ["$x_$", r"$\alpha^$", r"$\frac{a}{b}$", r"a\$b$", "a/b", "50%", "{braces}"]


def _runs(names=HOSTILE) -> pd.DataFrame:
    """One run per (name as weighting, beta), weightings on rows of w a factor 2 apart."""
    return pd.DataFrame([{"run_id": f"r{i}_{beta}", "weighting": w, "latent_kind": "discrete", "aid": "none",
                          "beta": beta, "recon_weight": 2.0 ** i, "kl_prior_loss": 0.1 * (i + 1) / beta,
                          "baseline_normalized_reconstruction_loss": 0.9, "alignment_nmi": 0.5,
                          "rate": 0.1 * (i + 1) / beta, "distortion": 10.0 - i - beta, "seed": 0,
                          "oracle_rho": 0.8, "predicted_use_fraction": 0.1 * i, "measured_use_fraction": 0.05 * i,
                          "loss_contrib/fraction_abs/reconstruction_loss": 0.99,
                          "loss_contrib/fraction_abs/kl_prior_loss": 0.01}
                         for i, w in enumerate(names) for beta in (0.1, 1.0)])


def _per_example(names=HOSTILE) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    n = 6
    return pd.concat([pd.DataFrame({"weighting": w, "latent_kind": "discrete", "aid": "none", "beta": beta,
                                    "b": rng.uniform(0.5, 2, n), "lbar": rng.uniform(0.5, 2, n),
                                    "rho_i": rng.uniform(0.8, 1.1, n), "n_tokens": rng.integers(4, 12, n),
                                    "beta_eff": rng.uniform(0.1, 5, n), "kl": rng.uniform(0, 1, n)})
                      for w in names for beta in (0.1, 1.0)], ignore_index=True)


def _metrics() -> pd.DataFrame:
    return pd.DataFrame({"step": [0, 5, 10], "loss/val/kl_prior_loss": [0.3, 0.2, 0.01],
                         "loss/val/baseline_normalized_reconstruction_loss": [1.0, 0.99, 1.0],
                         "structure/alignment_nmi": [0.1, 0.3, 0.0], "loss/train/reconstruction_loss": [2.0, 1.5, 1.4],
                         "loss_contrib/fraction_abs/reconstruction_loss": [1.0, 0.9, 0.99]})


def _training_curves():
    return P.plot_training_curves({n: _metrics() for n in HOSTILE})


def _train_distortion():
    return PA.plot_train_distortion({n: _metrics() for n in HOSTILE})


def _handover_gate():
    return PA.plot_handover_gate(pd.DataFrame({"label": np.repeat(HOSTILE, 2), "step": [0, 50] * len(HOSTILE),
                                               "ratio": np.linspace(1.2, 0.8, 2 * len(HOSTILE))}))


def _phase_diagram():
    return P.plot_phase_diagram(_runs(), c_base=0.25, critical_betas={HOSTILE[0]: 0.05}, variant=HOSTILE[1])


def _rate_distortion():
    runs = _runs()
    controls = runs.assign(control_run_id=[f"c{i % 3}" for i in range(len(runs))],
                           D_control=[12.0 + i % 3 for i in range(len(runs))],
                           label=[HOSTILE[i % len(HOSTILE)] for i in range(len(runs))])
    return P.plot_rate_distortion(runs, z_free=12.5, controls=controls)


def _effective_beta():
    return P.plot_effective_beta(_per_example(), eta=0.3)


def _rho_distributions():
    return P.plot_rho_distributions(_per_example())


def _rate_and_rho_vs_beta():
    runs = _runs(HOSTILE[:2])
    runs = pd.concat([runs.assign(aid=a) for a in HOSTILE[2:]], ignore_index=True)  # aids: the legend's tags
    return PS.plot_rate_and_rho_vs_beta(runs)


def _loss_fractions():
    return PS.plot_loss_fractions(_runs())


def _predicted_vs_measured():
    return PS.plot_predicted_vs_measured(_runs())


def _gains():
    runs = _runs().assign(z_gain=0.2, z_gain_lo=0.1, z_gain_hi=0.3)
    oracles = pd.DataFrame([{"label": n, "H": 1.0 + i, "H_lo": 0.9 + i, "H_hi": 1.1 + i, "delta_R": 0.5,
                             "delta_R_lo": 0.4, "delta_R_hi": 0.6, "distinguishable": i % 2 == 0}
                            for i, n in enumerate(HOSTILE)])
    return PS.plot_gains(runs, oracles, eta=0.3)


def _leaderboard():
    board = pd.DataFrame([{"remedy": n, "weighting": HOSTILE[-1 - i], "dataset": HOSTILE[i % 2], "side": side,
                           "rate": 0.1 * (i + 1), "rate_lo": 0.05, "rate_hi": 0.2 * (i + 1), "z_gain": 0.1,
                           "z_gain_lo": 0.0, "z_gain_hi": 0.2}
                          for i, n in enumerate(HOSTILE) for side in ("inside", "outside")])
    return PS.plot_leaderboard(board)


def _label_confusion():
    """``label_confusion``'s shape: rows latent value, columns the label's values, named by the label key."""
    table = pd.DataFrame(np.arange(3 * len(HOSTILE)).reshape(3, -1) % 4, index=pd.Index([0, 1, 2], name="latent value"),
                         columns=pd.Index(HOSTILE, name=HOSTILE[2]))
    return PS.plot_label_confusion(table)


def _phase_boundary():
    runs = _runs(HOSTILE[:3]).assign(aid=HOSTILE[3])
    boundary = pd.DataFrame([{"weighting": w, "aid": HOSTILE[3], "beta_half_measured": 0.2, "beta_half_predicted": 0.1,
                              "ratio": 2.0} for w in HOSTILE[:3]])
    return PA.plot_phase_boundary(runs, None, boundary)


def _use_by_length():
    return PA.plot_use_by_length(pd.DataFrame({"n_tokens": [5, 9] * len(HOSTILE), "measured_use": 0.5, "predicted_use": 0.4,
                                               "beta": 0.3, "aid": np.repeat(HOSTILE, 2)}))


#: each report figure that draws names from data -> (how to draw it, the names it must show)
FIGURES = {"training_curves": (_training_curves, HOSTILE), "train_distortion": (_train_distortion, HOSTILE),
           "handover_gate": (_handover_gate, HOSTILE), "phase_diagram": (_phase_diagram, HOSTILE),
           "rate_distortion": (_rate_distortion, HOSTILE), "effective_beta": (_effective_beta, HOSTILE),
           "rho_distributions": (_rho_distributions, HOSTILE), "rate_and_rho_vs_beta": (_rate_and_rho_vs_beta, HOSTILE),
           "loss_fractions": (_loss_fractions, HOSTILE), "predicted_vs_measured": (_predicted_vs_measured, HOSTILE),
           "gains": (_gains, HOSTILE), "leaderboard": (_leaderboard, HOSTILE),
           "label_confusion": (_label_confusion, HOSTILE), "phase_boundary": (_phase_boundary, HOSTILE[:4]),
           "use_by_length": (_use_by_length, HOSTILE)}


def drawn_texts(fig) -> list[tuple[str, bool]]:
    """(the characters matplotlib draws, whether as mathtext) of every visible Text of ``fig``."""
    return [t._preprocess_math(t.get_text())[:2] for t in fig.findobj(Text) if t.get_visible() and t.get_text()]


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


@pytest.mark.parametrize("name", list(FIGURES))
def test_names_from_data_are_drawn_as_the_characters_they_are(name):
    draw, names = FIGURES[name]
    fig = draw()
    fig.savefig(io.BytesIO(), format="png", dpi=30)  # lays the text out: invalid mathtext raised here
    drawn = drawn_texts(fig)
    missing = [n for n in names if not any(n in s for s, math in drawn if not math)]
    assert not missing, f"{name}: not drawn literally: {missing}"
    as_math = [s for s, math in drawn if math and any(n in s for n in HOSTILE)]
    assert not as_math, f"{name}: drawn as mathtext: {as_math}"


def test_literal_escapes_every_dollar_and_matplotlib_draws_back_the_string():
    from zfree_lab.report.figstyle import literal

    t = Text()
    for s in [*HOSTILE, "plain", "\\", "\\\\$", "$$", ""]:
        assert t._preprocess_math(literal(s)) == (s, False)
    assert literal(3) == "3" and literal("no dollar") == "no dollar"
