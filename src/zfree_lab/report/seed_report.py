"""The report's seed-level section: the paired gains over seeds (``zfree_lab.experiment.seed_stats``).

Seeds are the unit of evidence for a claim about a recipe: a cell run at n >= 2 seeds shows each
quantity's mean over seeds with its t-interval and the two-stage bootstrap beside it; a cell of one
seed says "1 seed" and shows no interval over seeds (its row interval is within one seed only).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from zfree_lab.experiment.seed_stats import SEED_GAINS_FILE, TOST_MARGIN, seeds_text
from zfree_lab.report.report import md_code

#: how to run more seeds, for a study or a sweep (both render this report)
MORE_SEEDS = "`zfree study ... --seeds 0-2` (a sweep: `seeds: [0, 1, 2]` in its spec)"

#: quantity -> its name in the report
NAMES = {"z_gain": "z gain (D)", "net_gain": "net gain (marginal NLL)", "use_shuffled": "use in the model",
         "gain_minus_rate": "gain − rate"}


def read_seed_gains(study_dir: Path | str) -> pd.DataFrame | None:
    """``seed_gains.csv`` of a study folder, or None where it has none (no controls)."""
    f = Path(study_dir) / SEED_GAINS_FILE
    return pd.read_csv(f) if f.exists() else None


def _ci(lo: float, hi: float) -> str:
    return "—" if pd.isna(lo) or pd.isna(hi) else f"[{lo:.3g}, {hi:.3g}]"


def seed_gains_frame(tab: pd.DataFrame) -> pd.DataFrame:
    """The table the report shows, indexed by its cell (weighting, beta, aid, remedy: no row number): per
    cell its seeds, then per quantity the mean over seeds with its 95 % t-interval over seeds in one cell,
    and the two-stage bootstrap interval (nats per example, 3 significant digits). A cell of one seed has
    no interval over seeds: its value reads "5.96e-06 (1 seed)" and its bootstrap cell "1 seed"."""
    key = [c for c in ("weighting", "beta", "aid", "remedy") if c in tab]
    rows = []
    for _, r in tab.iterrows():
        row = {k: r[k] for k in key}
        row["seeds"] = f"{seeds_text(r['n_seeds'])} ({r['seeds']})"
        one = pd.notna(r["n_seeds"]) and int(r["n_seeds"]) < 2
        for q, name in NAMES.items():
            if q not in r or pd.isna(r[q]):
                continue
            over = "(1 seed)" if one else _ci(r[f"{q}_t_lo"], r[f"{q}_t_hi"])
            row[f"{name} [nats/ex], t 95% CI over seeds"] = f"{r[q]:.3g} {over}"
            row[f"{name}: two-stage bootstrap"] = "1 seed" if one else _ci(r[f"{q}_boot_lo"], r[f"{q}_boot_hi"])
        rows.append(row)
    frame = pd.DataFrame(rows)
    return frame.set_index(key) if key and len(frame) else frame


def _net_tests(p: float, tost: float, alpha: float = 0.05) -> str:
    """The net gain's two tests in words: its one-sided p (H0: net gain <= 0) and TOST's p of equivalence within
    ±``TOST_MARGIN``, "equivalent" said only where that p is below ``alpha`` (a large TOST p shows nothing)."""
    out = f" (one-sided p {p:.3g})" if pd.notna(p) else ""
    if pd.notna(tost):
        shown = "equivalent" if tost < alpha else "not shown equivalent"
        out += f", {shown} to 0 within ±{TOST_MARGIN} (TOST p {tost:.3g})"
    return out


def seed_gains_markdown(tab: pd.DataFrame) -> str:
    """One line per cell: the seed-level reading of its z gain and net gain, with "1 seed" where it has one."""
    lines = []
    for _, r in tab.iterrows():
        cell = md_code(" ".join(f"{k}={r[k]}" for k in ("weighting", "beta", "aid") if k in r and pd.notna(r[k])))
        n = int(r["n_seeds"])
        if n < 2:
            lines.append(f"- {cell}: **1 seed** — z gain {r['z_gain']:.3g}, net gain "
                         f"{r.get('net_gain', np.nan):.3g} nats/example; no interval over seeds (run more seeds: "
                         f"{MORE_SEEDS}).")
            continue
        g, net = (r["z_gain_t_lo"], r["z_gain_t_hi"]), (r.get("net_gain_t_lo"), r.get("net_gain_t_hi"))
        verdict = ("above 0" if g[0] > 0 else "below 0" if g[1] < 0 else "holds 0")
        lines.append(f"- {cell}, {seeds_text(n)}: z gain {r['z_gain']:.3g} {_ci(*g)} (t over seeds, {verdict}; one-sided "
                     f"p {r['z_gain_p']:.3g}); net gain {r.get('net_gain', np.nan):.3g} {_ci(*net)}"
                     f"{_net_tests(r.get('net_gain_p', np.nan), r.get('net_gain_tost_p', np.nan))}.")
    return "\n".join(lines)


def seed_section(tab: pd.DataFrame | None) -> tuple[str, pd.DataFrame | None] | None:
    """The report's "Over seeds" section: (its markdown, its table or None); None without seed_gains.csv rows.
    Where every cell has one seed there is no test over seeds to show: one line says so (the per-run
    verdicts above are the within-seed readings) instead of a table of "1 seed" cells."""
    if tab is None or not len(tab):
        return None
    head = "## Over seeds: the paired test\n\n"
    if (tab["n_seeds"] < 2).all():
        return (head + "*Left out: every cell has **1 seed**, so there is no interval over seeds (the seeds are the "
                "unit of evidence for a claim about a recipe); the verdicts above are within one seed. Run more "
                f"seeds: {MORE_SEEDS}.*"), None
    return (head + "Each seed trains the run and its own control on the same batches; the seeds are the replicates "
            "(95 % t-interval over seeds, a two-stage bootstrap — seeds, then rows — as a check).\n\n"
            + seed_gains_markdown(tab)), seed_gains_frame(tab)
