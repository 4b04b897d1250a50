"""What was run against what was asked: the report's opening section. It reads
the study folder's ``estimate.json`` (``zfree_lab.experiment.estimate.plan``: the budget, the estimate,
the cuts in order) and ``timings.json`` (``zfree_lab.experiment.timings``: the measured wall time per
phase, one session per invocation) and the runs' own ``wall_s``, and warns plainly when the runs
trained fewer than ``SMOKE_STEPS`` steps: a smoke test, not a result.

Functions take the parsed files and ``zfree_lab.experiment.results.collect_runs`` rows and return
escaped markdown (``md_text``) or a display table of strings, so they are tested on hand-made rows.
Times are shown in minutes.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from zfree.core.io import read_json
from zfree_lab.experiment.budget import REPORT_S, STEP_FLOOR
from zfree_lab.experiment.results import collect_runs
from zfree_lab.experiment.timings import PHASES, read_timings
from zfree_lab.report.report import md_code, md_text

#: below this many training steps a run is a smoke test, not a result: the budget's own floor
#: (``zfree_lab.experiment.estimate.STEP_FLOOR``, where it stops cutting steps before anything else)
SMOKE_STEPS = STEP_FLOOR

#: the phases' row names in the table
PHASE_NAMES = {"startup": "start-up (Python, imports)", "preparation": "preparation (split, reference)",
               "probes": "probes (the estimate)",
               "grid": "grid (runs, controls, oracles)", "report": "report (tables, report.html)"}


#: what a "–" in the phase table means
PHASE_NOTE = ("*–: the start-up, preparation and probes have no estimate (they are measured before it); a measured – is a phase "
              "the session did not run (no probes under `--no-estimate`, no start-up for a study started from Python) or has not recorded (a session "
              "records its report phase after writing report.html, so not while it renders this page).*")


def read_plan(study_dir: Path | str) -> tuple[dict | None, list[dict]]:
    """(``estimate.json`` as a dict or None when absent, the ``timings.json`` sessions) of a study folder."""
    f = Path(study_dir) / "estimate.json"
    return (read_json(f) if f.exists() else None), read_timings(study_dir)


def _min(seconds) -> str:
    return "–" if seconds is None or pd.isna(seconds) else f"{seconds / 60:.1f}"


def _spent_before_grid(estimate: dict) -> float | None:
    """Seconds the preparation and probes had taken when the grid was fitted (budget - grid budget -
    the report's share, as ``plan`` computed the grid's share); None without a budget."""
    b, g = estimate.get("budget_s"), estimate.get("grid_budget_s")
    return None if b is None or g is None else b - g - REPORT_S


def _when(started) -> str:
    """A session's start as its column head reads it: "2026-12-05 04:34 UTC" from timings.json's ISO time (the
    bare ISO string has no space to wrap at: seven sessions' heads ran off the page's right edge); any other
    value as it is, "?" when missing."""
    if started is None:
        return "?"
    try:
        t = pd.Timestamp(started)
    except (ValueError, TypeError):
        return str(started)
    if t.tzinfo is not None:
        return t.tz_convert("UTC").strftime("%Y-%m-%d %H:%M UTC")
    return t.strftime("%Y-%m-%d %H:%M")


def phase_table(estimate: dict | None, sessions: list[dict]) -> pd.DataFrame | None:
    """Per phase (``PHASES``) and in total: the budget's share and the estimate (minutes; from
    ``estimate``, "–" where it sets none: the preparation and probes are measured, not estimated),
    then the measured minutes of each session (one column per invocation, a rerun being the next),
    and the grid's points per status. None when there is neither an estimate nor a session."""
    if estimate is None and not sessions:
        return None
    rows = [*(PHASE_NAMES[p] for p in PHASES), "total", "grid points"]
    t = pd.DataFrame(index=pd.Index(rows, name="phase"))
    if estimate is not None:
        spent, est = _spent_before_grid(estimate), estimate.get("estimated_s")
        if estimate.get("budget_s") is not None:
            t["budget [min]"] = ["–", "–", f"{_min(spent)} with the start-up and preparation" if spent is not None else "–",
                                 _min(estimate.get("grid_budget_s")), _min(REPORT_S), _min(estimate["budget_s"]), ""]
        total = None if spent is None or est is None else spent + est + REPORT_S
        t["estimate [min]"] = ["–", "–", "–", _min(est), _min(REPORT_S), _min(total), f"{estimate.get('runs', '–')} runs"]
    for i, s in enumerate(sessions):
        head = "measured [min]" if len(sessions) == 1 else f"measured [min], session {i + 1} ({_when(s.get('started'))})"
        if s.get("refused"):
            head += ", refused by its budget"
        elif s.get("running"):  # killed (or still running): its time up to the last finished point
            head += f", ended during its {s['running']}"
        points = ", ".join(f"{n} {k}" for k, n in sorted((s.get("points") or {}).items())) or "–"
        t[head] = [*(_min(s.get(f"{p}_s")) for p in PHASES), _min(s.get("total_s")), points]
    return t


def this_run(sessions: list[dict]) -> tuple[list[dict], list[dict]]:
    """(the sessions of this run, the earlier attempts refused by their budget): a session with a
    ``refused`` record ended at its probes, before any plan, so the budget of the plan that ran does
    not pay for it (its probes are kept and were not run again)."""
    return [s for s in sessions if not s.get("refused")], [s for s in sessions if s.get("refused")]


def plan_markdown(estimate: dict | None, sessions: list[dict], runs_all: pd.DataFrame) -> str:
    """The section's lines: what was asked (the budget), the estimate (runs, workers, minutes, peak
    memory), the cuts in the order they were made, the measured total against the budget, and the
    runs' own ``wall_s`` (``runs_all``: every finished run, controls and oracles included) beside
    the grid's measured wall time. "" when there is neither an estimate nor a session."""
    if estimate is None and not sessions:
        return ""
    out = []
    budget = (estimate or {}).get("budget_s")
    if estimate is not None:
        peak = estimate.get("estimated_peak_bytes")
        out.append(("**Asked**: a budget of " + _min(budget) + " min for the whole study." if budget is not None else
                    "**Asked**: no budget (an estimate only).")
                   + f" **Estimate** (after the probes, before the grid): {estimate.get('runs', '?')} runs on "
                   f"{estimate.get('workers', '?')} worker(s), about {_min(estimate.get('estimated_s'))} min for the grid"
                   + (f", peak memory {peak / 2**30:.1f} GB." if peak else "."))
        cuts = estimate.get("cuts") or []
        if cuts:
            out += ["", "**Cut to fit the budget, in this order:**", "",
                    *(f"{i}. {md_text(c)}" for i, c in enumerate(cuts, 1))]
        elif budget is not None:
            out += ["", "**The grid fits the budget uncut.**"]
    if sessions:
        ran, refused = this_run(sessions)
        total = sum(s.get("total_s") or 0.0 for s in ran)
        line = f"**Measured**: {_min(total)} min in all" + (f", over {len(ran)} sessions (each rerun is one)"
                                                            if len(ran) > 1 else "")
        if ran and ran[-1].get("report_s") is None:  # the session rendering this report: its report phase is not over
            line += " up to this report (its rendering not counted)"
        if budget:
            line += f" against the {_min(budget)} min budget ({100 * (total / budget - 1):+.0f} %)"
        if refused:
            line += (f"; not counted: {len(refused)} earlier attempt(s) the budget refused before this plan "
                     f"({_min(sum(s.get('total_s') or 0.0 for s in refused))} min, their probes kept)")
        out += ["", line + "."]
    if len(runs_all) and "wall_s" in runs_all:
        w = pd.to_numeric(runs_all["wall_s"], errors="coerce")
        grid, workers = sum(s.get("grid_s") or 0.0 for s in this_run(sessions)[0]), (estimate or {}).get("workers")
        line = (f"The runs' own `wall_s` sum to {_min(w.sum())} min over {int(w.notna().sum())} runs (controls and "
                "oracles included)")
        if grid:
            line += f"; the grid phase took {_min(grid)} min" + (f" on {workers} worker(s)" if workers else "")
            if workers and grid * workers > w.sum():
                line += (f": {_min(grid * workers - w.sum())} worker-min went outside the runs' `wall_s` (each "
                         "run's kernel start, model and reference loading)")
        out += ["", line + "."]
    return "\n".join(out)


def smoke_warning(runs: pd.DataFrame, estimate: dict | None = None, min_steps: int = SMOKE_STEPS) -> str:
    """A plain warning when any CVAE run (``runs``: with ``steps``) trained fewer than ``min_steps``
    steps, naming the step range, how many runs, and whether the budget cut them (``estimate``'s
    cuts); "" otherwise."""
    steps = pd.to_numeric(runs["steps"], errors="coerce").dropna() if "steps" in runs else pd.Series(dtype=float)
    short = steps[steps < min_steps]
    if short.empty:
        return ""
    lo, hi = int(short.min()), int(short.max())
    span = f"{lo}" if lo == hi else f"{lo}–{hi}"
    who = "The runs" if len(short) == len(steps) else f"{len(short)} of {len(steps)} runs"
    cut = [c for c in (estimate or {}).get("cuts") or [] if c.startswith("steps")]
    why = (f" (the budget cut them: {md_text(cut[-1])})" if cut else
           " (as the study asked)" if estimate is None or not (estimate.get("cuts")) else
           " (the budget cut the grid as listed above)")
    return (f"**⚠ A smoke test, not a result.** {who} trained {span} steps{why}, fewer than {min_steps}. A run "
            "this short barely moves from its warm start: the use of z, the gains and the verdicts below say what "
            "a few steps do, not what the recipe does. Give a larger budget (or more steps) for a result.")


def oracle_cuts(estimate: dict | None) -> list[tuple[int, str, list[str], list[str]]]:
    """The budget's cuts of label oracles in ``estimate``'s cut list: (its number in the list, the
    line, the labels before, the labels kept), e.g. ``(9, "label oracles ['a', 'b'] -> none", ['a',
    'b'], [])``."""
    import ast

    out = []
    for i, c in enumerate((estimate or {}).get("cuts") or [], 1):
        head = c.split(" (at ")[0]
        if not head.startswith("label oracles ") or " -> " not in head:
            continue
        before, after = head[len("label oracles "):].split(" -> ", 1)
        try:
            was, kept = ast.literal_eval(before), [] if after == "none" else ast.literal_eval(after)
        except (ValueError, SyntaxError):
            continue
        out.append((i, c, [str(x) for x in was], [str(x) for x in kept]))
    return out


def oracle_cut_markdown(estimate: dict | None, oracles: pd.DataFrame) -> str:
    """Why label oracles are missing where the budget cut them: with no oracle left (``oracles``,
    ``available_gain.csv``'s rows, empty), the opening lines of the oracle section, naming the cut;
    with some left, a warning naming the labels whose oracle was cut; "" where the budget cut none."""
    cuts = oracle_cuts(estimate)
    if not cuts:
        return ""
    n = len((estimate or {}).get("cuts") or [])
    asked, kept = cuts[0][2], cuts[-1][3]
    gone = [x for x in asked if x not in kept]
    which = "; ".join(f"cut {i} of {n}, {md_code(c)}" for i, c, _, _ in cuts)
    if oracles.empty and not kept:
        return (f"**No label oracle in this study: the budget cut them** ({which}; the cuts are listed in the "
                f"opening section). What z could gain from {', '.join(md_code(x) for x in gone)} went unmeasured; "
                "the oracles are the last thing a budget cuts, so a larger budget keeps them.")
    return (f"⚠ The budget cut the label oracle of {', '.join(md_code(x) for x in gone)} ({which}): what z "
            "could gain from that label went unmeasured.")


def conditioning_markdown(study_dir: Path | str) -> str:
    """The report's first line on unconditional data (``notes.json``'s ``conditioning``): the split's
    note (x dropped, y modelled alone, split by row); "" for conditional data or without notes."""
    f = Path(study_dir) / "notes.json"
    meta = read_json(f) if f.exists() else {}
    if meta.get("conditioning") != "unconditional":
        return ""
    note = next((str(n) for n in meta.get("notes") or [] if str(n).startswith("unconditional")), "x dropped")
    note = note.removeprefix("unconditional:").strip()  # the bold head says it once
    return f"**Unconditional data.** {md_text(note)}"


def grown_markdown(study_dir: Path | str) -> str:
    """A line for a study whose plan grew with more seeds (``plan.json``'s ``grown_from``,
    ``zfree_lab.experiment.study_plan.extend_plan``): how many runs it was planned for, how many it has now,
    and that the estimate is the first plan's. "" for any other study (or one without a plan)."""
    f = Path(study_dir) / "plan.json"
    plan = read_json(f) if f.exists() else {}
    grown = plan.get("grown_from") or []
    if not grown:
        return ""
    steps = [*(g.get("request", {}).get("spec", {}).get("seeds") for g in grown),
             plan.get("request", {}).get("spec", {}).get("seeds")]
    sizes = [*(len(g.get("run_ids") or []) for g in grown), len(plan.get("run_ids") or [])]
    said = " → ".join(f"{n} runs ({'its own seed' if s is None else 'seeds ' + ', '.join(map(str, s))})"
                      for n, s in zip(sizes, steps))
    return (f"**Grown with more seeds**: {said}, each time with the first plan's cuts (the same steps, rows and grid "
            "for every seed); the estimate above is the first plan's.")


def plan_section(study_dir: Path | str, runs: pd.DataFrame) -> tuple[str, pd.DataFrame | None]:
    """The report's opening section of a study folder: (markdown: on unconditional data its line
    first (``conditioning_markdown``), then under the heading "What was run against what was asked"
    ``plan_markdown``, ``grown_markdown`` and ``smoke_warning``, "" when none has anything to say; ``phase_table``).
    ``runs``: the CVAE runs (``SweepResults.runs``, with ``steps``)."""
    estimate, sessions = read_plan(study_dir)
    parts = [plan_markdown(estimate, sessions, collect_runs(Path(study_dir) / "runs", kind="all")),
             grown_markdown(study_dir), smoke_warning(runs, estimate)]
    text = "\n\n".join(p for p in parts if p)
    top = conditioning_markdown(study_dir)
    section = "## What was run against what was asked\n\n" + text if text else ""
    return "\n\n".join(p for p in (top, section) if p), phase_table(estimate, sessions)
