"""The cost model of an estimate: a run's and a grid's wall seconds from what a probe measured
(``zfree.experiment.probe.Probe``; the model is described in ``zfree.experiment.estimate``).
Pure arithmetic on the configs, except ``train_scoring_seconds`` (reads the reference's record) and
``step_memory_floor``, the memory a model's size alone rules out (reads its config.json and weight
headers, never the weights)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from zfree.config import TrainConfig
from zfree.experiment.probe import Probe
from zfree.experiment.spec import Point

#: seconds a study's run spends starting its papermill kernel and notebook beyond what a probe's
#: ``zfree train`` child measures (leaderboard study: notebook written 4-6 s after the run's own wall_s)
KERNEL_START_S = 5.0
#: an aggressive-encoder run's cost in K-way steps per step (He et al. 2019's inner posterior steps):
#: its forward tokens over a plain run's, measured 11.3x [11.0, 11.7] on the synthetic leaderboard
#: (distribution beta 0.3, 3 seeds: analysis/results/leaderboard-aggressive-distribution.json)
AGGRESSIVE_STEP_FACTOR = 11.3


def _n_evals(steps: int, every: int) -> int:
    return 1 + len(set(range(every, steps + 1, every)) | {steps})


def run_seconds(params: dict, pr: Probe, n_val: int) -> float:
    """Estimated wall seconds of one run (module docstring): setup + kernel start + steps x step +
    evaluated rows x row; a control's or oracle's steps and rows at the probe's ``given_*`` times,
    a hard-EM step at one given step + a third of a K-way step, an aggressive-encoder run's steps at
    ``AGGRESSIVE_STEP_FACTOR`` K-way steps each; where the run decodes, the probe's samples seconds
    per evaluation and multi-reference seconds once."""
    c = TrainConfig.from_flat(params)
    o, a = c.optim, c.aid
    given = c.model.latent_source != "posterior"
    soft = pr.step_s * o.batch_size / pr.batch_size
    one = (pr.step_s if pr.given_step_s is None else pr.given_step_s) * o.batch_size / pr.batch_size
    row = pr.given_eval_row_s if given and pr.given_eval_row_s is not None else pr.eval_row_s
    rows = min(o.eval_rows or n_val, n_val)
    evals = _n_evals(o.steps, o.eval_every) * rows
    hard = 0
    if a.aid == "hard_em_then_soft":
        hard = min(a.hard_em_max_steps, o.steps)
        evals += (hard // max(1, a.handover_check_every)) * min(a.handover_rows or n_val, n_val)
    step_time = o.steps * one if given else hard * (one + soft / 3) + (o.steps - hard) * soft
    if a.aid == "aggressive_encoder":
        step_time *= AGGRESSIVE_STEP_FACTOR
    decode = 0.0
    if o.decode_rows:  # the probe measured 0 where this data or latent decodes nothing
        samples = pr.given_samples_s if given and pr.given_samples_s is not None else pr.samples_s
        decode = _n_evals(o.steps, o.eval_every) * samples + (
            pr.given_decode_s if given and pr.given_decode_s is not None else pr.decode_s)
    return pr.setup_s + KERNEL_START_S + step_time + evals * row + decode


def grid_seconds(points: list[Point], pr: Probe, n_val: int, workers: int) -> float:
    """The grid's wall seconds: each point, in order, on the first free of ``workers`` workers. A
    point that needs b on the training rows (``needs_example_b``) and starts before the first such
    point has scored and cached them pays ``pr.train_scoring_s`` as well."""
    free = [0.0] * max(1, workers)
    scored = math.inf  # when the training rows' scores are in the cache
    for p in points:
        i = free.index(min(free))
        start, secs = free[i], run_seconds(p.params, pr, n_val)
        if pr.train_scoring_s and start < scored and TrainConfig.from_flat(p.params).objective.needs_example_b:
            secs += pr.train_scoring_s
            scored = min(scored, start + pr.setup_s + KERNEL_START_S + pr.train_scoring_s)
        free[i] += secs
    return max(free)


def train_scoring_seconds(points: list[Point]) -> float:
    """``Probe.train_scoring_s`` for ``points``: the training rows x the seconds a row the
    preparation's validation scoring took (``base_dir/reference/reference.json``: ``scoring_s``
    over its rows, written by ``zfree.experiment.sources.write_reference``); 0 when no point needs
    b on training rows or the rate is not recorded."""
    if not any(TrainConfig.from_flat(p.params).objective.needs_example_b for p in points):
        return 0.0
    params = points[0].params
    rj = Path(params["base_dir"]) / "reference" / "reference.json"
    try:
        meta = json.loads(rj.read_text())
        rate = float(meta["scoring_s"]) / int(meta["n_rows"])
        n_train = sum(1 for _ in open(Path(params["data_dir"]) / "train.jsonl", encoding="utf-8"))
    except (OSError, KeyError, TypeError, ValueError, ZeroDivisionError):
        return 0.0
    return rate * n_train


#: bytes a weight takes as the trainer holds it, by ``optim.precision`` (bf16 keeps float32 weights
#: and autocasts the body: ``zfree.models.precision.WEIGHT_DTYPES``)
WEIGHT_BYTES = {"fp32": 4, "bf16": 4, "fp64": 8}
#: bytes an activation or logit takes at the least, by ``optim.precision`` (bf16: the autocast body)
ACTIVATION_BYTES = {"fp32": 4, "bf16": 2, "fp64": 8}


@dataclass(frozen=True)
class ModelSize:
    """What a model folder says of its size without loading it: parameters (summed over its
    safetensors headers), vocabulary, width, depth and MLP width (``config.json``)."""
    n_params: int
    vocab: int
    d_model: int
    n_layer: int
    d_mlp: int


def _first(cfg: dict, *keys: str) -> int | None:
    v = next((cfg[k] for k in keys if isinstance(cfg.get(k), int)), None)
    return None if v is None or v <= 0 else int(v)


def model_size(folder: Path | str) -> ModelSize | None:
    """``ModelSize`` of a transformers folder (config.json + *.safetensors, read as JSON headers:
    no weights loaded); None where it cannot be read without loading (a GGUF file, .bin weights,
    a config without the usual keys): the probe then runs unchecked."""
    import struct

    f = Path(folder)
    try:
        cfg = json.loads((f / "config.json").read_text(encoding="utf-8"))
        cfg = {**cfg, **(cfg.get("text_config") or {})}
        n = 0
        for st in sorted(f.glob("*.safetensors")):
            with open(st, "rb") as fh:
                (size,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(size))
            n += sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None
    vocab, d = _first(cfg, "vocab_size"), _first(cfg, "hidden_size", "n_embd", "d_model")
    layers = _first(cfg, "num_hidden_layers", "n_layer", "num_layers")
    if not n or vocab is None or d is None or layers is None:
        return None
    return ModelSize(n, vocab, d, layers, _first(cfg, "intermediate_size", "n_inner", "ffn_dim") or 4 * d)


def mean_target_tokens(base_dir: Path | str) -> float | None:
    """The mean y tokens a row (end token included) of the reference's scored rows
    (``base_dir/reference/per_example.parquet``'s ``n_tokens``); None where it is absent."""
    f = Path(base_dir) / "reference" / "per_example.parquet"
    try:
        import pandas as pd

        n = pd.read_parquet(f, columns=["n_tokens"])["n_tokens"]
    except (OSError, ValueError, KeyError, ImportError):
        return None
    return float(n.mean()) if len(n) else None


def step_memory_floor(params: dict) -> int | None:
    """Bytes one training step of ``params`` needs at the least, from the model's size alone
    (``model_size`` of ``base_dir/model``) and the reference's mean y tokens T: the weights
    (``WEIGHT_BYTES`` a parameter); their gradient and Adam's two moments where the body trains
    (no LoRA); the residual stream and the MLP's hidden activation (d_model + d_mlp values a token
    a layer, ``ACTIVATION_BYTES`` each: float32 unless bf16), which backward needs (layer norm and
    the MLP's nonlinearity keep their inputs), for the B x K x T decoded tokens (K latent values of
    a CVAE, one for a z-free control or label oracle; B the step's rows, the micro-batch when
    accumulating); and the logits B x K x T x vocab, at most ``EVAL_LOGIT_ELEMENTS`` at once (the
    head and the evaluation chunk them). A floor, not an estimate (the saved attention and
    MLP tensors are several times more: SmolLM2-135M at batch 32, K = 4 peaked at 15.1 GB), so a
    probe it rules out could never have fitted. None where the model's size or T is unknown (a GGUF
    file): nothing is ruled out."""
    from zfree.evaluate.metrics import EVAL_LOGIT_ELEMENTS

    c = TrainConfig.from_flat(params)
    size, t = model_size(Path(c.base_dir) / "model"), mean_target_tokens(c.base_dir)
    if size is None or t is None:
        return None
    o = c.optim
    rows = o.micro_batch if 0 < o.micro_batch < o.batch_size else o.batch_size
    k = 1 if c.model.latent_source != "posterior" else max(1, c.model.n_latent)
    tokens = rows * k * t
    weights = WEIGHT_BYTES.get(o.precision, 4) * size.n_params
    trained = 3 * 4 * size.n_params if not o.lora_rank and o.lr_backbone > 0 else 0
    act = ACTIVATION_BYTES.get(o.precision, 2)
    activations = act * tokens * (size.d_model + size.d_mlp) * size.n_layer
    logits = act * min(tokens * size.vocab, EVAL_LOGIT_ELEMENTS)
    return int(weights + trained + activations + logits)
