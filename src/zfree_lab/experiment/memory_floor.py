"""The memory a model's size alone rules out, before any probe runs (``step_memory_floor``): read
from the model folder's config.json and the JSON headers of its safetensors files (``model_size``:
no weight is loaded) and the reference's mean y tokens. ``zfree_lab.experiment.probe.probe`` skips a probe
whose floor is over its ceiling; the cost model of the probes' times is ``zfree_lab.experiment.cost``."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from zfree.config import TrainConfig


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
    from zfree_lab.run.metrics import EVAL_LOGIT_ELEMENTS

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
