# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Train one CVAE
#
# One run of the shared discrete CVAE (docs/concepts/problem.md) under the objective of docs/concepts/weightings.md.
# The parameters cell maps one to one onto the flat `zfree.config.TrainConfig`; papermill
# overrides it. The run folder (docs/reference/artifacts.md) is the output; this notebook only shows it.

# %% tags=["parameters"]
out_dir = "runs/train_cvae_example"  # the run folder
progress = True  # tqdm bar
data_dir = '../data/synth/default'  # relative to notebooks/
base_dir = '../data/base/default'
weighting = 'plain'
beta = 1.0
epsilon = 0.0
token_alpha = 1.0
token_outer = 'none'
lambda_jsd = 0.0
free_bits = 0.0
free_bits_mode = 'none'
beta_schedule = 'constant'
beta_warmup_steps = 0
beta_cycle_steps = 0
beta_ratio_zero = 0.0
beta_ratio_increase = 0.5
ae_steps = 0
c_base_source = 'entangled_run'
latent_kind = 'discrete'
n_latent = 4
posterior_features = 'mean_y'
d_latent = 16
n_samples = 1
prior = 'learned'
shared_prefix = 'auto'
injection = 'embedding'
latent_capacity = 'per_value'
latent_source = 'posterior'
bn_gamma = 0.0
delta_rate = 0.0
steps = 300
batch_size = 64
lr_backbone = 3e-05
lr_new = 0.001
warmup_backbone = 100
frozen_decoder_steps = 0
weight_decay = 0.0
grad_clip = 1.0
router_clip = 'own'
eval_every = 100
eval_rows = 500
decode_rows = 200
seed = 0
threads = 1
device = 'auto'
precision = 'fp32'
checkpoint_every = 0
optimizer = 'adamw'
lora_rank = 0
lora_alpha = 16.0
lora_targets = 'auto'
micro_batch = 0
keep_prev_checkpoint = False
compile = False
tensorboard = True
wandb = 'off'
aid = 'none'
hard_em_decoder = 'posterior_argmax'
hard_em_recon_scale = 'at_least_plain'
hard_em_router_features = 'detached'
handover_kl = 'log_k'
handover_margin = 0.0
handover_reference = 'base'
hard_em_max_steps = 600
hard_em_lr_backbone = 0.0001
hard_em_lr_new = 0.0
hard_em_estep_tokens = 0
handover_check_every = 50
handover_rows = 500
restart_dead_every = 0
restart_dead_share = 0.25
warmup_aid_steps = 100
latent_init_std = 0.0
aggressive_max_inner = 100
aggressive_inner_check = 15
aggressive_mi_every = 50
word_dropout = 0.0
remedy = 'none'

# %%
# Build and validate the config first: a bad parameter fails here, before any work.
from zfree.config import TrainConfig

cfg = TrainConfig.from_flat({k: globals()[k] for k in TrainConfig.flat_fields()})
cfg

# %%
from zfree.train.training import train_cvae

summary = train_cvae(cfg, out_dir, progress=progress)

# %%
import pandas as pd

from zfree.core.io import read_jsonl
from zfree_lab.report.plotting import plot_training_curves
from zfree_lab.report.report import show

metrics = pd.DataFrame(read_jsonl(f"{out_dir}/metrics.jsonl"))
show(plot_training_curves({f"{cfg.objective.weighting} β={cfg.objective.beta:g}": metrics}))

# %%
pd.Series({k: v for k, v in summary.items() if "/" in k}).to_frame("final")
