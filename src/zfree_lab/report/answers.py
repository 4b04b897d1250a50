"""The report's opening answers (“In short”): the four questions a study is run for — did z switch on, is the
CVAE a better model of y given x than its z-free control, which remedy did it, what could z carry — each in one
line, read from the same verdict and oracle tables the sections below show (``gains_report.gain_verdicts``,
``zfree_lab.experiment.gains.oracle_table``), with how much evidence stands behind them (seeds)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from zfree_lab.experiment.gains import best_label
from zfree_lab.report.gains_report import measured_eta
from zfree_lab.report.plan_report import SMOKE_STEPS
from zfree_lab.report.report import md_code
from zfree_lab.report.seed_report import MORE_SEEDS

#: runs named in a line before "and N more"
NAMED = 4


def next_without_use(aided: bool) -> str:
    """"In short"'s line where no run switched z on: what the concepts pages' remedies say to try, besides
    seeds (``aided``: some run had a switch-on aid already)."""
    aid = ("the aided runs did not switch it on either: try a β further below the predicted boundary" if aided else
           "without a symmetry-breaking aid z rarely switches on (the concepts' *aids* page): add one "
           "(`aid: hard_em_then_soft`), or a β below the predicted boundary")
    return (f"{aid}, more steps (a budget that keeps them), or, where c_base is far above the data's own noise, a base "
            "fine-tuned on the data first (`zfree study --finetune-base`): the warm start zfree's question is about.")


def _named(runs: list[str]) -> str:
    shown = ", ".join(md_code(r) for r in runs[:NAMED])
    return shown + (f" and {len(runs) - NAMED} more" if len(runs) > NAMED else "")


def _true(col: pd.Series) -> pd.Series:
    """True where ``col`` is true, False where false or NaN (as ``gains_report._on_and_better`` counts)."""
    return (col == True).astype(bool)  # noqa: E712 - NaN-safe


def answers_markdown(verdicts: pd.DataFrame, oracles: pd.DataFrame | None, seeds: int,
                     steps: pd.Series | None = None, near_uniform: dict | None = None,
                     aids: pd.Series | None = None) -> str:
    """“In short” as markdown: ``verdicts`` (``gain_verdicts``: run, z switched on, better model, z used),
    ``oracles`` (the label oracles' table, or None without controls), ``seeds`` the number of seeds the runs
    span, ``steps`` the runs' training steps (runs all shorter than ``SMOKE_STEPS``: the evidence line says the
    answers are a smoke test's). Readouts missing (an older study): the gain rule's "z used" answers the first
    question. ``near_uniform``: notes.json's record of a z-free model at chance
    (``zfree_lab.experiment.study_notes.near_uniform``), said first. Runs whose D is worse than their control's
    (the verdict's interval below 0) are named; where no run switched z on, a line names what to try next
    (``next_without_use``; ``aids``: the runs' ``aid`` column, "none" for unaided).
    Empty string without a finished CVAE run."""
    if verdicts is None or verdicts.empty:
        return ""
    n = len(verdicts)
    readouts = "z switched on" in verdicts and verdicts["use in the model [nats/ex]"].notna().any()
    on = _true(verdicts["z switched on"] if readouts else verdicts["z used"])
    better = _true(verdicts["better model"]) if readouts else pd.Series(False, index=verdicts.index)
    runs = verdicts["run"].astype(str)
    how = ("the decoder reads y from z: another row's z costs nats" if readouts else
           "measured use and a z-gain interval above 0 over its control")
    lines = [f"- **Did z switch on?** In {int(on.sum())} of {n} runs ({how})"
             + (f": {_named(list(runs[on]))}." if on.any() else ".")]
    if readouts:
        lines.append(f"- **A better model of y given x than its z-free control?** In {int(better.sum())} of {n} runs "
                     "(net gain: the control's D minus the CVAE's marginal NLL, the rate paid, interval above 0)"
                     + (f": {_named(list(runs[better]))}." if better.any() else ".") + _not_zs(runs[better & ~on]))
        both = on & better
        which = (f"{_named(list(runs[both]))}: z switched on *and* the CVAE models y given x better than its control."
                 if both.any() else "none: no run switched z on and modelled y given x better than its control"
                 + (f" (z switched on without paying for its rate in {_named(list(runs[on]))})." if on.any() else "."))
        lines.append(f"- **Which remedy did it?** {which}")
    lines.append(f"- **What could z carry?** {_carry(oracles)}")
    worse = verdicts["verdict"].astype(str).str.contains("D worse than its control") if "verdict" in verdicts else on & False
    if worse.any():
        lines.append(f"- **z cost D:** in {int(worse.sum())} of {n} runs the CVAE reconstructs y *worse* than its z-free "
                     f"control (z-gain interval below 0): {_named(list(runs[worse]))}.")
    if not on.any():
        aided = aids is not None and bool((aids.dropna().astype(str) != "none").any())
        lines.append("- **Next:** no run switched z on; " + next_without_use(aided))
    if near_uniform:
        lines.insert(0, f"- ⚠ **The z-free model is at chance:** c_base {near_uniform['c_base']:.3f} nats/token, near "
                        f"ln {near_uniform['vocab']:,} = {near_uniform['ln_vocab']:.3f} (a uniform guess over its "
                        "vocabulary). Were its weights loaded? The answers below say little about a recipe.")
    longest = pd.to_numeric(steps, errors="coerce").max() if steps is not None and len(steps) else np.nan
    smoke = (f"a smoke test (runs of {int(longest)} steps, fewer than {SMOKE_STEPS}): these answers say what a few "
             "steps do, not what a recipe does; " if longest < SMOKE_STEPS else "")
    lines.append("- **Evidence:** " + smoke + (
        f"1 seed: every interval here is over the evaluated rows of that seed, not over seeds; "
        f"{MORE_SEEDS} for a claim about a recipe." if seeds <= 1 else
        f"{seeds} seeds: the lines above count runs (one per seed and recipe); the paired test over seeds is in "
        "*Over seeds* below."))
    return "## In short\n\n" + "\n".join(lines)


def _not_zs(runs: pd.Series) -> str:
    """The better-model runs whose z is off: their lower NLL is not z's (its own training beat the control's)."""
    if runs.empty:
        return ""
    return (f" In {len(runs)} of them z is off ({_named(list(runs))}): a lower NLL that is not z's — the CVAE's "
            "training, not its latent, did better than its control's.")


def _carry(oracles: pd.DataFrame | None) -> str:
    """The label oracles' answer: the best label with ΔR above 0, or that none buys a measurable gain."""
    if oracles is None or oracles.empty:
        return "no label oracle in this study (no label with two or more values): nothing to compare z with."
    if measured_eta(oracles) is None:
        return (f"no label's oracle lowers D measurably below the z-free control's ({oracles['label'].nunique()} "
                "label(s); *What z could gain* below).")
    b = best_label(oracles)
    return (f"the label {md_code(b['label'])} would lower D by ΔR = {b['delta_R']:.3f} nats/example "
            f"[{b['delta_R_lo']:.3f}, {b['delta_R_hi']:.3f}] at H(label | x) = {b['H']:.3f} nats (its label oracle).")
