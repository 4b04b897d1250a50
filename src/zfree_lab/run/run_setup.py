"""Building a CVAE run before its first step (``zfree_lab.run.training`` runs the loop): the CVAE on
the base model (``build_cvae``), the optimizer's param groups, their per-step rates and their
gradient clipping (``build_optimizer``, ``step_rates``, ``clip_gradients``), the resumable
``TrainState``, and ``setup_run``, which checks the inputs and the run folder, loads the base and
the reference, writes config.json and resumes from a checkpoint.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from zfree.config import LatentKind, LatentSource, OptimConfig, TrainConfig, check_run_inputs
from zfree_lab.run.text_oracle import write_text_data
from zfree.models.base import load_base
from zfree.models.continuous import ContinuousCVAE
from zfree.models.discrete import DiscreteCVAE
from zfree.models.loading import check_eos, pick_device
from zfree.models.lora import apply_lora
from zfree.models.precision import FROZEN_DTYPES, WEIGHT_DTYPES, default_dtype, store_frozen_weights
from zfree.objective.objectives import Phase
from zfree.objective.remedies import check_remedy_fields
from zfree.train import accumulate, plugins
from zfree_lab.run import checkpoint, run_folder
from zfree_lab.run.checkpoint_parts import frozen_base_sha
from zfree_lab.run.live_curves import LiveCurves, open_curves
from zfree_lab.run.run_data import RunData, setup_data

#: the optimizer's param groups, by name (``build_optimizer``; rates set by ``set_learning_rates``): the
#: backbone, the new parameters of the decoder and posterior side, and the router p(z | x) (issue 55)
BACKBONE_GROUP, NEW_GROUP, ROUTER_GROUP = "backbone", "new", "router"
#: a text oracle's data folder inside its run folder: the run's rows with the label written into x
TEXT_DATA_DIR = "text_data"


@dataclass
class TrainState:
    """Everything besides weights and optimizer moments that a resumed run needs."""

    step: int = 0
    phase: Phase = Phase.SOFT  # HARD during the hard-EM phase of hard_em_then_soft
    handover_step: int | None = None
    handover_forced: bool = False
    gate: list = field(default_factory=list)  # hand-over diagnostics over training
    restarts: list = field(default_factory=list)
    usage: list = field(default_factory=list)  # posterior-argmax counts since the last restart check
    train_log: dict = field(default_factory=dict)  # running sums of training terms since the last eval
    forward_tokens: int = 0  # token positions forwarded through the decoder body in training (zfree_lab.run.compute)
    eval_wall_s: float = 0.0  # wall time spent evaluating (the training wall time is the rest)
    checkpoint_after_row_s: float = 0.0  # the last evaluation's checkpoint: in eval_wall_s, after its row's wall_s
    first_step_s: float | None = None  # wall seconds of step 1 (no evaluation): its warm-up, for the estimate
    # aggressive_encoder (He et al. 2019): the step its aggressive phase ended (None: not (yet)), the
    # posterior-only inner steps in all, and the mutual-information checks ({step, mutual_information, inner_steps})
    aggressive_end_step: int | None = None
    aggressive_inner_steps: int = 0
    aggressive_mi: list = field(default_factory=list)

    def __post_init__(self):
        self.phase = Phase(self.phase)  # a checkpoint stores the value ("hard", "soft")


def build_cvae(cfg: TrainConfig, backbone: torch.nn.Module) -> DiscreteCVAE | ContinuousCVAE:
    """The CVAE of ``cfg.model.latent_kind`` on ``backbone`` (the latent embeddings start at 0, or
    at N(0, latent_init_std^2) under the random_init_jsd aid), moved to ``cfg.optim.device``
    ("auto": cuda when present) in train mode, its decoder passes under ``cfg.model.shared_prefix``
    (auto / on / off; off also skips the z-free pass's key/value cache), the latent entering through
    ``cfg.model.injection`` (``zfree.models.routes``) as ``cfg.model.latent_capacity`` says (its own vector
    per value, or deltas on one shared vector); LoRA adapters only with lora_rank > 0."""
    m = cfg.model
    with default_dtype(next(backbone.parameters()).dtype):  # new heads in the backbone's dtype
        if m.latent_kind == LatentKind.CONTINUOUS:
            model = ContinuousCVAE(backbone, m.d_latent, m.posterior_features, prior=m.prior, n_samples=m.n_samples,
                                   bn_gamma=m.bn_gamma, delta_rate=m.delta_rate, injection=m.injection,
                                   latent_capacity=m.latent_capacity)
        else:
            model = DiscreteCVAE(backbone, m.n_latent, m.posterior_features,
                                 latent_init_std=cfg.aid.latent_init_std if cfg.aid.aid == "random_init_jsd" else 0.0,
                                 latent_source=m.latent_source, injection=m.injection,
                                 latent_capacity=m.latent_capacity)
        if cfg.optim.lora_rank:  # LoRA over the frozen base: B = 0, still exact at step 0
            apply_lora(model.backbone, cfg.optim.lora_rank, cfg.optim.lora_alpha, cfg.optim.lora_targets)
    model.shared_prefix_mode = m.shared_prefix
    model.shared_prefix = m.shared_prefix != "off"
    return model.to(pick_device(cfg.optim.device)).train()


def store_frozen_body(model: torch.nn.Module, optim: OptimConfig) -> int:
    """Store the backbone's frozen weights in ``optim.precision``'s ``FROZEN_DTYPES`` dtype
    (``bf16``: bfloat16 for every backbone parameter that does not train: a LoRA run's base; nothing
    for full fine-tuning, whose float32 master weights train under autocast; ``zfree.models.precision``).
    Returns the number of elements cast. ``build_optimizer`` calls it, after ``build_cvae`` (LoRA
    decides what trains) and before the param groups are read; the base's hash (config.json, checked
    on resume) is of the weights as loaded, so record it first; so is a partial checkpoint's frozen-base
    hash, computed here before the cast (``checkpoint_parts.frozen_base_sha``: checkpoints of fp32 and bf16
    runs name the same base)."""
    dtype = FROZEN_DTYPES[optim.precision]
    if dtype is not None and optim.lora_rank:  # (build_cvae adds LoRA adapters iff lora_rank > 0)
        frozen_base_sha(model)  # cached on the model: of the weights as loaded
    return store_frozen_weights(model.backbone, dtype)


#: torch.compile's backend for ``compile: true`` (tests/test_compile.py uses "aot_eager": dynamo's tracing
#: and autograd without inductor's code generation, which takes minutes per graph on a loaded CPU)
COMPILE_BACKEND = "inductor"


def compile_body(model: torch.nn.Module, backend: str | None = None) -> torch.nn.Module:
    """``torch.compile`` the backbone's body in place (``nn.Module.compile``, dynamic shapes: batches
    differ in length), so every pass through it (the z-free pass, the decoder's passes over the y-region,
    evaluation's) runs compiled; the output head keeps its eager path (``zfree.models.head`` calls the
    model with its body swapped out). Returns ``model``. Raises RuntimeError when torch.compile cannot run
    here (``torch._dynamo.is_dynamo_supported``)."""
    import torch._dynamo

    if not torch._dynamo.is_dynamo_supported():
        raise RuntimeError("compile: true, but torch.compile is not supported on this Python / platform")
    model.backbone.base_model.compile(dynamic=True, backend=backend or COMPILE_BACKEND)
    return model


def build_optimizer(model: DiscreteCVAE, optim: OptimConfig, log=print) -> torch.optim.Optimizer:
    """The optimizer of ``model`` as it trains: its body compiled first under ``optim.compile``
    (``compile_body``) and its frozen weights stored in their dtype (``store_frozen_body``: call after
    the base's hash is recorded), then AdamW (or SGD) with every trainable parameter in exactly one of
    three groups (checked at start):
    ``backbone`` (lr_backbone, warmed up), ``new`` (posterior side and latent embeddings, lr_new) and
    ``router`` (the model's ``ROUTER_MODULES``: the router p(z | x), at the new group's rate; its own
    group so that ``clip_gradients`` clips it on its own, issue 55). Adam's moments are per parameter
    and the router's rate is the new group's, so the split changes no update by itself.
    Raises RuntimeError if the groups do not partition the trainable parameters."""
    if optim.compile:
        compile_body(model)
    store_frozen_body(model, optim)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    routers = getattr(model, "ROUTER_MODULES", ())
    backbone = [p for n, p in named if n.startswith("backbone.")]
    router = [p for n, p in named if n.split(".")[0] in routers]
    new = [p for n, p in named if not n.startswith("backbone.") and n.split(".")[0] not in routers]
    ids = [id(p) for p in backbone + new + router]
    if len(ids) != len(set(ids)) or len(ids) != len(named):
        raise RuntimeError("optimizer groups do not partition the trainable parameters")
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    if log:
        new_names = [n for n, _ in model.named_parameters()  # (the model's new_parameter_names less the router)
                     if not n.startswith("backbone.") and n.split(".")[0] not in routers]
        log(f"parameters: backbone {sum(p.numel() for p in backbone):,} (from the base model), "
            f"new {sum(p.numel() for p in new):,} ({', '.join(new_names)}), router {sum(p.numel() for p in router):,}, "
            f"frozen {frozen:,}")
    groups = [{"params": backbone, "lr": optim.lr_backbone, "name": BACKBONE_GROUP},
              {"params": new, "lr": optim.lr_new, "name": NEW_GROUP},
              {"params": router, "lr": optim.lr_new, "name": ROUTER_GROUP}]
    return OPTIMIZERS[optim.optimizer](groups, weight_decay=optim.weight_decay)


def clip_gradients(opt: torch.optim.Optimizer, max_norm: float, router_clip: str = "own") -> None:
    """Clip the gradients of ``opt``'s parameters to L2 norm ``max_norm`` (``OptimConfig.grad_clip``; 0:
    no clipping) as ``router_clip`` says: ``own`` = the router group's norm on its own and the other
    groups' (the decoder and posterior side) jointly, so the router's gradient cannot rescale the
    decoder's update (issue 55); ``global`` = one norm over every group (before issue 55). Call
    between ``backward`` and ``opt.step()``. Raises KeyError listing the choices for another ``router_clip``."""
    if router_clip not in CLIP_SETS:
        raise KeyError(f"router_clip={router_clip!r} is not one of {sorted(CLIP_SETS)}")
    if max_norm <= 0:
        return
    for names in CLIP_SETS[router_clip]:
        params = [p for g in opt.param_groups if g["name"] in names for p in g["params"]]
        if params:
            torch.nn.utils.clip_grad_norm_(params, max_norm)


#: router_clip -> the sets of param groups clipped together, each to its own norm
CLIP_SETS = {"own": ({BACKBONE_GROUP, NEW_GROUP}, {ROUTER_GROUP}),
             "global": ({BACKBONE_GROUP, NEW_GROUP, ROUTER_GROUP},)}


def set_learning_rates(opt: torch.optim.Optimizer, rates: dict[str, float]) -> None:
    """Set each param group's rate by its name (``BACKBONE_GROUP``, ``NEW_GROUP``, ``ROUTER_GROUP``);
    KeyError for a group ``rates`` does not name."""
    for group in opt.param_groups:
        group["lr"] = rates[group["name"]]


#: optim.optimizer -> the torch optimizer class
OPTIMIZERS = {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}


def step_rates(cfg: TrainConfig, state, step: int, active: list) -> dict[str, float]:
    """The learning rates of ``step`` (1-based) by param-group name: lr_backbone times the linear warm-up
    min(1, step / warmup_backbone) and lr_new, then as each active plug-in sets them
    (``plugins.Plugin.rates``: the hard phase's own rates); the router's is the new group's. Every rate is
    then scaled by ``lr_decay_factor`` (the final linear decay, ``lr_decay_share``)."""
    warm = min(1.0, step / cfg.optim.warmup_backbone) if cfg.optim.warmup_backbone else 1.0
    rates = {BACKBONE_GROUP: cfg.optim.lr_backbone * warm, NEW_GROUP: cfg.optim.lr_new}
    for p in active:
        rates = p.rates(cfg, state, step, rates)
    f = lr_decay_factor(step, cfg.optim.steps, cfg.optim.lr_decay_share)
    return {k: v * f for k, v in {**rates, ROUTER_GROUP: rates[NEW_GROUP]}.items()}


def lr_decay_factor(step: int, steps: int, share: float) -> float:
    """The rate multiplier of step ``step`` (1-based) of ``steps`` under a final linear decay over the last
    ``share`` of them (warm-up, stable, decay): 1 before the last D = max(1, round(share * steps)) steps, then
    (steps - step + 1) / (D + 1), so the last step's rate is 1 / (D + 1) of the stable one and none is 0 (a
    step at rate 0 would be a wasted step). ``share`` 0: 1 throughout."""
    if share <= 0:
        return 1.0
    d = max(1, round(share * steps))
    return min(1.0, (steps - step + 1) / (d + 1))


# ---------------------------------------------------------------------------- the run


@dataclass
class Run:
    """A run ready to train: its folder, model, data, optimizer, numpy RNG (batch draws), state and clock."""

    out: Path
    model: DiscreteCVAE | ContinuousCVAE
    data: RunData
    opt: torch.optim.Optimizer
    rng: np.random.Generator
    state: TrainState
    t0: float  # wall-clock origin (continued on resume)
    curves: LiveCurves | None = None  # TensorBoard's writer of the run folder (cfg.optim.tensorboard)
    plugins: list = field(default_factory=list)  # the active training-loop plug-ins (zfree.train.plugins)
    saved_step: int | None = None  # the step of the last checkpoint written (None: none yet)
    row_step: int | None = None  # the step of metrics.jsonl's last row kept on resume (None: none)


def setup_run(cfg: TrainConfig, out: Path, progress: bool) -> Run:
    """Check the inputs and the base model (the folder's config is checked first: ``train_cvae``), load
    the base, read the data and its reference (``setup_data``), build model and optimizer, write
    config.json, and resume from a checkpoint.
    A text oracle (``latent_source`` "text:<key>") first writes its rows with the label in x to
    ``out/TEXT_DATA_DIR`` (``zfree_lab.run.text_oracle``) and reads them in place of ``data_dir``: its
    reference (b, c_base) is scored by the base on that x (``pretrained_source``), whatever
    ``c_base_source`` says, since a stored reference is of the x without the label. A prefix run
    (``injection: prefix``) reads every b through the route's initial soft token, scored once into the run
    folder (``zfree.reference.prefix``), whatever ``c_base_source`` says: the base run's is of (x, y) without it."""
    torch.set_num_threads(cfg.optim.threads)
    torch.manual_seed(cfg.optim.seed)
    accumulate.check_accumulation(cfg)
    check_remedy_fields(cfg)  # a remedy's name is a record of its fields
    data_dir, base_dir = check_run_inputs(cfg.data_dir, cfg.base_dir)
    backbone, tok = load_base(base_dir / "model", device=cfg.optim.device, dtype=WEIGHT_DTYPES[cfg.optim.precision])
    check_eos(tok, base_dir / "model")  # every y ends with it, and decoding stops there
    source, ref_source = LatentSource.parse(cfg.model.latent_source), cfg.objective.c_base_source
    if source.kind == "text":  # the label written into x: every row, b and c_base read that x
        data_dir, _ = write_text_data(data_dir, out / TEXT_DATA_DIR, source.label, tok)
        ref_source = "pretrained_source"
    run_folder.check_same_base(out, backbone, base_dir)  # before a prefix run's reference is stored in out
    data = setup_data(cfg, backbone, tok, data_dir, base_dir, ref_source, out)  # scored by the base as loaded
    model = build_cvae(cfg, backbone)
    if data.given is not None:
        model.set_given(data.given)
    out.mkdir(parents=True, exist_ok=True)
    run_folder.write_config_record(out, cfg, data.c_base, data.reference, data_dir, backbone, rows_used=data.rows_used,
                                   gate_rows=data.gate_record)
    opt = build_optimizer(model, cfg.optim, log=print if progress else None)  # after the base's hash is recorded
    rng = np.random.default_rng(cfg.optim.seed)
    state = checkpoint.load_checkpoint(out, model, opt, rng, TrainState)
    done_rows = run_folder.reset_metrics(out, None if state is None else state.step)
    t0 = time.time() - (done_rows[-1].get("wall_s", 0.0) if done_rows else 0.0)  # wall time continues on resume
    curves = open_curves(out, cfg.optim.tensorboard, None if state is None else state.step, cfg.optim.wandb,
                         cfg.to_flat())
    return Run(out, model, data, opt, rng, state or TrainState(phase=plugins.initial_phase(cfg)), t0, curves,
               plugins.active_plugins(cfg), saved_step=None if state is None else state.step,
               row_step=done_rows[-1].get("step") if done_rows else None)
