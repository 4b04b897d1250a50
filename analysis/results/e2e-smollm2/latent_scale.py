"""How large is the injected latent next to the tokens it is added to? For a run's checkpoint: the L2 norm
of each latent value's embedding (``latent_embedding.weight``, added to the input embedding at every
injection position: ``zfree.models.injection``) against the norms of the base model's token embeddings
(median and 99th percentile over the vocabulary). A latent many times the size of a token embedding
replaces rather than annotates the input the frozen body reads. With K > 1 values it also prints the
cosine between each pair of values and the norm of their difference: two values that point the same
way act as one shared bias, whatever the label says.

    .venv/bin/python analysis/results/e2e-smollm2/latent_scale.py runs/e2e-smollm2/runs/<run> [MODEL_FOLDER]

MODEL_FOLDER: the base model's transformers folder (default: zfree's fetched SmolLM2-135M-Instruct).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file


def main(run: Path, model: Path) -> None:
    ck = load_file(str(run / "checkpoint" / "model.safetensors"))
    lat = [k for k in ck if k.endswith("latent_embedding.weight")]
    z = ck[lat[0]]
    base = {}
    for f in sorted(model.glob("*.safetensors")):
        base.update(load_file(str(f)))
    emb = next(v for k, v in base.items() if k.endswith("embed_tokens.weight") or k.endswith("wte.weight"))
    tok = np.linalg.norm(emb, axis=1)
    state = json.loads((run / "checkpoint" / "state.json").read_text())
    step = [v for k, v in dict(state["__dict__"])["state"]["__dict__"] if k == "step"][0]
    out = {"run": run.name, "checkpoint_step": step, "latent_norms": [float(v) for v in np.linalg.norm(z, axis=1)],
           "token_norm_median": float(np.median(tok)), "token_norm_p99": float(np.percentile(tok, 99)),
           "vocab": int(emb.shape[0]), "d_model": int(emb.shape[1])}
    out["latent_over_median_token"] = [n / out["token_norm_median"] for n in out["latent_norms"]]
    unit = z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
    out["pairs"] = [{"values": [i, j], "cosine": float(unit[i] @ unit[j]),
                     "difference_norm": float(np.linalg.norm(z[i] - z[j]))}
                    for i in range(len(z)) for j in range(i + 1, len(z))]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    default = Path.home() / ".cache" / "zfree" / "models" / "smollm2-135m-instruct"
    main(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else default)
