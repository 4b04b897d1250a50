"""A hand-made real-data study folder (no strategies, no Bayes loss, labels instead; as an E2E
study writes it): two CVAE runs (one aided), each with its own z-free control (the aided one trained
longer: another recipe, another control, D lower than the aided run's), three label oracles (one on a
44-value label, ``lexfile``, as WordNet's lexicographer files, whose ΔR interval lies below 0),
notes.json, controls.json, samples.parquet with long texts, a multiref.csv (the 44-value oracle's
control columns empty: its control draws fewer samples than 44), and the budget's estimate.json
(cuts) and timings.json (phases) of a 30 min study cut to 10 steps. Nothing is trained: the report
tests read only these files, in seconds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

LONG_Y = ("The Eagle is a coffee shop near Burger King in the riverside area that serves cheap English food and is "
          "family friendly, with a customer rating of 5 out of 5 and a view of the river.")  # 170 characters


def _per_example(rng, n: int, lbar_shift: float, kl: float, labels: dict[str, list[str]]) -> pd.DataFrame:
    b = rng.uniform(2.0, 3.0, n)
    n_tok = rng.integers(15, 30, n)
    lbar = b - lbar_shift / n_tok + rng.normal(0, 0.01, n)
    df = pd.DataFrame({"id": [f"v{i}" for i in range(n)], "strategy": [None] * n, "n_tokens": n_tok, "lbar": lbar,
                       "kl": np.full(n, kl), "beta_eff": 0.0043 * n_tok * 2.6, "weight": 1 / 2.6,
                       "posterior_argmax": rng.integers(0, 2, n), "b": b, "rho_i": lbar / b,
                       "bayes_nll": np.nan, "n_consistent": [None] * n, "measured_use": False, "predicted_use": True})
    for k, vals in labels.items():
        df[f"label/{k}"] = [vals[i % len(vals)] for i in range(n)]
    return df


def _summary(run_id: str, source: str, aid: str, kl: float, pe: pd.DataFrame) -> dict:
    return {"weighting": "distribution", "beta": 0.0043 if source == "posterior" else 0.0, "aid": aid,
            "latent_kind": "discrete", "n_latent": 4, "latent_source": source, "seed": 0, "steps": 10,
            "wall_s": 1.0, "objective/recon_weight_mean": 1 / 2.6, "reference/c_base": 2.5805,
            "reference/c_eval": float(pe["b"].mean()), "loss/val/kl_prior_loss": kl,
            "loss/val/baseline_normalized_reconstruction_loss": float(pe["lbar"].mean() / pe["b"].mean()),
            "latent/measured_use_fraction": 0.0, "latent/predicted_use_fraction": 1.0, "latent/codes_used": 2,
            "latent/oracle_rho": 0.99, "objective/beta_eff_median": 0.29, "structure/alignment_nmi": None,
            "task/correctness": None, "loss_contrib/fraction_abs/reconstruction_loss": 0.9995,
            "loss_contrib/fraction_abs/kl_prior_loss": 0.0005, "structure/alignment_nmi/complete": 0.02,
            "structure/hungarian_accuracy/complete": 0.6, "structure/probe_accuracy/complete": 0.7,
            "aid/gate": [{"step": 5, "best_objective": 1.02, "collapsed_objective": 1.0}] if aid != "none" else []}


def make_real_study(root: Path, n: int = 60) -> Path:
    """Writes the study under ``root/real`` and returns it."""
    rng = np.random.default_rng(0)
    d = root / "real"
    labels = {"complete": ["yes", "yes", "no"], "first_slot": ["name", "area", "food", "name"],
              "lexfile": LEXFILES}
    runs = {"cvae_plain_a": ("posterior", "none", 0.006, 0.1), "cvae_aid_b": ("posterior", "hard_em_then_soft", 0.03, 3.0),
            "control_distribution_c": ("control", "none", 0.0, 0.0),
            "control_distribution_aid": ("control", "none", 0.0, 3.5),
            "oracle-complete_distribution_d": ("label:complete", "none", 0.64, 4.0),
            "oracle-first_slot_distribution_e": ("label:first_slot", "none", 1.4, 0.05),
            "oracle-lexfile_distribution_f": ("label:lexfile", "none", 3.2, -0.5)}
    for rid, (source, aid, kl, shift) in runs.items():
        f = d / "runs" / rid
        f.mkdir(parents=True)
        pe = _per_example(np.random.default_rng(1), n, shift, kl, labels)  # same rows and b for every run
        pe["kl"] = kl + rng.uniform(0, 0.01, n) * (kl > 0)
        pe.to_parquet(f / "per_example.parquet")
        (f / "summary.json").write_text(json.dumps(_summary(rid, source, aid, kl, pe)))
        (f / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss/val/kl_prior_loss": kl,
                                                             "loss/val/baseline_normalized_reconstruction_loss": 1.0,
                                                             "structure/alignment_nmi": None}) + "\n" for s in (0, 10)))
        if source == "posterior":
            pd.DataFrame({"id": ["v0"] * 2, "x": ["name[The Eagle], eatType[coffee shop]"] * 2,
                          "reference": [LONG_Y] * 2, "latent": [0, 1], "greedy": [LONG_Y, "The Eagle."],
                          "sampled": ["A pub.", LONG_Y]}).to_parquet(f / "samples.parquet")
    (d / "controls.json").write_text(json.dumps({
        "controls": {"cvae_plain_a": "control_distribution_c", "cvae_aid_b": "control_distribution_aid"},
        "oracles": {"oracle-complete_distribution_d": {"label": "complete", "n_values": 2, "control": "control_distribution_c"},
                    "oracle-first_slot_distribution_e": {"label": "first_slot", "n_values": 3,
                                                         "control": "control_distribution_c"},
                    "oracle-lexfile_distribution_f": {"label": "lexfile", "n_values": len(LEXFILES),
                                                      "control": "control_distribution_c"}}}))
    (d / "notes.json").write_text(json.dumps({"notes": ["label 'strategy': absent"], "predicted_boundaries": [
        {"weighting": "distribution", "beta_star": 0.0129, "betas": [0.0043]}]}))
    pd.DataFrame({"run_id": ["cvae_aid_b", "oracle-lexfile_distribution_f"], "latent_source": ["posterior", "label:lexfile"],
                  "weighting": "distribution", "beta": [0.0043, 0.0], "aid": ["hard_em_then_soft", "none"],
                  "k": [4, len(LEXFILES)], "pairwise_bleu": [0.81, 0.12], "refs_covered": [1.5, 4.0], "n_mrs": [3, 3],
                  "control_id": ["control_distribution_aid", "control_distribution_c"],
                  "control_pairwise_bleu": [0.62, np.nan], "control_refs_covered": [1.2, np.nan],
                  "control_n_mrs": [3, np.nan]}).to_csv(d / "multiref.csv", index=False)
    (d / "estimate.json").write_text(json.dumps(ESTIMATE))
    (d / "timings.json").write_text(json.dumps({"sessions": [
        {"id": "s1", "started": "2025-01-01T10:00:00+00:00", "preparation_s": 95.0, "probes_s": 290.0, "grid_s": 1932.0,
         "report_s": 45.0, "total_s": 2362.0, "points": {"finished": 7}, "finished": True}]}))
    return d


#: the 44 lexicographer files of WordNet (a label with many values), one with a mathtext marker
LEXFILES = [f"noun.{w}" for w in ("Tops act animal artifact attribute body cognition communication event feeling food "
                                   "group location motive object person phenomenon plant possession process quantity "
                                   "relation shape state substance time").split()] + \
           [f"verb.{w}" for w in ("body change cognition communication competition consumption contact creation "
                                   "emotion motion perception possession social stative weather").split()] + \
           ["adj.all", "adj.pert", "adj.$ppl_"]
#: estimate.json of a 30 min budget that cut the grid to 10 steps (``zfree_lab.experiment.estimate.plan``'s keys)
ESTIMATE = {"runs": 7, "workers": 1, "estimated_s": 1320.0, "estimated_peak_bytes": 10.6 * 2**30, "budget_s": 1800.0,
            "grid_budget_s": 1355.0, "micro_batch": 0, "memory_limit_bytes": 16 * 2**30,
            "cuts": ["evaluated rows 300 -> 100", "evaluations at step 0 and the end only",
                     "beta points [0.333, 1.0] x beta* -> [0.333] x beta*",
                     "weightings ['distribution', 'example', 'plain', 'token'] -> ['distribution', 'example']",
                     "batch 32 -> 8 rows a step", "steps x 0.02 (unaided 500 -> 10, aided 1000 -> 20)",
                     "weightings ['distribution', 'example'] -> ['distribution']"],
            "lines": ["estimate: 7 runs on 1 worker(s): about 22.0 min"], "train": {"steps": 10, "batch_size": 8}}


#: make_remedy_study's z shift per remedy (|S|·lbar lowered by about this many nats per example)
REMEDY_SHIFT = {"none": 0.05, "free_bits": 2.0, "switch_on": 3.0}


def make_remedy_study(root: Path, seeds=(0, 1, 2), remedies=("none", "free_bits", "switch_on"), n: int = 40) -> Path:
    """A seeded remedies study under ``root/remedies`` (as ``ExperimentSpec.seeds`` and remedy entries
    write it, on labelled real text): per seed a z-free control and one CVAE run per remedy, each
    with its forward-token count and train wall time (switch_on 1.5× the others). Returns it."""
    d = root / "remedies"
    labels = {"complete": ["yes", "yes", "no"], "first_slot": ["name", "area", "food", "name"]}
    controls, rng = {}, np.random.default_rng(0)
    for seed in seeds:
        cid = f"control_distribution_s{seed}"
        for rid, remedy in [(cid, None), *((f"cvae_{r}_s{seed}", r) for r in remedies)]:
            f = d / "runs" / rid
            f.mkdir(parents=True)
            shift = 0.0 if remedy is None else REMEDY_SHIFT.get(remedy, 1.0) * (1 + 0.2 * seed)
            kl = 0.0 if remedy is None else 0.02 + 0.1 * shift
            pe = _per_example(np.random.default_rng(1), n, shift, kl, labels)
            pe["kl"] = kl + rng.uniform(0, 0.01, n) * (kl > 0)
            pe.to_parquet(f / "per_example.parquet")
            s = _summary(rid, "control" if remedy is None else "posterior", "hard_em_then_soft"
                         if remedy == "switch_on" else "none", kl, pe)
            tokens = 1000.0 * (1.5 if remedy == "switch_on" else 1.0)
            s.update({"seed": seed, "remedy": remedy or "none", "compute/forward_tokens": tokens,
                      "compute/train_wall_s": tokens / 100, "structure/alignment_nmi/first_slot": 0.01 * shift,
                      "latent_used": remedy not in (None, "none")})
            (f / "summary.json").write_text(json.dumps(s))
            (f / "metrics.jsonl").write_text(json.dumps({"step": 10, "loss/val/kl_prior_loss": kl}) + "\n")
            if remedy is not None:
                controls[rid] = cid
    (d / "controls.json").write_text(json.dumps({"controls": controls, "oracles": {}}))
    (d / "notes.json").write_text(json.dumps({"notes": ["label 'strategy': absent"]}))
    return d
