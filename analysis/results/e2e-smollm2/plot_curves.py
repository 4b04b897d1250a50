"""The training curves of the e2e-smollm2 study's runs that wrote one (``curve.jsonl``: window means of
the training terms every 10 steps, 80 rows a window at batch 8): the reconstruction loss in nats per
token and, for the CVAE runs, the rate (KL to the prior, nats per example). In a folder without CVAE
runs the second panel shows each label oracle's gap to its own control instead (control minus oracle,
nats/token, on the same batches: > 0 means the oracle is ahead). Writes curves.png beside this file.

    .venv/bin/python analysis/results/e2e-smollm2/plot_curves.py runs/e2e-smollm2
    # another file name (e.g. a later variant's runs in a folder without the study's first ones)
    .venv/bin/python analysis/results/e2e-smollm2/plot_curves.py runs/e2e-smollm2 curves-variant3.png

Runs written before curves existed (the first control and the first aided run) have none and are
named as missing.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import re  # noqa: E402

HERE = Path(__file__).resolve().parent


def main(study: Path, name: str = "curves.png") -> None:
    runs = sorted(d for d in (study / "runs").iterdir() if d.is_dir())
    fig, (ax, ax_kl) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    missing, curves = [], {}
    for d in runs:
        f = d / "curve.jsonl"
        if not f.exists() or f.stat().st_size == 0:
            missing.append(d.name)
            continue
        c = pd.read_json(f, lines=True)
        curves[d.name] = c
        control = "control" in d.name
        style = {"ls": "--" if control else "-", "lw": 1.6}
        ax.plot(c["step"], c["loss/train/reconstruction_loss"], label=d.name, **style)
        if not control and "oracle" not in d.name:
            ax_kl.plot(c["step"], c["loss/train/kl_prior_loss"], label=d.name, **style)
    ax.set(xlabel="training step", ylabel="reconstruction, nats/token (train)",
           title="reconstruction (dashed: z-free control)")
    if ax_kl.lines:
        ax_kl.set(xlabel="training step", ylabel="rate: KL(q || prior), nats/example (train)",
                  title="rate of the CVAE runs")
    else:
        _oracle_gaps(ax_kl, curves)
    for a in (ax, ax_kl):
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    if missing:
        fig.suptitle("10-step window means of the training batches; no curve (run before curve.jsonl existed): "
                     + ", ".join(missing), fontsize=8)
    fig.savefig(HERE / name, dpi=110)
    print(f"wrote {HERE / name}; no curve: {missing}")


def _recipe(name: str) -> str:
    """A run name without its hash, with ``oracle-<label>`` read as ``control``: the control it pairs with."""
    return re.sub(r"_[0-9a-f]{8}$", "", re.sub(r"oracle-[^_]+", "control", name))


def _oracle_gaps(ax, curves: dict) -> None:
    """Draw control minus oracle (train reconstruction, nats/token) per oracle that has a control."""
    key = "loss/train/reconstruction_loss"
    controls = {_recipe(n): c for n, c in curves.items() if "control" in n}
    for name, c in curves.items():
        if "oracle" in name and _recipe(name) in controls:
            t = controls[_recipe(name)].set_index("step")[key].to_frame("control").join(
                c.set_index("step")[key].rename("oracle"), how="inner")
            ax.plot(t.index, t["control"] - t["oracle"], marker=".", label=name)
    ax.axhline(0, color="k", lw=0.8)
    ax.set(xlabel="training step", ylabel="control - oracle, nats/token (train)",
           title="oracle's gain over its control (> 0: ahead)")


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):  # the usage is the module docstring
        print(__doc__)
        sys.exit(0)
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/e2e-smollm2").resolve(), *sys.argv[2:3])
