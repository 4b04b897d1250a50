"""The report's seed-level section (zfree_lab.report.seed_report): "1 seed" where a cell has one, the
t-interval over seeds where it has several."""

from __future__ import annotations

import numpy as np
import pandas as pd

from zfree_lab.report.seed_report import seed_gains_frame, seed_gains_markdown


def _row(n, **kw):
    base = {"weighting": "distribution", "beta": 0.3, "aid": "hard_em_then_soft", "remedy": "none", "n_seeds": n,
            "seeds": " ".join(map(str, range(n)))}
    for q in ("z_gain", "net_gain", "use_shuffled", "gain_minus_rate"):
        base.update({q: 1.0, f"{q}_t_lo": np.nan if n < 2 else 0.5, f"{q}_t_hi": np.nan if n < 2 else 1.5,
                     f"{q}_p": np.nan if n < 2 else 0.01, f"{q}_boot_lo": np.nan if n < 2 else 0.6,
                     f"{q}_boot_hi": np.nan if n < 2 else 1.4})
    base["net_gain_tost_p"] = np.nan if n < 2 else 0.9
    return {**base, **kw}


def test_one_seed_says_so_and_shows_no_interval_over_seeds():
    tab = pd.DataFrame([_row(1)])
    md = seed_gains_markdown(tab)
    assert "**1 seed**" in md and "no interval over seeds" in md
    frame = seed_gains_frame(tab)
    assert frame.iloc[0]["seeds"] == "1 seed (0)"
    assert frame.iloc[0]["z gain (D) [nats/ex], t 95% CI over seeds"] == "1 (1 seed)"  # no dash: no interval
    assert frame.iloc[0]["z gain (D): two-stage bootstrap"] == "1 seed"
    tiny = seed_gains_frame(pd.DataFrame([_row(1, z_gain=5.9612345e-06)]))
    assert tiny.iloc[0]["z gain (D) [nats/ex], t 95% CI over seeds"] == "5.96e-06 (1 seed)"


def test_the_table_is_indexed_by_its_cell_not_a_row_number():
    """The reviewer's raw 0/1 first column: the cell (weighting, beta, aid, remedy) is the index."""
    frame = seed_gains_frame(pd.DataFrame([_row(1), _row(3, beta=1.0)]))
    assert list(frame.index.names) == ["weighting", "beta", "aid", "remedy"]
    assert list(frame.index) == [("distribution", 0.3, "hard_em_then_soft", "none"),
                                 ("distribution", 1.0, "hard_em_then_soft", "none")]
    assert "weighting" not in frame.columns and frame.columns[0] == "seeds"


def test_three_seeds_show_the_t_interval_and_the_test():
    tab = pd.DataFrame([_row(3, z_gain_t_lo=0.2, z_gain_t_hi=1.8)])
    md = seed_gains_markdown(tab)
    assert "3 seeds: z gain 1 [0.2, 1.8] (t over seeds, above 0; one-sided p 0.01)" in md
    assert "not shown equivalent to 0 within ±0.25 (TOST p 0.9)" in md  # a large TOST p shows nothing
    equivalent = seed_gains_markdown(pd.DataFrame([_row(3, net_gain_tost_p=0.01, net_gain_p=0.3)]))
    assert "(one-sided p 0.3), equivalent to 0 within ±0.25 (TOST p 0.01)" in equivalent
    frame = seed_gains_frame(tab)
    assert frame.iloc[0]["seeds"] == "3 seeds (0 1 2)"
    assert frame.iloc[0]["z gain (D): two-stage bootstrap"] == "[0.6, 1.4]"
    assert frame.iloc[0]["z gain (D) [nats/ex], t 95% CI over seeds"] == "1 [0.2, 1.8]"


def test_the_section_over_seeds_is_one_line_where_every_cell_has_one_seed():
    """A study at one seed showed a table of "1 seed" cells under "Over seeds": a section that does not apply
    is one line saying why; with a cell of several seeds the lines and the table are shown."""
    from zfree_lab.report.seed_report import seed_section

    md, frame = seed_section(pd.DataFrame([_row(1), _row(1, weighting="plain")]))
    assert frame is None and "every cell has **1 seed**" in md and "--seeds 0-2" in md and "\n- " not in md
    md, frame = seed_section(pd.DataFrame([_row(1), _row(3, weighting="plain")]))
    assert frame is not None and len(frame) == 2 and "**1 seed**" in md and "3 seeds" in md
    assert seed_section(None) is None and seed_section(pd.DataFrame([_row(1)]).iloc[:0]) is None
