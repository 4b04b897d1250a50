"""Checkpoint primitives: plain state round-trips bit for bit without pickle, a crafted pickle is
refused without running, the directory switch always leaves a complete checkpoint, a damaged
newest checkpoint falls back to the previous one naming the file."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from zfree.core.errors import CheckpointError
from zfree_lab.run.checkpoint_io import (load_checkpoint_dir, load_plain_state, safe_torch_load, save_plain_state,
                                      verify_checkpoint_dir, write_checkpoint_dir)
from zfree.core.io import nonfinite_keys


class _Evil:
    """Pickles to ``open(marker, "w")``: loading it with weights_only=False creates the marker."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _train_state():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    rng = np.random.default_rng(7)
    rng.random(3)
    return model, opt, {"optimizer": opt.state_dict(), "rng": rng.bit_generator.state,
                        "torch_rng": torch.get_rng_state(), "state": {"step": 3, "best": float("inf"), "ids": ("a", "b"),
                                                                      "nothing": None, "flag": True}}


def test_plain_state_round_trips_optimizer_and_rng_bit_for_bit(tmp_path):
    model, opt, state = _train_state()
    save_plain_state(tmp_path, state)
    assert not list(tmp_path.glob("*.pt"))  # no pickle written
    back = load_plain_state(tmp_path)
    assert back["rng"] == state["rng"] and back["state"] == state["state"]
    assert isinstance(back["state"]["ids"], tuple) and math.isinf(back["state"]["best"])
    assert torch.equal(back["torch_rng"], state["torch_rng"])
    opt2 = torch.optim.AdamW(torch.nn.Linear(3, 2).parameters(), lr=1e-3)
    opt2.load_state_dict(back["optimizer"])  # int parameter keys survive
    for k, v in opt.state_dict()["state"][0].items():
        torch.testing.assert_close(opt2.state_dict()["state"][0][k], v, rtol=0, atol=0)
    rng = np.random.default_rng()
    rng.bit_generator.state = back["rng"]
    ref = np.random.default_rng(7)
    ref.random(3)
    assert rng.random() == ref.random()


def test_plain_state_refuses_non_plain_values_naming_the_key(tmp_path):
    with pytest.raises(TypeError, match=r"state\.x"):
        save_plain_state(tmp_path, {"x": np.float32(1.0)})  # (np.float64 is a float: stored as one)


def test_crafted_pickle_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    torch.save({"optimizer": _Evil(marker)}, tmp_path / "state.pt")
    with pytest.raises(CheckpointError, match="state.pt"):
        safe_torch_load(tmp_path / "state.pt")
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["empty", "truncated"])
def test_damaged_files_are_refused_naming_the_file(tmp_path, damage):
    torch.save({"a": torch.ones(100)}, tmp_path / "state.pt")
    _, _, state = _train_state()
    save_plain_state(tmp_path, state)
    for name in ("state.pt", "state.safetensors"):
        f = tmp_path / name
        f.write_bytes(b"" if damage == "empty" else f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="state.pt"):
        safe_torch_load(tmp_path / "state.pt")
    with pytest.raises(CheckpointError, match="state.safetensors"):
        load_plain_state(tmp_path)


def _ckpt(step):
    def write(d):
        save_plain_state(d, {"step": step, "w": torch.full((4,), float(step))})
    return write


def test_checkpoint_switch_keeps_the_previous_one_and_falls_back_naming_the_file(tmp_path):
    final = tmp_path / "checkpoint"
    write_checkpoint_dir(final, _ckpt(1))
    write_checkpoint_dir(final, _ckpt(2))
    prev = tmp_path / "checkpoint.prev"
    verify_checkpoint_dir(final), verify_checkpoint_dir(prev)
    assert load_plain_state(prev)["step"] == 1 and load_plain_state(final)["step"] == 2
    st = final / "state.safetensors"
    st.write_bytes(st.read_bytes()[:-7])  # truncated newest checkpoint
    seen = []
    d, state = load_checkpoint_dir([final, prev], load_plain_state, warn=seen.append)
    assert d == prev and state["step"] == 1
    assert len(seen) == 1 and "state.safetensors" in seen[0]
    (prev / "state.json").write_text("")
    with pytest.raises(CheckpointError, match="state.json"):
        load_checkpoint_dir([final, prev], load_plain_state, warn=seen.append)
    assert load_checkpoint_dir([tmp_path / "none"], load_plain_state) is None


def test_a_failing_write_leaves_the_last_good_checkpoint_untouched(tmp_path):
    final = tmp_path / "checkpoint"
    write_checkpoint_dir(final, _ckpt(1))
    before = {p.name: p.read_bytes() for p in final.iterdir()}

    def boom(d):
        _ckpt(2)(d)
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        write_checkpoint_dir(final, boom)
    assert {p.name: p.read_bytes() for p in final.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]


def test_a_kill_between_the_renames_leaves_a_complete_checkpoint(tmp_path, monkeypatch):
    final = tmp_path / "checkpoint"
    write_checkpoint_dir(final, _ckpt(1))
    real_rename = type(final).rename
    calls = []

    def rename(self, target):
        calls.append(self.name)
        if len(calls) == 2:  # the tmp -> final rename: simulate a kill just before it
            raise KeyboardInterrupt
        return real_rename(self, target)

    monkeypatch.setattr(type(final), "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        write_checkpoint_dir(final, _ckpt(2))
    monkeypatch.undo()
    d, state = load_checkpoint_dir([final, tmp_path / "checkpoint.prev"], load_plain_state, warn=lambda m: None)
    assert d.name == "checkpoint.prev" and state["step"] == 1


def test_nonfinite_keys_names_every_bad_metric():
    ev = {"recon": {"nll": float("nan"), "rho": 1.0}, "kl": torch.tensor(float("inf")), "ok": [1.0, float("-inf")]}
    assert sorted(nonfinite_keys(ev)) == ["kl", "ok.1", "recon.nll"]
    assert nonfinite_keys({"a": 1.0, "b": "x", "c": None}) == []


def test_read_jsonl_accepts_a_bom(tmp_path):
    from zfree.core.io import read_jsonl

    f = tmp_path / "m.jsonl"
    f.write_bytes(b"\xef\xbb\xbf" + json.dumps({"step": 1}).encode() + b"\n")
    assert read_jsonl(f) == [{"step": 1}]
