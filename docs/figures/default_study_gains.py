"""The README's figure: the default study's result, from its shipped tables.

    .venv/bin/python docs/figures/default_study_gains.py   # -> docs/assets/default-study-z-gain.png

Each of the 8 CVAE runs of ``make study`` (analysis/results/study-default-summary.csv): z's gain over
its z-free control (D_control - D_run, nats per example, 95 % bootstrap interval over the evaluated
rows) beside what the strategy oracle says z could gain (study-default-available_gain.csv). Filled
markers: theory predicts use (beta_eff < 1 on most rows); green: the report's verdict "z used".
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


def main() -> Path:
    runs = sorted(rows("study-default-summary.csv"), key=lambda r: (r["aid"] != "none", ORDER.index(r["weighting"])))
    (oracle,) = rows("study-default-available_gain.csv")
    fig, ax = plt.subplots(figsize=(7.2, 3.6), dpi=120)
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
        labels.append(f"{r['weighting']}  β={float(r['beta']):g}  {aid}")
        note = f"used {100 * float(r['measured_use_fraction']):.0f} %  (theory: {100 * float(r['predicted_use_fraction']):.0f} %)"
        ax.text(max(g, ghi) + 0.04, i, note, va="center", fontsize=7, color=color)
    ax.set_yticks(range(len(runs)), labels, fontsize=8)
    ax.set_ylim(len(runs) - 0.4, -1.2)  # the first run on top
    ax.set_xlim(-0.1, 2.35)
    ax.set_xlabel("z's gain over its z-free control, D_control − D_run  [nats/example, 95 % interval]", fontsize=8)
    fig.suptitle("make study: without an aid z collapses, even where theory predicts use; with the switch-on aid\n"
                 "it gains what the oracle says z can, and stays off where theory says z does not pay (plain β=1)",
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
