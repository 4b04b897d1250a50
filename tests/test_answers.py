"""The report's "In short" (zfree_lab.report.answers): the study's four questions answered at the top, from the
verdict and oracle tables the sections below show."""

from __future__ import annotations

import numpy as np
import pandas as pd

from zfree_lab.report.answers import answers_markdown
from zfree_lab.report.report import md_code as c


def _verdicts(on, better, used=None):
    n = len(on)
    return pd.DataFrame({"run": [f"run{i}" for i in range(n)], "z switched on": on, "better model": better,
                         "use in the model [nats/ex]": [0.5] * n,
                         "z used": used if used is not None else on})


def _oracles(lo):
    return pd.DataFrame({"label": ["n_sentences"], "delta_R": [0.7], "delta_R_lo": [lo], "delta_R_hi": [0.9],
                         "H": [1.05], "eta": [0.67], "eta_lo": [0.5], "eta_hi": [0.8], "rows": [300],
                         "distinguishable": [lo > 0]})


def test_the_answers_name_the_runs_that_switched_z_on_and_paid_for_it():
    md = answers_markdown(_verdicts([True, True, False], [True, False, False]), _oracles(0.5), seeds=1)
    assert md.startswith("## In short\n")
    assert "**Did z switch on?** In 2 of 3 runs" in md and f"{c('run0')}, {c('run1')}." in md
    assert "**A better model of y given x than its z-free control?** In 1 of 3 runs" in md
    assert f"**Which remedy did it?** {c('run0')}: z switched on *and*" in md
    assert f"{c('n_sentences')} would lower D by ΔR = 0.700 nats/example [0.500, 0.900]" in md
    assert "1 seed: every interval here is over the evaluated rows" in md


def test_no_run_that_did_it_says_none_and_where_z_was_on_without_paying():
    md = answers_markdown(_verdicts([False, True], [np.nan, False]), _oracles(-0.1), seeds=3)
    assert "In 1 of 2 runs" in md and "In 0 of 2 runs" in md
    assert ("none: no run switched z on and modelled y given x better than its control (z switched on without "
            f"paying for its rate in {c('run1')}).") in md
    assert "no label's oracle lowers D measurably" in md and "3 seeds: the lines above count runs" in md


def test_an_older_study_without_readouts_answers_by_the_gain_rule_and_many_runs_are_cut_short():
    v = _verdicts([np.nan] * 6, [np.nan] * 6, used=[True] * 6).assign(**{"use in the model [nats/ex]": np.nan})
    md = answers_markdown(v, None, seeds=1)
    assert "In 6 of 6 runs (measured use and a z-gain interval above 0" in md and "and 2 more." in md
    assert "Which remedy" not in md and "no label oracle in this study" in md
    assert answers_markdown(v.iloc[:0], None, seeds=1) == ""


def test_a_smoke_studys_answers_say_they_are_a_smoke_tests():
    v = _verdicts([False, False], [False, False])
    md = answers_markdown(v, None, seeds=1, steps=pd.Series([4, 4]))
    assert "**Evidence:** a smoke test (runs of 4 steps, fewer than 50): these answers say what a few steps do" in md
    assert "smoke test" not in answers_markdown(v, None, seeds=1, steps=pd.Series([4, 300]))


def test_a_better_model_whose_z_is_off_is_not_credited_to_z():
    """The default study's aided plain β = 1: z off (another row's z costs nothing) and its marginal NLL below its
    control's. "In short" counts it as a better model and says that gain is not z's."""
    md = answers_markdown(_verdicts([False, True, False], [True, True, False]), _oracles(0.5), seeds=1)
    assert ("**A better model of y given x than its z-free control?** In 2 of 3 runs (net gain: the control's D "
            f"minus the CVAE's marginal NLL, the rate paid, interval above 0): {c('run0')}, {c('run1')}. In 1 of them "
            f"z is off ({c('run0')}): a lower NLL that is not z's") in md
    assert f"**Which remedy did it?** {c('run1')}: z switched on *and*" in md
    assert "is off" not in answers_markdown(_verdicts([True, True], [True, False]), _oracles(0.5), seeds=1)


def test_a_model_at_chance_is_said_first_a_worse_d_is_named_and_no_use_says_what_to_try_next():
    """A new user's random-initialised model (c_base 7.33 nats/token on a 1,500-token vocabulary) went through the
    study and its report with no word of it; its aided run's D was 6.99 nats/example worse than its control's and
    the only next step offered was more seeds."""
    v = _verdicts([False, False], [False, False])
    v["verdict"] = ["z unused", "z unused, D worse than its control's"]
    chance = {"c_base": 7.3347, "vocab": 1500, "ln_vocab": float(np.log(1500))}
    md = answers_markdown(v, None, seeds=1, near_uniform=chance, aids=pd.Series(["none", "hard_em_then_soft"]))
    first = md.split("\n")[2]
    assert first.startswith("- ⚠ **The z-free model is at chance:** c_base 7.335 nats/token, near ln 1,500 = 7.313")
    assert "**z cost D:** in 1 of 2 runs the CVAE reconstructs y *worse* than its z-free control" in md
    assert f"below 0): {c('run1')}." in md
    assert "**Next:** no run switched z on; the aided runs did not switch it on either" in md
    assert "`zfree study --finetune-base`" in md
    unaided = answers_markdown(v.assign(verdict="z unused"), None, seeds=1, aids=pd.Series(["none", "none"]))
    assert "add one (`aid: hard_em_then_soft`)" in unaided and "z cost D" not in unaided and "at chance" not in unaided
    on = answers_markdown(_verdicts([True, False], [True, False]), _oracles(0.5), seeds=1)
    assert "**Next:**" not in on and "z cost D" not in on  # a switched-on run: no advice; no verdict column: no cost


def test_a_z_free_model_at_chance_is_found_from_its_vocabulary_and_noted_first(tmp_path):
    import json

    from zfree_lab.experiment.study_notes import near_uniform, near_uniform_note

    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 1500}))
    rec = near_uniform(7.3347, tmp_path)
    assert rec["vocab"] == 1500 and abs(rec["ln_vocab"] - np.log(1500)) < 1e-12
    assert near_uniform_note(rec).startswith("the z-free model scores c_base 7.335 nats/token on the validation rows")
    assert near_uniform(0.9 * np.log(1500) - 1e-6, tmp_path) is None and near_uniform(1.2, tmp_path) is None
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 49152}}))
    assert near_uniform(10.5, tmp_path)["vocab"] == 49152  # a multimodal config's text model
    (tmp_path / "config.json").unlink()
    assert near_uniform(99.0, tmp_path) is None  # no vocabulary recorded: nothing said
