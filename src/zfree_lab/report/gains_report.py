"""What z could gain and what it got, for the report:
the label oracles' available-gain table, each run's gain verdict and predicted use under both
exchange-rate rules, and which sections a dataset without generator truth leaves out.

Inputs are the study folder's tables (``zfree_lab.experiment.gains``: ``available_gain.csv`` rows,
``gains.csv`` rows) and ``SweepResults.runs``; outputs are DataFrames and escaped markdown
(``md_text``), so every function is tested on hand-made rows. Units: D, gains and rates in nats per
example (sequence); intervals are the 95 % percentile bootstrap over the evaluated rows.

The verdict rule (item 1): a run **uses z** only when its measured use fraction exceeds
``USE_THRESHOLD`` *and* its z-gain interval (D_control - D_run) lies above 0; rho against the
step-0 base is never read. Theory (item 3, ``zfree.objective.theory.predicted_use``): z pays on an
example where beta_eff < eta; eta = 1 is the synthetic benchmark's rule, the measured eta the
best distinguishable label's ``Delta R / H(label | x)``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from zfree.objective.theory import predicted_use
from zfree_lab.run.run_config import USE_THRESHOLD
from zfree_lab.experiment.controls import LINKS_FILE
from zfree_lab.experiment.gains import USE_FLOOR, best_label, oracle_table, run_gains
from zfree_lab.report.oracle_names import oracle_names, with_oracle_seeds  # noqa: F401 (re-exported)
from zfree_lab.report.report import md_code, md_text, percent, run_label, use_side

#: a label metric resting on fewer evaluated rows than this is flagged (item 4)
MIN_LABEL_ROWS = 50

#: the one line a section that needs the generator's truth prints on data that has none
NO_TRUTH = ("this data has no generator truth: no strategy set, so no Bayes rate log K/m, analytic "
            "I(z; y | x), strategy alignment or task correctness")
#: the line for a strategy-only figure or table on data without strategies
NO_STRATEGY = ("the rows carry no strategy; the labels section shows the latent values against each label "
               "(NMI, Hungarian and probe accuracy beside the majority baseline)")


def has_generator_truth(runs: pd.DataFrame) -> bool:
    """True when the runs' rows carry the generator's Bayes loss (``bayes_rate`` = mean log(K/m),
    finite: the synthetic benchmark); False on real data, where it is NaN or absent."""
    return "bayes_rate" in runs and bool(pd.to_numeric(runs["bayes_rate"], errors="coerce").notna().any())


def left_out(section: str, why: str = NO_TRUTH) -> str:
    """The one markdown line that replaces a section the data cannot fill: ``section: left out — why``."""
    return f"*{md_text(section)}: left out — {md_text(why)}.*"


def drop_empty(table: pd.DataFrame, keep=()) -> tuple[pd.DataFrame, list[str]]:
    """``table`` without its columns that hold no value at all (every entry NaN or None; those in
    ``keep`` stay), and the names of the columns dropped (for the line that says so)."""
    empty = [c for c in table.columns if table[c].isna().all() and c not in keep]
    return table.drop(columns=empty), empty


def dropped_markdown(dropped: list[str], why: str = NO_TRUTH) -> str:
    """One line naming the dropped empty columns and why ("" when none was dropped)."""
    return f"*Columns left out (no value in any run): {md_text(', '.join(dropped))} — {md_text(why)}.*" if dropped else ""


def study_gains(study_dir: Path | str, runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """(oracles, gains) of a study that trained controls (``controls.json``): ``available_gain.csv``
    and ``gains.csv`` when ``zfree report`` wrote them, else computed now (``oracle_table``,
    ``run_gains`` on ``runs``). None for a folder without controls (an older study, a sweep)."""
    d = Path(study_dir)
    if not (d / LINKS_FILE).exists():
        return None
    oracles = pd.read_csv(d / "available_gain.csv") if (d / "available_gain.csv").exists() else oracle_table(d)
    gains = pd.read_csv(d / "gains.csv") if (d / "gains.csv").exists() else run_gains(d, runs, oracles)
    return with_oracle_seeds(oracles, d), gains


def control_links(runs: pd.DataFrame, gains: pd.DataFrame) -> pd.DataFrame:
    """One row per run with a finished control: run_id, control_run_id, D_control (its own
    control's mean D, nats per example), the run's rate and distortion (``runs``: ``SweepResults.runs``)
    and weighting, and its label (``run_label``). What ``plot_rate_distortion`` draws: each control
    once, joined to its own runs."""
    cols = ["run_id", "control_run_id", "D_control", "rate", "distortion", "weighting", "label"]
    if "D_control" not in gains or "control_run_id" not in gains:
        return pd.DataFrame(columns=cols)
    g = gains.dropna(subset=["D_control", "control_run_id"])[["run_id", "control_run_id", "D_control"]]
    t = runs.merge(g, on="run_id", how="inner")
    t["label"] = [run_label(r, runs) for _, r in t.iterrows()]
    return t[cols].reset_index(drop=True)


def _ci(lo, hi, digits: int = 3) -> str:
    return "–" if pd.isna(lo) or pd.isna(hi) else f"[{lo:.{digits}g}, {hi:.{digits}g}]"


def interval_side(lo, hi) -> str:
    """Where a 95 % interval [lo, hi] lies against 0: "above 0" (lo > 0), "below 0" (hi < 0),
    "holds 0" (lo <= 0 <= hi) or "unknown" (a bound missing)."""
    if pd.isna(lo) or pd.isna(hi):
        return "unknown"
    return "above 0" if lo > 0 else "below 0" if hi < 0 else "holds 0"


def label_warnings(oracles: pd.DataFrame, min_rows: int = MIN_LABEL_ROWS) -> list[str]:
    """Per oracle row resting on too little: fewer than ``min_rows`` evaluated rows, or a label
    with one value (nothing to tell apart). Plain text (escape before showing)."""
    out = []
    for _, o in oracles.iterrows():
        if o["rows"] < min_rows:
            out.append(f"label {o['label']}: {int(o['rows'])} evaluated rows (< {min_rows}): its ΔR, H and η are rough")
        if o["n_values"] < 2:
            out.append(f"label {o['label']}: one value only, nothing for z to carry")
    return out


def available_gain_table(oracles: pd.DataFrame, digits: int = 3) -> pd.DataFrame:
    """The available-gain table (``zfree_lab.experiment.gains.oracle_table`` rows), one row per label,
    index label: values, rows, ΔR over the control and its interval, H(label | x) and its interval,
    η = ΔR/H and its interval, where ΔR's interval lies (``interval_side``: above 0, below 0, holds 0),
    and the fine-tuning gain."""
    return pd.DataFrame({
        "values": oracles["n_values"].astype(int).to_numpy(), "rows": oracles["rows"].astype(int).to_numpy(),
        "ΔR [nats/ex]": oracles["delta_R"].round(digits).to_numpy(),
        "ΔR 95% CI": [_ci(a, b, digits) for a, b in zip(oracles["delta_R_lo"], oracles["delta_R_hi"])],
        "H(label|x) [nats]": oracles["H"].round(digits).to_numpy(),
        "H 95% CI": [_ci(a, b, digits) for a, b in zip(oracles["H_lo"], oracles["H_hi"])],
        "η = ΔR/H": oracles["eta"].round(digits).to_numpy(),
        "η 95% CI": [_ci(a, b, digits) for a, b in zip(oracles["eta_lo"], oracles["eta_hi"])],
        "ΔR interval": [interval_side(a, b) for a, b in zip(oracles["delta_R_lo"], oracles["delta_R_hi"])],
        "fine-tuning gain [nats/ex]": oracles["finetune_gain"].round(digits).to_numpy(),
        **_null_cells(oracles, digits)},
        index=pd.Index(oracle_names(oracles), name="label"))


#: the oracle table's null, flipped-label and net columns as the report names them
_NULL_NAMES = {"delta_R_null": "null oracle ΔR (permuted label)", "label_value": "label value D_null − D_oracle",
               "flipped": "flipped label D_flipped − D_oracle", "oracle_net": "oracle net gain (marginal NLL)",
               "delta_R_text": "text oracle ΔR (label written into x)"}


def _null_cells(oracles: pd.DataFrame, digits: int) -> dict:
    """The null oracle's ΔR, the label's value net of it, the flipped-label loss, the oracle's net gain and
    the text oracle's ΔR (a study's option), each with its row interval (``zfree_lab.experiment.gains`` docstring); columns absent from older tables
    are left out."""
    out = {}
    for k, name in _NULL_NAMES.items():
        if k in oracles and oracles[k].notna().any():
            out[f"{name} [nats/ex]"] = oracles[k].round(digits).to_numpy()
            out[f"{name} 95% CI"] = [_ci(a, b, digits) for a, b in zip(oracles[f"{k}_lo"], oracles[f"{k}_hi"])]
    return out


def measured_eta(oracles: pd.DataFrame) -> tuple[float, str] | None:
    """(eta, label) of the best distinguishable label (``best_label``) when its eta is positive;
    None when no label's ΔR interval lies above 0 (no exchange rate was measured)."""
    best = best_label(oracles)
    if best is None or not bool(best["distinguishable"]) or not best["eta"] > 0:
        return None
    return float(best["eta"]), str(best["label"])


def available_gain_markdown(oracles: pd.DataFrame) -> str:
    """The report's opening lines on what z could carry: the best label's ΔR, H and η with their
    intervals when its ΔR interval lies above 0; else, plainly, that none does, naming each label's
    interval and where it lies (below 0: the oracle reconstructed *worse* than the z-free control;
    holds 0: nothing measurable either way); then the row/value warnings."""
    if oracles.empty:
        return ("**No label oracle in this study** (no label with two or more values, or its runs have not "
                "finished): there is no available gain to compare the runs with.")
    best = best_label(oracles)
    n = int(oracles["rows"].max())
    if measured_eta(oracles) is not None:
        head = (f"**Available gain.** The best label, {md_code(best['label'])}, lowers D by "
                f"ΔR = {best['delta_R']:.3f} nats/example {_ci(best['delta_R_lo'], best['delta_R_hi'])} over the "
                f"z-free control at H(label | x) = {best['H']:.3f} nats: η = ΔR/H = {best['eta']:.3f} "
                f"{_ci(best['eta_lo'], best['eta_hi'])} ({n} evaluated rows).")
    else:
        sides = {side: [f"{md_code(name)} {_ci(o['delta_R_lo'], o['delta_R_hi'])}"
                        for name, (_, o) in zip(oracle_names(oracles), oracles.iterrows())
                        if interval_side(o["delta_R_lo"], o["delta_R_hi"]) == side]
                 for side in ("below 0", "holds 0", "unknown")}
        what = {"below 0": "lies below 0 (giving the decoder the label as z made D *worse* than the z-free control's)",
                "holds 0": "holds 0 (no difference measurable either way)",
                "unknown": "has no interval"}
        parts = [f"{', '.join(v)} {what[k]}" for k, v in sides.items() if v]
        k = oracles["label"].nunique()
        count = f"{k} label(s)" if k == len(oracles) else f"{k} label(s), {len(oracles)} oracles"
        head = (f"**No label's ΔR interval lies above 0** ({count}, {n} evaluated rows): "
                + "; ".join(parts) + ". No label buys a measurable gain over the z-free control, so there is no "
                "measured exchange rate η and no available gain to share out.")
    nulls = null_oracle_lines(oracles)
    warn = [f"- ⚠ {md_text(w)}" for w in label_warnings(oracles)]
    return "\n".join([head, *([""] + nulls if nulls else []), *([""] + warn if warn else [])])


def null_oracle_lines(oracles: pd.DataFrame) -> list[str]:
    """Per label with a finished null oracle (the label permuted over the rows, trained as the oracle
    is: ``zfree_lab.experiment.controls``), one markdown line: what the true label is worth over it,
    D_null − D_oracle with its row interval, and where that interval lies. Where the oracle's own ΔR
    lies below 0 but the label's value above 0, the line says so: the deficit against the control is
    the oracle arm's training (the null pays it too), not the label. [] without null oracles."""
    if "label_value" not in oracles:
        return []
    out = []
    for name, (_, o) in zip(oracle_names(oracles), oracles.iterrows()):
        v, lo, hi = o["label_value"], o.get("label_value_lo"), o.get("label_value_hi")
        if pd.isna(v):
            continue
        side = interval_side(lo, hi)
        line = (f"- {md_code(name)} against its null oracle (the label permuted over the rows, trained the "
                f"same way): D_null − D_oracle = {v:.3f} nats/example {_ci(lo, hi)}, "
                + {"above 0": "the true label lowers D: the decoder reads it",
                   "below 0": "the true label does *worse* than a permuted one",
                   "holds 0": "no measurable value over a permuted label",
                   "unknown": "no interval"}[side])
        null = o.get("delta_R_null")
        if side == "above 0" and interval_side(o["delta_R_lo"], o["delta_R_hi"]) == "below 0" and not pd.isna(null):
            line += (f"; its ΔR below 0 is the oracle arm's training, not the label: the null oracle's ΔR is "
                     f"{null:.3f} {_ci(o.get('delta_R_null_lo'), o.get('delta_R_null_hi'))}")
        out.append(line + ".")
    return out


def predicted_use_at(run_dir: Path | str, eta: float) -> float:
    """Fraction of a run's evaluated rows where theory predicts use at exchange rate ``eta``:
    beta_eff < eta (``predicted_use``; per_example.parquet's beta_eff), counting the base model's
    excess over the Bayes loss where every row has one (the synthetic benchmark, as the stored
    ``predicted_use`` column does). NaN without a per-example table."""
    f = Path(run_dir) / "per_example.parquet"
    if not f.exists():
        return float("nan")
    pe = pd.read_parquet(f)
    known = "bayes_nll" in pe and bool(np.isfinite(pe["bayes_nll"].to_numpy(float)).all())
    bn = pe["bayes_nll"].to_numpy(float) if known else None
    ex = (pe["n_tokens"] * pe["b"]).to_numpy(float) - bn if known else None
    return float(np.mean(predicted_use(pe["beta_eff"].to_numpy(float), bn, ex, exchange_rate=eta)))


def _gain_verdict(measured: str, gain_lo, gain_hi=np.nan) -> str:
    """The verdict of one run from its measured use and where its z-gain interval lies against its
    own control (``interval_side``): a gain below 0 is named (D worse than the control's)."""
    if pd.isna(gain_lo):
        return "unknown: no finished control"
    side = interval_side(gain_lo, gain_hi) if not pd.isna(gain_hi) else ("above 0" if gain_lo > 0 else "holds 0")
    return {("use", "above 0"): "z used: measured use, gain > 0",
            ("use", "holds 0"): "z not used: rate paid, no gain",
            ("use", "below 0"): "z not used: rate paid, D worse than its control's",
            ("no use", "above 0"): "z not used: gain, no measured use",
            ("no use", "holds 0"): "z unused",
            ("no use", "below 0"): "z unused, D worse than its control's"}.get((measured, side), "unknown: no measured use")


def gain_verdicts(runs: pd.DataFrame, gains: pd.DataFrame, eta: tuple[float, str] | None,
                  threshold: float = USE_THRESHOLD) -> pd.DataFrame:
    """One row per run (``SweepResults.runs`` with run_id, run_dir, measured_use_fraction,
    predicted_use_fraction; ``gains``: ``run_gains`` rows): run, its control's run id, rate, z gain
    (over that control) and its interval,
    the share of the available gain, measured use, predicted use under eta = 1 and under the
    measured ``eta`` (NaN without one), "z used" (measured use AND z_gain_lo > 0; NaN without a
    control), verdict, and whether each rule agrees with "z used"."""
    g = gains.set_index("run_id")
    rows = []
    for _, r in runs.iterrows():
        x = g.loc[r["run_id"]] if r["run_id"] in g.index else pd.Series(dtype=object)
        m = use_side(r["measured_use_fraction"], threshold)
        lo = x.get("z_gain_lo", np.nan)
        used = np.nan if pd.isna(lo) or m == "unknown" else bool(m == "use" and lo > 0)
        p1 = r["predicted_use_fraction"]
        pe = predicted_use_at(r["run_dir"], eta[0]) if eta else np.nan
        agree = lambda p: np.nan if pd.isna(used) or pd.isna(p) else (p > threshold) == used  # noqa: E731
        rows.append({"run": run_label(r, runs), "control": x.get("control_run_id", np.nan),
                     "rate [nats/ex]": x.get("rate", np.nan),
                     "z gain [nats/ex]": x.get("z_gain", np.nan), "z gain 95% CI": _ci(lo, x.get("z_gain_hi", np.nan)),
                     "share of available": x.get("gain_share", np.nan), "measured use": r["measured_use_fraction"],
                     "predicted use (η = 1)": p1, "predicted use (η measured)": pe, "z used": used,
                     "verdict": _gain_verdict(m, lo, x.get("z_gain_hi", np.nan)), "η = 1 agrees": agree(p1), "η measured agrees": agree(pe),
                     **_readout_cells(x)})
    return pd.DataFrame(rows)


def _readout_cells(x: pd.Series) -> dict:
    """The within-model and net columns of a verdict row (``zfree_lab.experiment.gains`` docstring); row
    intervals are the within-seed bootstrap over evaluated rows."""
    def ci(k):
        return _ci(x.get(f"{k}_lo", np.nan), x.get(f"{k}_hi", np.nan))

    return {"use in the model [nats/ex]": x.get("use_shuffled", np.nan), "use 95% CI": ci("use_shuffled"),
            "net gain [nats/ex]": x.get("net_gain", np.nan), "net gain 95% CI": ci("net_gain"),
            "gain − rate [nats/ex]": x.get("gain_minus_rate", np.nan),
            "z switched on": x.get("z_switched_on", np.nan), "better model": x.get("z_better_model", np.nan)}


def _true(v) -> bool:
    """A readout flag that is True: a Python or a numpy bool (a column holding NaN keeps numpy's as objects)."""
    return isinstance(v, (bool, np.bool_)) and bool(v)


def _net_sentence(r: pd.Series) -> str:
    """What the readouts support for one run: z switched on (within-model use) and, separately, a better
    model of y given x (net gain, rate paid); empty for runs written before the readouts."""
    use, net = r.get("use in the model [nats/ex]", np.nan), r.get("net gain [nats/ex]", np.nan)
    if pd.isna(use) or pd.isna(net):
        return ""
    on = (f"z is switched on: the decoder reads {use:.3g} nats/ex {r['use 95% CI']} from it (another row's z costs that much)"
          if _true(r.get("z switched on")) else f"z is not shown switched on (use in the model {use:.3g} {r['use 95% CI']}"
          + (f", under the floor of {USE_FLOOR:g} nats/ex" if use < USE_FLOOR else "") + ")")
    better = ("the CVAE models y given x better than its control" if _true(r.get("better model"))
              else "the CVAE is not shown to model y given x better than its control")
    return f"; {on}; {better}: net gain {net:.3g} nats/ex {r['net gain 95% CI']} (marginal NLL, rate paid)"


def _on_and_better(verdicts: pd.DataFrame) -> str:
    """The head's counts of the two readout claims, which a z gain alone does not make (empty without readouts)."""
    if "z switched on" not in verdicts or verdicts["use in the model [nats/ex]"].isna().all():
        return ""
    is_on, is_better = verdicts["z switched on"] == True, verdicts["better model"] == True  # noqa: E712 - NaN-safe
    on, better, both = int(is_on.sum()), int(is_better.sum()), int((is_on & is_better).sum())
    whose = ""
    if better > both:  # a better model with z not shown on: the arm's training differs from its control's in effect
        whose = (f"; {'all' if both == 0 else better - both} of them with z not shown switched on: there the "
                 "better model is not z's doing")
    return (f"**z switched on in {on}** (the decoder reads y from z: another row's z costs nats, interval above 0, "
            f"at least {USE_FLOOR:g} nats/example, ≥ 2 codes); **a better model of y given x than its control in {better}** (net gain: the control's D "
            f"minus the CVAE's marginal NLL, the rate paid, interval above 0{whose}). ")


def gain_verdict_markdown(verdicts: pd.DataFrame, eta: tuple[float, str] | None) -> str:
    """The verdict lines: how many runs used z (by the gain rule), how many agree with each
    theory rule, then one line per run (escaped)."""
    if verdicts.empty:
        return "**No finished runs.**"
    known = verdicts["z used"].dropna()
    rule = (f"η = {eta[0]:.3f} (label {md_code(eta[1])})" if eta else
            "no measured η (no label's ΔR interval lies above 0)")
    head = (f"**{int(known.astype(bool).sum())} of {len(verdicts)} runs used z** (measured use and a z-gain "
            f"interval above 0 over the run's own z-free control; intervals are over the evaluated rows of one seed). "
            + _on_and_better(verdicts) + "Theory: z pays where β_eff < η·(1 + |S|·excess / Bayes NLL), the base "
            "model's excess over the Bayes loss counted where the data's generator knows it; with η = 1, "
            f"{int(verdicts['η = 1 agrees'].dropna().astype(bool).sum())} runs agree; with {rule}"
            + (f", {int(verdicts['η measured agrees'].dropna().astype(bool).sum())} agree." if eta else "."))
    several = "control" in verdicts and verdicts["control"].nunique() > 1  # name each run's own control

    def against(r):
        return f" over its control {md_code(r['control'])}" if several and not pd.isna(r["control"]) else ""

    lines = [f"- {md_code(r['run'])}: z gain {r['z gain [nats/ex]']:.3g} nats/ex {r['z gain 95% CI']}{against(r)} "
             f"at rate {r['rate [nats/ex]']:.3g}; measured use {percent(r['measured use'])}, predicted "
             f"{percent(r['predicted use (η = 1)'])} (η = 1)" + (f" / {percent(r['predicted use (η measured)'])} (η measured)"
                                                             if eta else "") + f" — {md_text(r['verdict'])}"
             + _net_sentence(r) for _, r in verdicts.iterrows()]
    return "\n".join([head, "", *lines])


def runs_c_base(runs: pd.DataFrame, reference: dict | None = None) -> float | None:
    """The c_base the runs' objectives used (median of summary ``reference/c_base``, nats per token),
    else the folder's reference.json c_base, else None."""
    v = pd.to_numeric(runs["c_base"], errors="coerce").dropna() if "c_base" in runs else pd.Series(dtype=float)
    return float(v.median()) if len(v) else (reference or {}).get("c_base")


def runs_c_base_markdown(runs: pd.DataFrame, reference: dict | None) -> str:
    """The c_base the runs used (summary ``reference/c_base``, nats per token) and the evaluated rows'
    mean b (``reference/c_eval``, rho's denominator), beside the folder's reference.json when it
    differs (e.g. a random base beside the fine-tuned base the runs trained from)."""
    def vals(col):
        return sorted({round(float(v), 4) for v in pd.to_numeric(runs.get(col, pd.Series(dtype=float)),
                                                                  errors="coerce").dropna()})

    used, ev = vals("reference/c_base") or vals("c_base"), vals("reference/c_eval")
    if not used:
        return ""
    line = (f"**c_base the runs used**: {', '.join(f'{v:.4f}' for v in used)} nats/token"
            + (f"; mean b of the evaluated rows (ρ's denominator, so step 0 reads 1): "
               f"{', '.join(f'{v:.4f}' for v in ev)}" if ev else "") + ".")
    ref = (reference or {}).get("c_base")
    if ref is not None and all(abs(ref - u) > 1e-3 for u in used):
        line += f" The folder's base/reference.json holds {ref:.4f}, which these runs did not use."
    return line
