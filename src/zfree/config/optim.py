"""The optimizer, schedule, evaluation and run-mechanics fields of a CVAE run (``OptimConfig``, the
``optim`` part of ``zfree.config.TrainConfig``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from zfree.config.later import later
from zfree.core.validation import check_choice, check_int, check_range
from zfree.core.values import typed_fields


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with two groups: backbone (low rate, warm-up) and new heads (the step-0 contract:
    docs/concepts/problem.md#models)."""

    steps: int = 300  # optimizer steps
    batch_size: int = 64  # rows a step
    lr_backbone: float = 3e-5  # one rate of 3e-4 for all damaged the backbone (rho_recon ~ 1.1)
    lr_new: float = 1e-3  # rate of the new parameters: posterior and router heads, latent embeddings
    warmup_backbone: int = 100  # linear warm-up of the backbone rate
    # the share (0 to 1) of the run's last steps over which every rate falls linearly towards 0 (warm-up,
    # stable, decay: Hu et al. 2024, MiniCPM; Hägele et al. 2024); 0 = the rates stay constant to the end.
    # At constant rates the last update decides where a run ends: an embedding oracle on the synthetic
    # benchmark read 0.0008-0.0063 nats/token every 25 steps over its last 400 and 0.014 after its last
    # step (analysis/results/oracle-routes-synth/README.md)
    lr_decay_share: float = later(0.0)
    # frozen-decoder warm phase: for the first frozen_decoder_steps steps only the posterior side
    # (posterior head, attention query, separate encoder) is updated; backbone, router and latent
    # embeddings stay as they are
    frozen_decoder_steps: int = 0
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    grad_clip: float = 1.0  # clip the gradient norm to this (0 = no clipping); which norm: router_clip
    # own: the router p(z | x) (its head: zfree_lab.run.run_setup.ROUTER_GROUP) is clipped on its own at
    # grad_clip and everything else (backbone or LoRA, latent embeddings, posterior side) jointly, so the
    # router's gradient never rescales the decoder's update; a given z's probe then cannot change the
    # decoder's training at all (issue 55: under one global norm the oracle's probe shrank every decoder step,
    # the control's, whose router has no gradient, never). global: one norm over all parameters (before issue 55)
    router_clip: Literal["own", "global"] = "own"
    eval_every: int = 100  # steps between evaluations (also at step 0 and at the end)
    eval_rows: int = 500  # validation rows used by evaluation (0 = all)
    decode_rows: int = 200  # rows greedily decoded for task/correctness (0 = skip)
    seed: int = 0  # seeds initialization, batches and sampling
    threads: int = 1  # torch threads; one per worker when runs go in parallel
    device: str = "auto"  # "auto": cuda when available, else cpu (zfree.models.loading.pick_device)
    # fp32: everything in float32; bf16: the backbone body under bfloat16 autocast on CUDA, the
    # output head, log-softmax and the losses in float32 (as zfree.reference.scoring does). Allowed on CPU
    # (slower there), hence not the default. fp64: weights, optimizer, head and losses in float64,
    # a reference mode (several times slower; CPU kernels then differ by ~1e-16, so the golden runs
    # of tests/golden_runs.py replay portably on any CPU)
    precision: Literal["fp32", "bf16", "fp64"] = "fp32"
    checkpoint_every: int = 0  # steps between resumable checkpoints (0 = only at evaluations)
    # also a checkpoint once this many seconds have passed since the last one (0 = off), so a stopped run
    # loses at most about this much training whatever checkpoint_every says; a checkpoint changes no
    # number, so it is not part of a run's identity (LOG_ONLY_FIELDS)
    checkpoint_every_s: float = 600.0
    # adamw is invariant to the scale of the loss, so `distribution` at beta trains like `plain` at
    # beta * c_base; sgd is not (kept to show the difference)
    optimizer: Literal["adamw", "sgd"] = "adamw"
    # what trains in the backbone: 0 = all of it; r >= 1 = LoRA adapters of rank r over the
    # frozen base (zfree.models.lora; lr_backbone is their rate; exact at step 0), checkpoints then hold
    # only what trains; lora_targets "auto" = peft's default modules for the architecture
    lora_rank: int = 0
    lora_alpha: float = 16.0  # LoRA scaling alpha (the update is scaled by alpha / rank)
    lora_targets: str = "auto"  # "auto" or comma-separated module names that get adapters
    # gradient accumulation: each step's batch in chunks of micro_batch rows (0 = all at once), the same
    # objective (a batch mean; zfree.train.accumulate), set by a study whose grid would not fit in memory
    micro_batch: int = 0
    keep_prev_checkpoint: bool = False  # a finished run keeps checkpoint.prev/ too (default: checkpoint/ only)
    # torch.compile the backbone's body (zfree_lab.run.run_setup.compile_body: dynamic shapes), for training and
    # evaluation; results equal eager's up to float rounding (tests/test_compile.py); the first steps of each
    # shape pay the compilation (minutes on a CPU), so it pays off on long runs on an accelerator
    compile: bool = later(False)
    # live curves: every metrics.jsonl row also as TensorBoard scalars beside it (zfree_lab.run.live_curves;
    # nothing written without the tensorboard package). What a run writes, not what it computes: not
    # part of a run's identity (LOG_ONLY_FIELDS)
    tensorboard: bool = True
    # the same rows logged to Weights & Biases in offline mode ("offline": a wandb/ folder in the run
    # folder, uploaded later with `wandb sync`; needs the optional package: pip install zfree[wandb]);
    # log-only, like tensorboard
    wandb: Literal["off", "offline"] = "off"

    def __post_init__(self):
        typed_fields(self)
        check_int("checkpoint_every", self.checkpoint_every, 0)
        check_range("checkpoint_every_s", self.checkpoint_every_s, 0.0)
        check_int("lora_rank", self.lora_rank, 0)
        check_int("micro_batch", self.micro_batch, 0)
        check_range("lora_alpha", self.lora_alpha, 0.0, lo_open=True)
        if not isinstance(self.lora_targets, str) or not self.lora_targets.strip():
            raise ValueError(f"lora_targets={self.lora_targets!r} must be 'auto' or comma-separated module names")
        check_choice("optimizer", self.optimizer, Literal["adamw", "sgd"])
        check_choice("router_clip", self.router_clip, Literal["own", "global"])
        check_choice("wandb", self.wandb, Literal["off", "offline"])
        check_choice("precision", self.precision, Literal["fp32", "bf16", "fp64"])
        if not isinstance(self.device, str) or not self.device:
            raise ValueError(f"device={self.device!r} must be a device name ('auto', 'cpu', 'cuda', 'cuda:N')")
        for name in ("steps", "batch_size", "eval_every", "threads"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} must be an integer >= 1")
        for name in ("warmup_backbone", "eval_rows", "decode_rows", "frozen_decoder_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= 0")
        for name in ("lr_backbone", "lr_new", "weight_decay", "grad_clip"):
            check_range(name, getattr(self, name), 0.0)
        check_range("lr_decay_share", self.lr_decay_share, 0.0, 1.0)
