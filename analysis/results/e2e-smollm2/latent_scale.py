"""How large is the injected latent next to the tokens it is added to? For a run's checkpoint: the L2 norm
of each latent value's vector, the one the injection route receives (``DiscreteCVAE.latent_vectors``:
``latent_embedding.weight`` row k under ``latent_capacity: per_value``; s + δ_k under ``shared_delta``,
s the shared vector ``latent_shared`` every arm trains, δ_k the row), against the norms of the base
model's token embeddings (median and 99th percentile over the vocabulary). A latent many times the size
of a token embedding replaces rather than annotates the input the frozen body reads. With K > 1 values
it also prints the cosine between each pair of values and the norm of their difference: two values
that point the same way act as one shared bias, whatever the label says. Under ``shared_delta`` it
also prints the norm of s and of each δ_k (the differences are the δ's: s cancels).

    .venv/bin/python analysis/results/e2e-smollm2/latent_scale.py runs/e2e-smollm2/runs/<run> [MODEL_FOLDER]

MODEL_FOLDER: the base model's transformers folder (default: zfree's fetched SmolLM2-135M-Instruct).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file


def latent_vectors(ck: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray | None]:
    """(the K vectors the route receives (K, d), the shared vector s (d,) or None) from a checkpoint's
    tensors: ``latent_embedding.weight`` (per_value), plus ``latent_shared`` when the run trained
    under ``latent_capacity: shared_delta`` (value k's vector is s + δ_k)."""
    (emb,) = [v for k, v in ck.items() if k == "latent_embedding.weight" or k.endswith(".latent_embedding.weight")]
    shared = [v for k, v in ck.items() if k == "latent_shared" or k.endswith(".latent_shared")]
    s = shared[0] if shared else None
    return (emb if s is None else emb + s[None, :]), s


def latent_scale(run: Path, model: Path) -> dict:
    """The numbers the script prints for run folder ``run`` on base model folder ``model`` (module docstring)."""
    ck = load_file(str(run / "checkpoint" / "model.safetensors"))
    z, shared = latent_vectors(ck)
    base = {}
    for f in sorted(model.glob("*.safetensors")):
        base.update(load_file(str(f)))
    emb = next(v for k, v in base.items() if k.endswith("embed_tokens.weight") or k.endswith("wte.weight"))
    tok = np.linalg.norm(emb, axis=1)
    state = json.loads((run / "checkpoint" / "state.json").read_text())
    step = [v for k, v in dict(state["__dict__"])["state"]["__dict__"] if k == "step"][0]
    out = {"run": run.name, "checkpoint_step": step,
           "latent_capacity": "per_value" if shared is None else "shared_delta",
           "latent_norms": [float(v) for v in np.linalg.norm(z, axis=1)],
           "token_norm_median": float(np.median(tok)), "token_norm_p99": float(np.percentile(tok, 99)),
           "vocab": int(emb.shape[0]), "d_model": int(emb.shape[1])}
    out["latent_over_median_token"] = [n / out["token_norm_median"] for n in out["latent_norms"]]
    if shared is not None:
        out["shared_norm"] = float(np.linalg.norm(shared))
        out["delta_norms"] = [float(v) for v in np.linalg.norm(z - shared[None, :], axis=1)]
    unit = z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
    out["pairs"] = [{"values": [i, j], "cosine": float(unit[i] @ unit[j]),
                     "difference_norm": float(np.linalg.norm(z[i] - z[j]))}
                    for i in range(len(z)) for j in range(i + 1, len(z))]
    return out


def main(run: Path, model: Path) -> None:
    print(json.dumps(latent_scale(run, model), indent=1))


if __name__ == "__main__":
    default = Path.home() / ".cache" / "zfree" / "models" / "smollm2-135m-instruct"
    main(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else default)
