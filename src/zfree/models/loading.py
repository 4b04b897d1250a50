"""One loader for every causal LM zfree works with (a transformers folder, a GGUF file, a hub id).

What is not a usable causal LM is refused in one line; after loading, the logits zfree computes from
the hidden states must equal the model's own (``zfree.models.head.verify_head``).
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from zfree.core.errors import ModelLoadError
from zfree.core.paths import TOKENIZER_FILES, model_source
from zfree.core.progress import hf_bars_only_on_a_terminal
from zfree.models.head import verify_head

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


def pick_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"``: cuda when available, else cpu; anything else is passed to ``torch.device``."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_source(source: Path | str) -> tuple[str, str | None, str]:
    """Where to load from: ``(path_or_id, gguf_file or None, kind)``, kind in folder / gguf / hub; read from
    the path alone, as the command line does before it imports torch (``zfree.core.paths.model_source``: its
    rules and errors)."""
    return model_source(source)


def _loading_problems(info: dict) -> list[str]:
    names = []
    for key in ("missing_keys", "newly_initialized_keys", "mismatched_keys"):
        for k in info.get(key) or []:
            names.append(k if isinstance(k, str) else str(k[0]))
    return sorted(set(names))


#: a tokenizer covering less than this share of the embedding rows is not the model's own (the rows
#: beyond a tokenizer are only padding: to a multiple of 64 or 128, or a few reserved tokens)
MIN_VOCAB_SHARE = 0.5


def check_vocab_size(tok, model, name: str) -> None:
    """ModelLoadError naming both sizes when the tokenizer has more tokens than the model's input
    embedding table has rows, or fewer than ``MIN_VOCAB_SHARE`` of them (not the model's tokenizer)."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(emb, "num_embeddings", None) or getattr(getattr(emb, "weight", None), "shape", [None])[0]
    n_tok = len(tok)
    if rows and n_tok > rows:  # an id >= rows indexes past the table (an IndexError deep in scoring)
        raise ModelLoadError(f"model {name}: its tokenizer has {n_tok} tokens (ids up to {n_tok - 1}) but the "
                             f"embedding table {rows} rows: ids from {rows} on would index past it; use the model's "
                             "own tokenizer, or resize_token_embeddings and save the model")
    if rows and n_tok < MIN_VOCAB_SHARE * rows:
        raise ModelLoadError(f"model {name}: its tokenizer has {n_tok} tokens but the embedding table {rows} rows "
                             f"(under {MIN_VOCAB_SHARE:.0%}): not the model's tokenizer (a tokenizer.json or "
                             f"vocab/merges files it did not load?); save the model's own with tokenizer.save_pretrained")


def _load_config(path: str, kind: str, name: str, kw: dict):
    """The transformers config of a causal LM at ``path`` (``kind``: folder, gguf or hub; ``name``
    for messages). ModelLoadError when it cannot be loaded or is an encoder-decoder config."""
    try:
        config = AutoConfig.from_pretrained(path, **kw)
    except (OSError, ValueError, KeyError) as e:
        what = "is neither an existing path nor a loadable hub id" if kind == "hub" else "has no loadable config"
        raise ModelLoadError(f"model {name} {what} ({type(e).__name__}: {(str(e).splitlines() or [''])[0]})") from None
    if getattr(config, "is_encoder_decoder", False):
        raise ModelLoadError(f"model {name}: {type(config).__name__} is an encoder-decoder model, not a causal LM "
                             f"(zfree needs a decoder-only AutoModelForCausalLM)")
    return config


#: the first bytes of a GGUF file (llama.cpp's format; its spec's magic number)
GGUF_MAGIC = b"GGUF"
#: the names transformers reads weights from in a folder (pytorch_model.bin, model.safetensors, their shards)
WEIGHT_SUFFIXES = (".bin", ".safetensors", ".pt", ".pth")


def check_not_gguf(folder: Path | str, name: str) -> None:
    """ModelLoadError naming the file when a weights file of ``folder`` (``WEIGHT_SUFFIXES``) holds GGUF
    bytes (``GGUF_MAGIC``), which ``torch.load`` would refuse with unsafe advice."""
    for f in sorted(Path(folder).glob("*")):
        if f.suffix in WEIGHT_SUFFIXES and f.is_file():
            with open(f, "rb") as fh:
                if fh.read(len(GGUF_MAGIC)) == GGUF_MAGIC:
                    raise ModelLoadError(f"model {name}: {f} is a GGUF file, not a PyTorch checkpoint (it begins "
                                         f"with the GGUF magic); name it {f.stem}.gguf and give that file, or "
                                         f"its folder, as the model")


def _load_weights(path: str, config, dtype: torch.dtype, name: str, kw: dict) -> torch.nn.Module:
    """The ``AutoModelForCausalLM`` at ``path`` with ``config``, its weights in ``dtype``. ModelLoadError
    for a config without a causal-LM head, weights that do not match the config or cannot be read
    (never unpickled unsafely), and weights missing or newly initialized on load (naming them)."""
    if "gguf_file" not in kw and Path(path).is_dir():
        check_not_gguf(path, name)
    try:
        with hf_bars_only_on_a_terminal():
            model, info = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=dtype,
                                                               output_loading_info=True, **kw)
    except ValueError as e:
        if "Unrecognized configuration class" in str(e):
            raise ModelLoadError(f"model {name}: {type(config).__name__} has no causal-LM head in transformers "
                                 f"(not an AutoModelForCausalLM)") from None
        raise
    except pickle.UnpicklingError:  # torch.load's weights-only refusal: its advice (weights_only=False) runs code
        raise ModelLoadError(f"model {name}: its weights file is not a PyTorch checkpoint of plain tensors (torch's "
                             f"safe loader refused it); save the model with save_pretrained (safetensors)") from None
    except (SafetensorError, OSError, EOFError, RuntimeError) as e:  # a weights file cut short or foreign
        first = (str(e).strip().splitlines() or [""])[0][:200]
        if "mismatch" in str(e):  # config.json (e.g. vocab_size, hidden size) against the weights' shapes
            raise ModelLoadError(f"model {name}: the weights' shapes do not match its config.json (e.g. vocab_size "
                                 f"{getattr(config, 'vocab_size', '?')}); the config belongs to another model") from None
        raise ModelLoadError(f"model {name}: its weights cannot be read ({type(e).__name__}: {first}); a file cut "
                             "short by a download or copy? fetch or copy it again") from None
    bad = _loading_problems(info)
    if bad:
        shown = ", ".join(bad[:8]) + (f" and {len(bad) - 8} more" if len(bad) > 8 else "")
        raise ModelLoadError(f"model {name}: weights missing or newly initialized on load: {shown} "
                             f"(they would be random; not a complete {type(model).__name__})")
    return model


#: the GGUF metadata keys of the special tokens (llama.cpp's gguf spec) -> the tokenizer's attribute
GGUF_SPECIAL_TOKENS = {"tokenizer.ggml.bos_token_id": "bos_token", "tokenizer.ggml.eos_token_id": "eos_token",
                       "tokenizer.ggml.padding_token_id": "pad_token", "tokenizer.ggml.unknown_token_id": "unk_token"}


def gguf_special_token_ids(gguf_path: Path | str) -> dict[str, int]:
    """The special tokens a GGUF file declares: ``{"eos_token": id, ...}`` (attribute names of
    ``GGUF_SPECIAL_TOKENS``; a key the file lacks is left out). Reads the metadata only (memory-mapped).
    Raises FileNotFoundError for a missing file, ValueError (gguf's reader) for a file that is not GGUF."""
    from gguf import GGUFReader

    fields = GGUFReader(str(gguf_path)).fields
    out = {}
    for key, attr in GGUF_SPECIAL_TOKENS.items():
        f = fields.get(key)
        if f is not None and f.data:
            out[attr] = int(f.parts[f.data[0]][0])
    return out


def align_gguf_special_tokens(tok, gguf_path: Path | str, log=print) -> list[str]:
    """Set the tokenizer's bos / eos / pad / unk tokens to those the GGUF file declares, where they
    differ: transformers' conversion varies by version (docs/results/real-models.md), and zfree ends
    every y with eos. Returns the changes, one line each (also passed to ``log``); an id outside the
    vocabulary is left alone and named."""
    changes = []
    vocab = len(tok)
    for attr, want in gguf_special_token_ids(gguf_path).items():
        if not 0 <= want < vocab:
            changes.append(f"{Path(gguf_path).name}: {attr} id {want} is outside the vocabulary ({vocab}); left as is")
            continue
        have = getattr(tok, f"{attr}_id", None)
        if have != want:
            text = tok.convert_ids_to_tokens(want)
            setattr(tok, attr, text)
            changes.append(f"{Path(gguf_path).name}: {attr} set to {text!r} (id {want}, the file's metadata; "
                           f"the converted tokenizer had id {have})")
    for line in changes:
        log(f"note: {line}")
    return changes


def check_eos(tokenizer, name: Path | str) -> None:
    """ModelLoadError naming the model ``name`` when ``tokenizer`` has no eos token: zfree ends every y
    with it (the supervised region S = y + [eos], ``zfree.data.batching``)."""
    if tokenizer.eos_token_id is None:
        raise ModelLoadError(f"{name}: its tokenizer has no eos token; zfree ends every y with it (where the CVAE "
                             "learns y stops, and decoding stops): set eos_token in its tokenizer_config.json "
                             "to a token of its vocabulary")


def load_causal_lm(source: Path | str, *, device: str | torch.device = "auto", dtype: str = "auto",
                   trust_remote_code: bool = False, verify: bool = True):
    """Load ``(model, tokenizer)`` of a causal LM for zfree, model in eval mode on ``device``.

    source: a transformers folder (config.json + weights + tokenizer), a ``.gguf`` file or a folder
    holding one (dequantized to ``dtype``; special tokens the file's own), or a hub id (offline unless
    HF_HUB_OFFLINE is unset). dtype ``"auto"``: float32 on CPU, bfloat16 on a bf16-capable GPU;
    otherwise one of ``DTYPES``.

    Raises FileNotFoundError for a missing path; ModelLoadError (a ValueError) for a folder without a
    tokenizer, an encoder-decoder config, missing / newly initialized / mismatched weights (naming
    them), unreadable weights, a tokenizer that is not the model's, an unknown dtype, or (``verify``)
    a model whose logits zfree cannot reproduce from its hidden states.
    """
    path, gguf_file, kind = resolve_source(source)
    dev = pick_device(device)
    if dtype == "auto":
        dtype = "bfloat16" if dev.type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    if dtype not in DTYPES:
        raise ModelLoadError(f"dtype={dtype!r}: expected 'auto' or one of {sorted(DTYPES)}")
    if kind == "folder" and not any((Path(path) / f).exists() for f in TOKENIZER_FILES):
        raise ModelLoadError(f"model folder {path} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}); "
                             f"save it beside the model with tokenizer.save_pretrained")
    local = kind != "hub" or os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
    kw = dict(local_files_only=local, trust_remote_code=trust_remote_code)
    if gguf_file is not None:
        kw["gguf_file"] = gguf_file
    name = f"{path}/{gguf_file}" if gguf_file else path
    config = _load_config(path, kind, name, kw)
    try:
        tok = AutoTokenizer.from_pretrained(path, **kw)
    except (OSError, ValueError, TypeError) as e:
        raise ModelLoadError(f"model folder {path}: no loadable tokenizer ({type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''})") from None
    if gguf_file is not None:
        align_gguf_special_tokens(tok, Path(path) / gguf_file)
    model = _load_weights(path, config, DTYPES[dtype], name, kw)
    check_vocab_size(tok, model, name)
    model = model.to(dev).eval()
    if verify:
        verify_head(model, name=name)
    return model, tok
