"""The symmetry-breaking aids and loop-changing remedies of a CVAE run (``AidConfig``, the ``aid``
part of ``zfree.config.TrainConfig``; the training loop's plug-ins, ``zfree.train.plugins``, read it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from zfree.config.later import later
from zfree.core.validation import check_choice, check_int, check_range
from zfree.core.values import typed_fields


@dataclass(frozen=True)
class AidEntry:
    """One symmetry-breaking aid (``AidConfig.aid``): ``source`` (its paper or note; the hooks are the
    training loop's plug-ins, ``zfree.train.plugins``), ``kinds`` the latent kinds it applies to, and
    ``gate`` whether it reads the gate rows (``handover_rows``; ``zfree_lab.run.split.gate_sample``)."""

    name: str
    source: str
    kinds: tuple[str, ...] = ("discrete", "continuous")
    gate: bool = False


#: the registry of aids, in the order the config's choices, the launch panel and the docs list them
AIDS: dict[str, AidEntry] = {a.name: a for a in (
    AidEntry("none", "no aid"),
    AidEntry("hard_em_then_soft", "seed notes 000/002 (switch-on); Shen et al. 2019, hard-EM mixture training",
             kinds=("discrete",), gate=True),
    AidEntry("beta0_warmup", "the prototype's warm-up: beta = 0 with the router detached (docs/concepts/aids.md)"),
    AidEntry("random_init_jsd", "the prototype's random latent start plus lambda_jsd (docs/concepts/aids.md)",
             kinds=("discrete",)),
    AidEntry("aggressive_encoder", "He et al. 2019, Lagging inference networks, Alg. 1", gate=True),
)}
Aid = Literal[tuple(AIDS)]
#: the aids that read the gate rows (``handover_rows``; ``zfree_lab.run.split.gate_sample``): the hand-over
#: gate and the aggressive encoder's I(x; z); a run under another aid draws no gate rows
GATE_AIDS = tuple(n for n, a in AIDS.items() if a.gate)


@dataclass(frozen=True)
class AidConfig:
    """Symmetry-breaking aids (off by default). From a zero latent injection every latent value
    gives the same loss, so the posterior gets gradient only from the KL (docs/concepts/aids.md).

    hard_em_then_soft: reconstruct with the posterior's argmax only and train the posterior by
      cross-entropy toward the best-reconstructing value (hard EM, as in mixture-model translation,
      Shen et al. 2019); hand over to the true soft objective once, on ``handover_rows`` gate rows
      (validation rows outside the evaluation rows, else training rows: ``zfree_lab.run.split.gate_sample``),
      mean(w * oracle_nll) + beta * log K < mean(w * b) (the best-z state beats the collapsed
      one), checked every ``handover_check_every`` steps; forced at ``hard_em_max_steps``.
    beta0_warmup: ``warmup_aid_steps`` steps at beta = 0 with the router detached (failed in the prototype).
    random_init_jsd: latent embeddings start at N(0, latent_init_std^2) instead of 0, plus lambda_jsd
      (failed in the prototype; breaks the step-0 equivalence on purpose).
    """

    aid: Aid = "none"  # the symmetry-breaking aid (each value in the class docstring above)
    # which latent value the decoder reconstructs with in the hard phase: the posterior's argmax
    # (the prototype) or the best-reconstructing value k* (winner-take-all, classic hard EM)
    hard_em_decoder: Literal["posterior_argmax", "best"] = "posterior_argmax"
    # the hard phase's reconstruction weight, w_i / mean_batch(w) * s for every weighting (each weighting's
    # relative per-example weights kept), so Adam's balance between reconstruction and the posterior/router
    # cross-entropies, and with it the hard phase, does not depend on the weighting's global scale:
    #   at_least_plain  s = max(1, 1 / c_base) = 1 / min(1, c_base): the distribution scale where c_base < 1,
    #                   plain's weight 1 where c_base >= 1 (issue 55). Rule: the rescaling exists to keep the
    #                   cross-entropies from outweighing the reconstruction in the backbone's update: plain's
    #                   w = 1 left the decoders at oracle rho 0.54-0.79 after 450 steps where 1 / c_base
    #                   (synthetic c_base 0.17: 5.9x) reached 0.29 (docs/results/aids-and-boundary.md, the
    #                   phase-boundary sweep's first version). 1 / c_base is an up-weighting only for c_base < 1;
    #                   for c_base > 1 it down-weights (SmolLM2 on E2E, c_base 2.97: 0.34, a third of plain's),
    #                   the direction that finding warns against, so the weight never goes below plain's
    #   c_base          s = 1 / c_base for every c_base (before issue 55; the same as at_least_plain for c_base <= 1)
    #   weighting       w_i as the true objective has it (no rescaling)
    hard_em_recon_scale: Literal["at_least_plain", "c_base", "weighting"] = "at_least_plain"
    # what the hard phase's router cross-entropy toward the posterior (weight 1) trains: ``detached`` = the
    # router's head only (it reads the separator state detached), so the router cannot move the body or the
    # LoRA adapters (issue 55: the decoders are trained by the reconstruction, and the posterior's
    # cross-entropy where there is a head); ``attached`` = also the body and LoRA through the separator
    # state (before issue 55). The soft phase's KL trains the router through the body either way (J's prior)
    hard_em_router_features: Literal["detached", "attached"] = "detached"
    # the KL of a confident posterior in the gate: log K (the bound) or the router's
    # actual cost -log p(k*|x) (tighter when K exceeds the number of strategies)
    handover_kl: Literal["log_k", "router"] = "log_k"
    # hand over once best < (1 - handover_margin) * collapsed: a margin starts the soft phase
    # deeper in the z-on basin (at margin 0 a run that barely passed switched off again)
    handover_margin: float = 0.0
    # what the gate's best-of-K state must beat: ``base`` = the base model's collapsed loss mean(w * b),
    # fixed at the start (seed note 000's switch-on test); ``single_value`` = the current decoder with
    # its best single value for every row, min_k mean(w * nll_k) at rate 0, so fine-tuning the decoder
    # alone cannot pass the gate (on a zero-shot real base it did: analysis/results/e2e-smollm2)
    handover_reference: Literal["base", "single_value"] = later("base")
    hard_em_max_steps: int = 600  # the hand-over to the soft objective is forced at this step
    hard_em_lr_backbone: float = 1e-4  # the prototype's hard phase rate (soft phase: lr_backbone)
    # the hard phase's rate of the heads and latent embeddings; 0 = lr_new as in the soft phase
    hard_em_lr_new: float = 0.0
    # the hard phase's E-step (k* = argmin_k nll_k) over the first ``hard_em_estep_tokens`` tokens
    # of S only (0 = all of S); the decoded value's reconstruction still covers all of S
    hard_em_estep_tokens: int = 0
    handover_check_every: int = 50  # steps between checks of the hand-over gate
    # the gate rows the hand-over gate (and the aggressive encoder's I(x; z)) is measured on: validation
    # rows that are not evaluation rows (0 = all of them), or training rows when validation has fewer
    # than this outside the evaluation rows (zfree_lab.run.split.gate_sample; config.json lists their ids)
    handover_rows: int = 500
    restart_dead_every: int = 0  # hard phase: restart values unused for this many steps (0 = off)
    restart_dead_share: float = 0.25  # a value is dead below this fraction of the uniform share 1/K
    warmup_aid_steps: int = 100  # beta0_warmup: steps at beta = 0 with the router detached
    latent_init_std: float = 0.0  # random_init_jsd: std of the latent embeddings' random start
    # aggressive_encoder (He et al. 2019, "Lagging inference networks"): before each joint step, up to
    # aggressive_max_inner posterior-only steps (the first on the step's batch, then fresh ones), stopped once
    # the summed loss of the last aggressive_inner_check of them is higher than of the ones before; the joint
    # step then updates all but the posterior side. The aggressive phase ends when the mutual information
    # I(x; z) on the gate rows (handover_rows) falls, checked every aggressive_mi_every steps (zfree.train.aids)
    aggressive_max_inner: int = 100
    aggressive_inner_check: int = 15  # inner steps compared to decide the inner loop stopped improving
    aggressive_mi_every: int = 50  # steps between the checks of I(x; z) that end the aggressive phase
    # word dropout on the decoder input (Bowman et al. 2016, "Generating Sentences from a Continuous
    # Space", sec. 3.2): in training, each y token the decoder reads is replaced by the tokenizer's
    # unknown token (its pad token without one) with this probability; targets, the posterior's view
    # and evaluation stay clean (zfree.train.word_dropout). 0 = off
    word_dropout: float = later(0.0)
    # the named remedy whose fields this config carries (zfree.objective.remedies; "a+b" composes): a
    # record that the fields were set by that entry, checked against it when a grid is expanded and a
    # run starts (zfree.objective.remedies.check_remedy_fields; "none": fields set by hand)
    remedy: str = "none"

    def __post_init__(self):
        typed_fields(self)
        check_choice("aid", self.aid, Aid)
        check_choice("hard_em_decoder", self.hard_em_decoder, Literal["posterior_argmax", "best"])
        check_choice("handover_kl", self.handover_kl, Literal["log_k", "router"])
        check_choice("handover_reference", self.handover_reference, Literal["base", "single_value"])
        check_choice("hard_em_recon_scale", self.hard_em_recon_scale, Literal["at_least_plain", "c_base", "weighting"])
        check_choice("hard_em_router_features", self.hard_em_router_features, Literal["detached", "attached"])
        for name in ("hard_em_max_steps", "hard_em_estep_tokens", "handover_check_every", "handover_rows",
                     "restart_dead_every", "warmup_aid_steps"):
            check_int(name, getattr(self, name), 0)
        check_range("hard_em_lr_backbone", self.hard_em_lr_backbone, 0.0)
        check_range("hard_em_lr_new", self.hard_em_lr_new, 0.0)
        check_range("handover_margin", self.handover_margin, 0.0, 0.99)
        check_range("restart_dead_share", self.restart_dead_share, 0.0, 1.0)
        check_range("latent_init_std", self.latent_init_std, 0.0)
        check_range("word_dropout", self.word_dropout, 0.0, 0.99)
        for name in ("aggressive_max_inner", "aggressive_inner_check", "aggressive_mi_every"):
            check_int(name, getattr(self, name), 1)
        if not isinstance(self.remedy, str) or not self.remedy.strip():
            raise ValueError(f"remedy={self.remedy!r} must be a remedy name (zfree.objective.remedies) or 'none'")
        if self.aid == "hard_em_then_soft" and self.handover_check_every < 1:
            raise ValueError("handover_check_every must be >= 1 for aid='hard_em_then_soft'")
