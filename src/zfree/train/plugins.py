"""Aids and loop-changing remedies as plug-ins of the training loop (``zfree_lab.run.training``).

A plug-in is an object with the hooks of ``Plugin`` (each a no-op by default) and an ``active(cfg)``
rule; ``PLUGINS`` lists them in the order the loop calls them, and ``active_plugins(cfg)`` picks a
run's. The loop names no aid: it calls, per step,

  ``rates``            the learning rates of the step (``{"backbone": ..., "new": ...}``), each plug-in
                       free to change them (the hard phase's own rates);
  ``objective_kw``     keyword arguments of the step's objective (the beta0 warm-up's ``warm``);
  ``rows``             the step's encoded rows before they are collated (word dropout);
  ``before_update``    work before the step's forward pass (the aggressive encoder's inner loop);
  ``after_forward``    the step's breakdown, before the update (the hard phase's usage counts);
  ``trained_side``     which side the update changes ("all", "posterior", "decoder"; the first
                       plug-in that names one other than "all" decides);
  ``after_update``     checks after the update (dead-value restarts and the hand-over gate; the
                       aggressive phase's end);
  ``summary``          the keys a plug-in adds to summary.json (besides ``TrainState``'s aid keys).

Adding a remedy that changes the loop is its config field (``zfree.config.aid``) and its entry in
``zfree.objective.remedies`` carrying a ``Plugin`` (the protocol, ``zfree.objective.plugin_api``) as its
hook, which ``PLUGINS`` lists; a plug-in that needs the train layer (the aids' state, the model) is a
module of its own with one line in ``PLUGINS`` (``zfree.train.word_dropout`` is the example).
The state a plug-in keeps between steps lives in ``TrainState`` fields it owns (``owns``), so a
checkpoint holds it and a resumed run continues exactly.
"""

from __future__ import annotations

from typing import Sequence

from zfree.config import TrainConfig
from zfree.objective.objectives import Phase
from zfree.objective.remedies import REMEDY_ENTRIES
from zfree.train import aids
from zfree.objective.plugin_api import Plugin, StepContext  # noqa: F401  (the protocol; re-exported)
from zfree.train.word_dropout import WordDropout


class FrozenDecoder(Plugin):
    """The frozen-decoder warm phase: the first ``frozen_decoder_steps`` steps train only the
    posterior side (``aids.FrozenDecoderMask``; docs/concepts/aids.md: symmetry breaking by the
    posterior first)."""

    name, fields = "frozen_decoder", ("frozen_decoder_steps",)
    source = "docs/concepts/aids.md: symmetry breaking by the posterior first"

    def active(self, cfg):
        """On when ``frozen_decoder_steps`` > 0."""
        return cfg.optim.frozen_decoder_steps > 0

    def trained_side(self, cfg, state, step):
        """The "posterior" side through step ``frozen_decoder_steps`` (1-based), "all" after it."""
        return "posterior" if aids.frozen_decoder_phase(cfg, step) else "all"


class HardEM(Plugin):
    """Hard EM, then the true objective (``aid = "hard_em_then_soft"``; seed notes 000/002; Shen et al.
    2019, "Mixture models for diverse machine translation", hard-EM training): the hard phase's rates,
    the posterior's argmax counts, dead-value restarts and the gated hand-over (``zfree.train.aids``)."""

    name = "hard_em"
    fields = ("aid", "hard_em_decoder", "hard_em_recon_scale", "handover_kl", "handover_margin", "hard_em_max_steps",
              "hard_em_lr_backbone", "hard_em_lr_new", "hard_em_estep_tokens", "handover_check_every",
              "handover_rows", "restart_dead_every", "restart_dead_share")
    owns = ("phase", "handover_step", "handover_forced", "gate", "restarts", "usage")
    source = "seed notes 000/002 (switch-on); Shen et al. 2019, hard-EM mixture training"

    def active(self, cfg):
        """On when ``aid == "hard_em_then_soft"``."""
        return cfg.aid.aid == "hard_em_then_soft"

    def initial_phase(self, cfg):
        """A fresh run starts in the hard phase (``Phase.HARD``)."""
        return Phase.HARD

    def rates(self, cfg, state, step, rates):
        """In the hard phase: the backbone at ``hard_em_lr_backbone`` (times the linear warm-up
        ``min(1, step / warmup_backbone)`` while ``warmup_backbone`` > 0) and the new group at
        ``aids.new_lr`` (``hard_em_lr_new`` when > 0, else ``lr_new``); in the soft phase ``rates``
        unchanged."""
        if state.phase != Phase.HARD:
            return rates
        warm = min(1.0, step / cfg.optim.warmup_backbone) if cfg.optim.warmup_backbone else 1.0
        return {**rates, "backbone": cfg.aid.hard_em_lr_backbone * warm, "new": aids.new_lr(cfg, Phase.HARD)}

    def after_forward(self, ctx, br):
        """In the hard phase: add the posterior's argmax over ``br.per_example["q_logits"]``
        (batch, K) to the usage counts ``state.usage`` (K,) that the dead-value restarts read."""
        if ctx.run.state.phase == Phase.HARD:  # dead-value restarts count the posterior's argmax
            aids.count_usage(ctx.run.state, br.per_example["q_logits"].argmax(-1), ctx.run.model.n_latent)

    def after_update(self, ctx):
        """In the hard phase: dead-value restarts, then the hand-over gate on ``ctx.gate_rows``
        with their base surprisal b and c_base (nats per token) (``aids.check_handover``); may
        switch ``state.phase`` to soft and record ``handover_step``/``gate``."""
        run = ctx.run
        if run.state.phase == Phase.HARD:  # restarts, then the hand-over gate (in that order)
            aids.restart_dead_values(run.model, ctx.cfg, run.state, ctx.step)
            aids.check_handover(run.model, ctx.cfg, run.state, ctx.step, ctx.gate_rows,
                                run.data.gate_b, run.data.c_base, run.data.pad_id)


class AggressiveEncoder(Plugin):
    """He et al. 2019, "Lagging Inference Networks and Posterior Collapse in VAEs", Alg. 1: posterior-only
    inner steps before each joint step, the joint step updating the decoder side, until the mutual
    information falls (``aid = "aggressive_encoder"``; ``zfree.train.aids``)."""

    name = "aggressive"
    fields = ("aid", "aggressive_max_inner", "aggressive_inner_check", "aggressive_mi_every", "handover_rows")
    owns = ("aggressive_end_step", "aggressive_inner_steps", "aggressive_mi")
    source = "He et al. 2019, Alg. 1 (their text.py)"

    def active(self, cfg):
        """On when ``aid == "aggressive_encoder"``."""
        return cfg.aid.aid == "aggressive_encoder"

    def before_update(self, ctx, rows):
        """While the aggressive phase lasts: posterior-only inner updates through ``ctx.update``,
        the first on the step's ``rows``, the next on fresh batches of ``batch_size`` training rows
        drawn with the run's RNG, stopped by ``aids.aggressive_inner_steps``' rule; adds their number
        to ``state.aggressive_inner_steps``."""
        state = ctx.run.state
        if not aids.aggressive_phase(ctx.cfg, state):
            return
        data, cfg = ctx.run.data, ctx.cfg

        def update(i: int):
            batch = rows if i == 1 else [data.train[j] for j in
                                         ctx.run.rng.integers(0, len(data.train), cfg.optim.batch_size)]
            return ctx.update(ctx, batch, "posterior")

        state.aggressive_inner_steps += aids.aggressive_inner_steps(cfg, update)

    def trained_side(self, cfg, state, step):
        """The "decoder" side (all but the posterior) while the aggressive phase lasts, then "all"."""
        return "decoder" if aids.aggressive_phase(cfg, state) else "all"

    def after_update(self, ctx):
        """Every ``aggressive_mi_every`` steps of the aggressive phase: I(x; z) in nats on the gate
        rows; ends the phase (``state.aggressive_end_step``) once it falls (``aids.check_aggressive_end``)."""
        aids.check_aggressive_end(ctx.run.model, ctx.cfg, ctx.run.state, ctx.step, ctx.gate_rows, ctx.run.data.pad_id)


class Beta0Warmup(Plugin):
    """beta = 0 with the router detached for the first ``warmup_aid_steps`` steps (``aid =
    "beta0_warmup"``; the prototype's warm-up, docs/concepts/aids.md)."""

    name, fields = "beta0_warmup", ("aid", "warmup_aid_steps")
    source = "the prototype's warm-up (docs/concepts/aids.md)"

    def active(self, cfg):
        """On when ``aid == "beta0_warmup"``."""
        return cfg.aid.aid == "beta0_warmup"

    def objective_kw(self, cfg, state, step):
        """``{"warm": True}`` through step ``warmup_aid_steps`` (beta = 0, router detached in the
        objective), ``{"warm": False}`` after it."""
        return {"warm": aids.beta0_warm(cfg, step)}


#: every plug-in, in the order the loop calls their hooks (WordDropout: its own module), then the hooks of
#: the remedy entries that carry one (``zfree.objective.remedies.Remedy.plugin``), in registry order
PLUGINS: list[Plugin] = [FrozenDecoder(), HardEM(), AggressiveEncoder(), Beta0Warmup(), WordDropout(),
                         *(r.plugin for r in REMEDY_ENTRIES.values() if r.plugin is not None)]


def active_plugins(cfg: TrainConfig) -> list[Plugin]:
    """The plug-ins ``cfg`` uses, in ``PLUGINS`` order."""
    return [p for p in PLUGINS if p.active(cfg)]


def initial_phase(cfg: TrainConfig) -> Phase:
    """The phase a fresh run starts in: the first active plug-in's that names one, else soft."""
    for p in active_plugins(cfg):
        if (phase := p.initial_phase(cfg)) is not None:
            return phase
    return Phase.SOFT


def trained_side(plugins: Sequence[Plugin], cfg: TrainConfig, state, step: int) -> str:
    """The side a step's update changes: the first plug-in's answer other than "all", else "all"."""
    for p in plugins:
        if (side := p.trained_side(cfg, state, step)) != "all":
            return side
    return "all"
