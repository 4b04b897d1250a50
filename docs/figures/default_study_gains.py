"""The README's figure: the default study's result, from its shipped tables.

    .venv/bin/python docs/figures/default_study_gains.py   # -> docs/assets/default-study-z-gain.png

Each of the 8 CVAE runs of ``make study`` (analysis/results/study-default-summary.csv): z's gain over
its z-free control (D_control - D_run, nats per example, 95 % bootstrap interval over the evaluated
rows) beside what the strategy oracle says z could gain (study-default-available_gain.csv), with the rate
each run pays beside its gain. Filled markers: theory predicts use (beta_eff < 1 on most rows); green: the
report's verdict "z used". One seed; the two arms are not trained alike (the labels say steps, and the
title what else differs), so the figure says so and leaves the equal-compute contrast to the leaderboard.
Reads the CSVs with the standard library; matplotlib only (no torch).
"""

from __future__ import annotations

import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "analysis" / "results"
OUT = ROOT / "docs" / "assets" / "default-study-z-gain.png"
ORDER = ("plain", "distribution", "example", "token")


def rows(name: str) -> list[dict[str, str]]:
    with open(RESULTS / name, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _arm(runs: list[dict[str, str]], aided: bool) -> str:
    """What one arm's runs were trained and evaluated with, read from the tables (one value each, or it raises)."""
    arm = [r for r in runs if (r["aid"] != "none") == aided]
    evaluated = {r["run_id"]: r["rows"] for r in rows("study-default-gains.csv")}

    def one(values) -> str:
        (v,) = set(values)
        return v

    posterior = one(r["posterior_features"] for r in arm)
    return (f"{one(int(float(r['steps'])) for r in arm)} steps, lr_new {float(one(r['lr_new'] for r in arm)):g}, "
            f"K={one(r['n_latent'] for r in arm)}, {'amortised' if posterior != 'optimal' else 'optimal'} q, "
            f"{one(evaluated[r['run_id']] for r in arm)} rows")


def _seeds(runs: list[dict[str, str]]) -> str:
    n = len({r["seed"] for r in runs})
    return f"{n} seed" if n == 1 else f"{n} seeds"


def main() -> Path:
    runs = sorted(rows("study-default-summary.csv"), key=lambda r: (r["aid"] != "none", ORDER.index(r["weighting"])))
    (oracle,) = rows("study-default-available_gain.csv")
    fig, ax = plt.subplots(figsize=(8.6, 4.0), dpi=120)
    lo, hi = float(oracle["delta_R_lo"]), float(oracle["delta_R_hi"])
    ax.axvspan(lo, hi, color="#f2c14e", alpha=0.35, lw=0)
    ax.axvline(float(oracle["delta_R"]), color="#c9941a", lw=1)
    ax.text(float(oracle["delta_R"]), -0.75, "what z could gain (strategy oracle ΔR)", ha="center",
            va="center", fontsize=7.5, color="#7a5a0a")
    ax.axvline(0, color="0.5", lw=0.8, ls=":")
    labels = []
    for i, r in enumerate(runs):
        g, glo, ghi = float(r["z_gain"]), float(r["z_gain_lo"]), float(r["z_gain_hi"])
        used = r["z_used"].strip().lower() == "true"
        predicted = float(r["predicted_use_fraction"]) >= 0.5
        color = "#2a9d5c" if used else "#8a8a8a"
        ax.errorbar(g, i, xerr=[[g - glo], [ghi - g]], fmt="o", ms=7, color=color, mfc=color if predicted else "white",
                    mew=1.5, capsize=3)
        aid = "switch-on aid" if r["aid"] != "none" else "no aid"
        labels.append(f"{r['weighting']}  β={float(r['beta']):g}  {aid}, {int(float(r['steps']))} steps")
        note = (f"used {100 * float(r['measured_use_fraction']):.0f} %  (theory: {100 * float(r['predicted_use_fraction']):.0f} %)"
                f"  rate {float(r['rate']):.2f}")
        ax.text(max(g, ghi) + 0.04, i, note, va="center", fontsize=7, color=color)
    ax.set_yticks(range(len(runs)), labels, fontsize=8)
    ax.set_ylim(len(runs) - 0.4, -1.2)  # the first run on top
    ax.set_xlim(-0.1, 2.6)
    ax.set_xlabel("z's gain over its z-free control, D_control − D_run  [nats/example, 95 % interval]", fontsize=8)
    fig.suptitle(f"make study, {_seeds(runs)}. The two arms are not trained alike (the aid against no aid at equal\n"
                 f"steps and rates: the 3-seed leaderboard). No aid: {_arm(runs, False)};\n"
                 f"switch-on aid: {_arm(runs, True)}",
                 fontsize=8.5, x=0.01, ha="left")
    ax.tick_params(axis="x", labelsize=8)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    handles = [plt.Line2D([], [], marker="o", ls="", color="#2a9d5c", label="z used (measured use and gain > 0)"),
               plt.Line2D([], [], marker="o", ls="", color="#8a8a8a", label="z not used"),
               plt.Line2D([], [], marker="o", ls="", color="0.3", mfc="white", label="open: theory predicts no use")]
    ax.legend(handles=handles, fontsize=7, loc="lower left", bbox_to_anchor=(0.02, 0.0), frameon=False)
    fig.tight_layout()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT, metadata={"Software": None})
    return OUT


if __name__ == "__main__":
    print(main())
