"""The remedies for posterior collapse as named, composable config entries, one registry
(``REMEDY_ENTRIES``): each ``Remedy`` is a set of flat ``TrainConfig`` fields, each field one that the
objective, the schedules or the aids implement (or its own loop hook, ``Remedy.plugin``), with its
source, its line of the docs' table and its style in the figures; ``"a+b"`` composes entries (a field
two entries set differently is refused). The leaderboard, the figures (``zfree_lab.report.figstyle``),
the docs' table, the full leaderboard's SLURM spec and the tests read the registry. A config that
carries ``remedy="<name>"`` must hold exactly the entry's fields (``check_remedy_fields``, called when
a run starts and a grid is expanded), so the name a table shows is what the run did.

Each paper's own defaults, adapted only where the latent differs (said per entry):

  none          the grid's beta alone (beta reduction; Higgins et al. 2017, beta-VAE).
  free_bits     Kingma et al. 2016 (IAF), eq. 15: sum_j max(lambda, E_batch KL_j) with the target of
                Li et al. 2019, "A surprisingly effective fix": 8 nats in all (their 8/32 per dimension
                of a 32-dim z). Gaussian: lambda = 8 / d_latent per dimension (``free_bits_mode="per_dim"``);
                categorical: one group with lambda = 8 (``"batch_mean"``; 8 > log K, so the KL of a
                discrete z is never penalized: the router learns nothing from it).
  ae            Li et al. 2019's autoencoder pretraining: beta = 0 for the first quarter of the steps
                (``ae_steps``; the paper trains the AE to convergence and resets the decoder, which
                here would throw away the warm start, so the decoder is kept).
  ae+free_bits  Li et al. 2019's recipe (composed).
  kl_threshold  Optimus (Li et al. 2020), ``dim_target_kl`` 0.5: each example's KL of a dimension below
                0.5 nats is masked out of the penalty, as their code does (``free_bits_mode="threshold"``).
  cyclical      Fu et al. 2019 (NAACL), cyclical annealing: M = 4 cycles, R = 0.5 (beta rises
                linearly over the first half of each cycle, then holds).
  optimus       Optimus's language-model recipe: one cycle with ratio_zero 0.5, ratio_increase
                0.25 (``frange_cycle_zero_linear``) and ``dim_target_kl`` 0.5.
  aggressive    He et al. 2019, "Lagging inference networks": inner posterior-only updates before
                each joint step until the loss stops improving (at most 100, checked every 15), while
                the mutual information keeps rising (``aid="aggressive_encoder"``).
  word_dropout  Bowman et al. 2016, "Generating sentences from a continuous space", section 3.2: each
                decoder-input token of y is replaced by the unknown (else the padding) token with
                probability 0.25 during training (keep rate 0.75: our choice; the paper sweeps the keep rate
                and we could not check a default of theirs offline), targets, scoring and evaluation clean
                (``zfree.train.word_dropout``). Its z-free control is trained with the same dropout
                (``zfree_lab.experiment.controls``), so the gain counts only what z adds to the weakened decoder.
  switch_on     zfree's symmetry-breaking aid (seed notes 000/002, the aids issue): hard EM with a
                gated hand-over to the true objective, the optimal posterior, dead-value restarts
                (``SWITCH_ON_RECIPE`` without its batch size: equal compute keeps the grid's batch).
  switch_on_e2e switch_on with the E2E preset's K = 4 and E-step on the first 3 tokens of y.
  gaussian      the diagonal-Gaussian CVAE with the N(0, I) prior (the baseline of bn_vae).
  bn_vae        Zhu et al. 2020, BN-VAE: batch-normalized posterior means with fixed gamma = 0.7.
  delta_vae     Razavi et al. 2019, delta-VAE's committed rate, the fixed-range posterior variance variant
                (sigma_q <= sigma_u under the N(0, I) prior, so KL >= delta for every posterior; their AR(1)
                prior needs a sequence of latents, zfree has one vector: zfree.models.continuous). delta = 8
                nats in all: the paper's delta is a per-experiment choice and none is given for one latent
                vector that we know of, so it is set to free_bits' target (Li et al. 2019), and the two entries
                commit the same rate by two mechanisms (a floor built into the posterior family against a
                floor on the penalty); at d_latent = 16, 0.5 nats per dimension, sigma_u = 0.398. It is far
                above the benchmark's I(z; y | x) <= log 4 = 1.39 nats: a rate paid whether or not z carries
                anything (set ``delta_rate`` lower to commit less; sigma_u -> 1 as delta -> 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from zfree.core.errors import ConfigError
from zfree.objective.plugin_api import Plugin

#: The switch-on recipe of the aids issue: hard EM gated hand-over, order-keeping posterior
#: features, more latent values than strategies, dead-value restarts (see AidConfig).
HARD_EM_RECIPE = {"aid": "hard_em_then_soft", "n_latent": 6, "posterior_features": "mean_first",
                  "hard_em_decoder": "best", "handover_margin": 0.15,
                  "restart_dead_every": 100, "hard_em_max_steps": 800, "handover_check_every": 50,
                  "handover_rows": 500,
                  # soft-phase backbone rate: 3e-5 gave rho_recon 0.48 / NMI(m=1) 0.71 at step 800,
                  # 1e-4 gave 0.30 / 0.78 (same seed and hand-over step; 0.18 / 0.89 at step 1000)
                  "lr_backbone": 1e-4,
                  # heads and latent embeddings: 1e-3 ended at NMI(m=1) 0.884 (seed 0, step 1200), 3e-3 at 0.901
                  "lr_new": 3e-3}
#: the faster switch-on (analysis/results/switch_on_variants.md): the recipe with the
#: optimal posterior q*(z | x, y) (no amortized head: q* is computed from the K decoder passes the
#: step makes anyway), batch 32, higher rates (hard-phase backbone 3e-4, latent embeddings and
#: router 1e-2), a 200-row gate every 25 steps and restarts every 50. With the amortized head
#: (mean_first) the same recipe sat at NMI (m = 1) 0.85-0.89 for hundreds of steps: 6-11 of the 71
#: copy rows (m = 1) of the first 300 validation rows went to the reverse value (10 of those 71 have
#: x[0] = x[-1], a first y token reverse would emit too); the decoders' own q* does not stall there
SWITCH_ON_RECIPE = {**HARD_EM_RECIPE, "posterior_features": "optimal", "batch_size": 32, "hard_em_lr_backbone": 3e-4,
                    "lr_backbone": 3e-4, "lr_new": 1e-2, "handover_rows": 200, "handover_check_every": 25,
                    "restart_dead_every": 50, "hard_em_max_steps": 400}

#: the E2E preset's changes to the switch-on recipe (analysis/studies/presets/e2e.yaml): K = 4 and the
#: hard-EM E-step on the first 3 tokens of y (k* = the value that best predicts how the sentence opens)
SWITCH_ON_E2E = {"n_latent": 4, "hard_em_estep_tokens": 3, "handover_rows": 200}

#: the hard-EM aid of an own-model study (``zfree_lab.experiment.own_study``): HARD_EM_RECIPE at K = 4 with a
#: short hard phase (200 steps, a 200-row gate) and the latent embeddings' rate of the prototype (1e-3)
OWN_AID = {**HARD_EM_RECIPE, "n_latent": 4, "hard_em_max_steps": 200, "handover_rows": 200, "lr_new": 1e-3}

#: the recipes a spec file names (``recipe: NAME`` or a list of names, ``zfree_lab.experiment.spec_file``)
RECIPES = {"HARD_EM_RECIPE": HARD_EM_RECIPE, "SWITCH_ON_RECIPE": SWITCH_ON_RECIPE, "SWITCH_ON_E2E": SWITCH_ON_E2E,
           "OWN_AID": OWN_AID}


def recipe_fields(names: str | list[str]) -> dict[str, Any]:
    """The flat ``TrainConfig`` fields of the recipes ``names`` (keys of ``RECIPES``; a list is
    merged in order, a later recipe's value winning). Raises ConfigError naming an unknown name
    (listing the valid ones) or a value that is neither a name nor a list of names."""
    listed = [names] if isinstance(names, str) else names
    if not isinstance(listed, list) or not listed or not all(isinstance(n, str) for n in listed):
        raise ConfigError(f"recipe={names!r}: give a name or a list of names among {list(RECIPES)}")
    bad = [n for n in listed if n not in RECIPES]
    if bad:
        raise ConfigError(f"recipe: {bad} not among {list(RECIPES)}")
    out: dict[str, Any] = {}
    for n in listed:
        out.update(RECIPES[n])
    return out

#: word dropout's drop probability (1 - Bowman et al.'s keep rate; module docstring)
WORD_DROPOUT_P = 0.25
#: Li et al. 2019's free-bits target: 8 nats for the whole latent
FREE_BITS_TOTAL = 8.0
#: Optimus's ``dim_target_kl``
OPTIMUS_DIM_TARGET_KL = 0.5
#: BN-VAE's fixed scale of the batch-normalized posterior means
BN_VAE_GAMMA = 0.7
#: delta-VAE's committed rate, nats per example: free bits' total target (module docstring)
DELTA_VAE_RATE = FREE_BITS_TOTAL


def _free_bits(steps: int, kind: str, d_latent: int) -> dict[str, Any]:
    if kind == "continuous":
        return {"free_bits_mode": "per_dim", "free_bits": FREE_BITS_TOTAL / d_latent}
    return {"free_bits_mode": "batch_mean", "free_bits": FREE_BITS_TOTAL}


def _switch_on(steps: int, kind: str, d_latent: int) -> dict[str, Any]:
    out = {k: v for k, v in SWITCH_ON_RECIPE.items() if k != "batch_size"}
    # the hand-over is forced by 2/3 of the run at the latest (the recipe's 400 of 600), so a third of
    # the steps trains under the true objective
    out["hard_em_max_steps"] = min(SWITCH_ON_RECIPE["hard_em_max_steps"], max(1, (2 * steps) // 3))
    return out


@dataclass(frozen=True)
class Remedy:
    """One named remedy. ``fields(steps, latent_kind, d_latent)``: the flat ``TrainConfig`` fields it sets
    for a run of ``steps`` steps on that latent (each field one the objective, the schedules or the aids
    already implement); ``source``: the paper (citations in the module docstring); ``what``: one line for
    the docs' table (the paper's default and what was adapted); ``color`` and ``marker``: its matplotlib
    colour and marker in every figure that compares remedies (plain data: the report reads them, the
    library draws nothing); ``kind``: the latent kind it sets itself (the Gaussian entries), else None;
    ``plugin``: the training-loop hook of a remedy that changes the loop through a field of its own (a
    ``zfree.objective.plugin_api.Plugin``; ``zfree.train.plugins.PLUGINS`` lists it after the aids'), else
    None (its fields are implemented already)."""

    name: str
    fields: Callable[[int, str, int], dict[str, Any]]
    source: str
    what: str
    color: str
    marker: str
    kind: str | None = None
    plugin: Plugin | None = None


#: the registry, in the leaderboard's order (name -> entry); citations in the module docstring. (cyclical: 4
#: periods of ceil((steps + 1) / 4) cover steps 0..steps, so the last step is not a new cycle's beta = 0, as
#: Fu et al.'s indices 0..n_iter - 1 never are. optimus: one cycle over the run: beta_cycle_steps = steps + 1,
#: so the last step (step % period != 0) holds beta.)
REMEDY_ENTRIES: dict[str, Remedy] = {r.name: r for r in (
    Remedy("none", lambda steps, kind, d: {}, "Higgins et al. 2017 (beta-VAE)", "the grid's β alone (β reduction)",
           "tab:gray", "o"),
    Remedy("free_bits", _free_bits, "Kingma et al. 2016, eq. 15; Li et al. 2019's target",
           "Kingma et al. 2016, eq. 15, with Li et al. 2019's total target of 8 nats (8/d per dimension of a "
           "Gaussian; one group of 8 for the categorical, above log K, so its KL is never penalized)", "tab:blue", "s"),
    Remedy("ae", lambda steps, kind, d: {"ae_steps": max(1, steps // 4)}, "Li et al. 2019, autoencoder pretraining",
           "Li et al. 2019: β = 0 for the first quarter of the steps (their decoder reset is left out: it would "
           "throw away the warm start); `ae+free_bits` is their recipe", "tab:cyan", "v"),
    Remedy("kl_threshold", lambda steps, kind, d: {"free_bits_mode": "threshold", "free_bits": OPTIMUS_DIM_TARGET_KL},
           "Optimus (Li et al. 2020), dim_target_kl", "Optimus (Li et al. 2020) `dim_target_kl` 0.5: each example's "
           "per-dimension KL below 0.5 is masked out", "tab:olive", "<"),
    Remedy("cyclical", lambda steps, kind, d: {"beta_schedule": "cyclical",
                                               "beta_cycle_steps": max(2, math.ceil((steps + 1) / 4)),
                                               "beta_ratio_zero": 0.0, "beta_ratio_increase": 0.5},
           "Fu et al. 2019 (NAACL), cyclical annealing", "Fu et al. 2019: 4 cycles, β rises over the first half of "
           "each (R = 0.5)", "tab:purple", ">"),
    Remedy("optimus", lambda steps, kind, d: {"beta_schedule": "cyclical", "beta_cycle_steps": steps + 1,
                                              "beta_ratio_zero": 0.5, "beta_ratio_increase": 0.25,
                                              "free_bits_mode": "threshold", "free_bits": OPTIMUS_DIM_TARGET_KL},
           "Optimus (Li et al. 2020), the language-model recipe", "Optimus's LM recipe: one cycle with ratio_zero "
           "0.5, ratio_increase 0.25 and the 0.5 threshold", "tab:pink", "D"),
    Remedy("aggressive", lambda steps, kind, d: {"aid": "aggressive_encoder"}, "He et al. 2019, Alg. 1",
           "He et al. 2019: up to 100 posterior-only steps before each joint step, stopped when the loss of 15 "
           "stops falling, while I(x; z) rises", "tab:brown", "P"),
    Remedy("word_dropout", lambda steps, kind, d: {"word_dropout": WORD_DROPOUT_P}, "Bowman et al. 2016, sec. 3.2",
           "Bowman et al. 2016, §3.2: each decoder-input token of y replaced by the unknown (else padding) token "
           "with probability 0.25 in training (our choice of p; the paper sweeps the keep rate); its z-free control "
           "trains with the same dropout", "teal", "8"),
    Remedy("switch_on", _switch_on, "seed notes 000/002; Shen et al. 2019, hard EM",
           "zfree's aid ([making z switch on](aids.md)): hard EM with a gated hand-over, the optimal posterior, "
           "dead-value restarts", "tab:red", "*"),
    Remedy("switch_on_e2e", lambda steps, kind, d: {**_switch_on(steps, kind, d), **SWITCH_ON_E2E},
           "seed notes 000/002; Shen et al. 2019, hard EM", "`switch_on` with the E2E preset's K = 4 and the E-step "
           "on the first 3 tokens", "darkred", "*"),
    Remedy("gaussian", lambda steps, kind, d: {"latent_kind": "continuous", "prior": "standard"},
           "Kingma & Welling 2014", "the diagonal-Gaussian CVAE with N(0, I) prior (the baseline of `bn_vae`)",
           "tab:orange", "h", kind="continuous"),
    Remedy("bn_vae", lambda steps, kind, d: {"latent_kind": "continuous", "prior": "standard", "bn_gamma": BN_VAE_GAMMA},
           "Zhu et al. 2020, BN-VAE", "BN-VAE (Zhu et al. 2020, γ = 0.7 fixed, learned shift)", "black", "d",
           kind="continuous"),
    Remedy("delta_vae", lambda steps, kind, d: {"latent_kind": "continuous", "prior": "standard",
                                                "delta_rate": DELTA_VAE_RATE},
           "Razavi et al. 2019, delta-VAE", "δ-VAE (Razavi et al. 2019), the fixed-range posterior variance "
           "variant: σ_q ≤ σ_u < 1 under N(0, I), so KL ≥ δ = 8 nats for every posterior", "goldenrod", "p",
           kind="continuous"),
)}
#: the entries' names, in the leaderboard's order
REMEDIES = tuple(REMEDY_ENTRIES)
#: the (color, marker) of a composed remedy a leaderboard compares (Li et al.'s recipe), beside the entries' own
COMPOSED_STYLES = {"ae+free_bits": ("tab:green", "^")}
#: the style of a name that is neither an entry nor in ``COMPOSED_STYLES``
OTHER_STYLE = ("tab:gray", "X")


def remedy_style(name: str) -> tuple[str, str]:
    """(color, marker) of remedy ``name``: its entry's, a composed remedy's (``COMPOSED_STYLES``), else
    ``OTHER_STYLE``."""
    entry = REMEDY_ENTRIES.get(str(name))
    return (entry.color, entry.marker) if entry else COMPOSED_STYLES.get(str(name), OTHER_STYLE)


def remedy_parts(name: str) -> list[str]:
    """The entries of a (composed) remedy name: ``"ae+free_bits"`` -> ``["ae", "free_bits"]``.
    Raises ConfigError naming an unknown entry (listing the valid ones)."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"remedy={name!r}: expected a name among {list(REMEDIES)} (or 'a+b')")
    parts = [p.strip() for p in name.split("+")]
    bad = [p for p in parts if p not in REMEDY_ENTRIES]
    if bad:
        raise ConfigError(f"remedy={name!r}: {bad} not among {list(REMEDIES)}")
    return parts


def remedy_fields(name: str, *, steps: int, latent_kind: str = "discrete", d_latent: int = 16) -> dict[str, Any]:
    """The flat ``TrainConfig`` fields of the remedy ``name`` (``"a+b"`` composes) for a run of
    ``steps`` steps, plus ``remedy=name``. ``latent_kind`` / ``d_latent``: the run's latent (a
    Gaussian entry sets it itself). Raises ConfigError for an unknown entry or two entries that set
    one field to different values (naming the field)."""
    parts = remedy_parts(name)
    kinds = {REMEDY_ENTRIES[p].kind for p in parts if REMEDY_ENTRIES[p].kind}
    kind = kinds.pop() if kinds else str(latent_kind)
    out: dict[str, Any] = {}
    for p in parts:
        for k, v in REMEDY_ENTRIES[p].fields(int(steps), kind, int(d_latent)).items():
            if k in out and out[k] != v:
                raise ConfigError(f"remedy={name!r}: {p!r} sets {k}={v!r} but an earlier entry set {k}={out[k]!r}")
            out[k] = v
    return {**out, "remedy": name}


def apply_remedy(flat: dict[str, Any], name: str) -> dict[str, Any]:
    """``flat`` (a flat config with at least ``steps``) with the fields of remedy ``name`` set."""
    return {**flat, **remedy_fields(name, steps=flat["steps"], latent_kind=flat.get("latent_kind", "discrete"),
                                    d_latent=flat.get("d_latent", 16))}


def check_remedy_fields(cfg) -> None:
    """ValueError naming the field unless the ``TrainConfig`` ``cfg`` holds every field its
    ``aid.remedy`` entry sets (the name is a record of what the run did, never a label alone)."""
    flat = cfg.to_flat()
    try:
        want = remedy_fields(cfg.aid.remedy, steps=cfg.optim.steps, latent_kind=str(flat["latent_kind"]),
                             d_latent=cfg.model.d_latent)
    except ConfigError as e:
        raise ValueError(str(e)) from None
    for k, v in want.items():
        have = flat[k]
        if have != v and not (isinstance(v, float) and isinstance(have, (int, float)) and math.isclose(have, v)):
            raise ValueError(f"remedy={cfg.aid.remedy!r} sets {k}={v!r} but the config has {k}={have!r}")
