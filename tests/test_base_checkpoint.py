"""A base fine-tune that is stopped resumes from its last evaluation and ends where an uninterrupted one
ends (``train_text_base(checkpoint_dir=...)``, ``zfree_lab.run.base_checkpoint``; ``finetune_base``).

Before: the entangled regime's fine-tune of SmolLM2 (300 steps, about an hour of one CPU thread) started
again from step 0 when its process stopped, and a fine-tune's dropout masks were not seeded, so two
fine-tunes of the same model on the same data ended with different weights.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import GPT2Config, GPT2LMHeadModel

from zfree.config import BaseTrainConfig
from zfree_lab.run import base_training
from zfree_lab.run.base_training import train_text_base
from zfree_lab.run.bpe import train_bpe_tokenizer
from zfree_lab.run.checkpoint_io import load_plain_state

CFG = BaseTrainConfig(n_layer=1, n_embd=16, n_head=2, lr=3e-3, batch_size=4, max_steps=6, warmup_steps=2,
                      eval_every=2, max_minutes=None)


def _rows(n: int = 40) -> list[dict]:
    words = ["red", "blue", "green", "cat", "dog", "sun", "moon", "tree"]
    return [{"id": f"r{i}", "x": f"item[{i}] a[{words[i % 8]}]", "y": f"the {words[i % 8]} {words[(3 * i) % 8]} one."}
            for i in range(n)]


@pytest.fixture()
def data(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    rows = _rows()
    for name, part in (("train", rows[:32]), ("val", rows[32:])):
        (d / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    return d


@pytest.fixture()
def pretrained(tmp_path):
    """A tiny GPT-2 with dropout in its modules (``train_text_base`` sets p = 0.1), saved as a model folder."""
    rows = _rows()
    tok = train_bpe_tokenizer([r["x"] for r in rows] + [r["y"] for r in rows], vocab_size=300)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=64, n_layer=1, n_embd=16, n_head=2,
                                       bos_token_id=1, eos_token_id=3, pad_token_id=0))
    model.save_pretrained(tmp_path / "pre")
    tok.save_pretrained(tmp_path / "pre")
    return tmp_path / "pre"


def _weights(out):
    return load_file(str(out / "model" / "model.safetensors"))


def _stop_after(monkeypatch, n_steps: int) -> list:
    """Make the training's ``lm_step`` raise at its call n_steps + 1 (a process stopped mid-training);
    returns the list that counts the calls."""
    calls, real = [], base_training.lm_step

    def step(*a, **k):
        calls.append(1)
        if len(calls) > n_steps:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(base_training, "lm_step", step)
    return calls


def _count(monkeypatch) -> list:
    calls, real = [], base_training.lm_step
    monkeypatch.setattr(base_training, "lm_step", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    return calls


@pytest.mark.parametrize("from_pretrained", [False, True], ids=["new-model", "fine-tune"])
def test_a_stopped_training_resumes_to_the_weights_of_an_uninterrupted_one(data, pretrained, tmp_path, monkeypatch,
                                                                           from_pretrained):
    init = pretrained if from_pretrained else None
    torch.manual_seed(123)  # the new model's build seeds itself; the fine-tune must seed its own dropout
    train_text_base(data, tmp_path / "straight", CFG, progress=False, init_from=init)
    with monkeypatch.context() as m:
        _stop_after(m, 5)  # the checkpoint of step 4 is written; step 5 never finishes
        torch.manual_seed(456)  # another process's random state: the resumed run must not depend on it
        with pytest.raises(KeyboardInterrupt):
            train_text_base(data, tmp_path / "stopped", CFG, progress=False, init_from=init,
                            checkpoint_dir=tmp_path / "ckpt")
    assert not (tmp_path / "stopped" / "model").exists()
    assert load_plain_state(tmp_path / "ckpt" / "checkpoint", "state")["step"] == 4
    with monkeypatch.context() as m:
        calls = _count(m)
        torch.manual_seed(789)
        log = train_text_base(data, tmp_path / "stopped", CFG, progress=False, init_from=init,
                              checkpoint_dir=tmp_path / "ckpt")
    assert len(calls) == 2 and log["steps"] == 6  # steps 5 and 6 only
    a, b = _weights(tmp_path / "straight"), _weights(tmp_path / "stopped")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    straight = json.loads((tmp_path / "straight" / "train_log.json").read_text())
    assert [h["val_c_base"] for h in log["history"]] == [h["val_c_base"] for h in straight["history"]]
    assert log["best_step"] == straight["best_step"] and log["c_base"] == straight["c_base"]


def test_a_checkpoint_of_other_arguments_is_not_resumed(data, tmp_path, monkeypatch, capsys):
    with monkeypatch.context() as m:
        _stop_after(m, 3)
        with pytest.raises(KeyboardInterrupt):
            train_text_base(data, tmp_path / "a", CFG, progress=False, checkpoint_dir=tmp_path / "ckpt")
    other = BaseTrainConfig(**{**CFG.__dict__, "lr": 1e-3})
    import zfree_lab.run.base_checkpoint as bc

    read = []  # another key's tensors (Adam's moments, the best weights) are not read before being removed
    with monkeypatch.context() as m:
        calls = _count(m)
        m.setattr(bc, "load_plain_state", lambda folder, name: read.append(name))
        train_text_base(data, tmp_path / "a", other, progress=False, checkpoint_dir=tmp_path / "ckpt")
    assert len(calls) == 6 and read == []
    assert "was written with another config: training from step 0" in capsys.readouterr().err


def test_the_fine_tune_of_finetune_base_resumes_and_leaves_no_checkpoint(data, pretrained, tmp_path, monkeypatch):
    from zfree_lab.experiment.sources import finetune_base

    monkeypatch.setenv("ZFREE_CACHE_DIR", str(tmp_path / "cache"))
    base = tmp_path / "base"
    base.mkdir()
    (base / "model").symlink_to(pretrained)
    from zfree_lab.experiment import sources

    monkeypatch.setitem(sources.FINETUNE, "eval_every", 2)  # FINETUNE evaluates every 50 steps
    with monkeypatch.context() as m:
        _stop_after(m, 5)
        with pytest.raises(KeyboardInterrupt):
            finetune_base(base, data, steps=6)
    assert (data / "base_ft.checkpoint" / "checkpoint" / "COMPLETE").is_file()
    with monkeypatch.context() as m:
        calls = _count(m)
        ft = finetune_base(base, data, steps=6)
    assert len(calls) == 2
    assert (ft / "reference" / "reference.json").is_file() and not (data / "base_ft.checkpoint").exists()


def test_max_minutes_none_is_no_cap_and_other_values_are_checked():
    assert BaseTrainConfig(max_minutes=None).max_minutes is None
    assert BaseTrainConfig(max_minutes="none").max_minutes is None  # a --set or CLI text value
    for bad in (0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="max_minutes"):
            BaseTrainConfig(max_minutes=bad)
    assert not base_training._over(CFG, 1e12) and base_training._over(BaseTrainConfig(max_minutes=1.0), 61.0)


def test_the_cli_reads_max_minutes_none():
    from zfree_lab.cli.parser import build_parser

    args = build_parser().parse_args(["base", "train", "--data", "d", "--out", "o", "--max-minutes", "none"])
    assert BaseTrainConfig(max_minutes=args.max_minutes).max_minutes is None
    args = build_parser().parse_args(["base", "train", "--data", "d", "--out", "o"])
    assert args.max_minutes == 60.0


def test_a_moved_data_folder_resumes_and_changed_data_does_not(data, tmp_path, monkeypatch, capsys):
    """The checkpoint knows its data by content: a study folder moved elsewhere (portable study folders) resumes,
    a changed train.jsonl starts again from step 0."""
    import shutil

    with monkeypatch.context() as m:
        _stop_after(m, 3)
        with pytest.raises(KeyboardInterrupt):
            train_text_base(data, tmp_path / "a", CFG, progress=False, checkpoint_dir=tmp_path / "ckpt")
    moved = shutil.move(str(data), str(tmp_path / "moved"))
    with monkeypatch.context() as m:
        calls = _count(m)
        train_text_base(moved, tmp_path / "a", CFG, progress=False, checkpoint_dir=tmp_path / "ckpt")
    assert len(calls) == 4  # steps 3-6 (the checkpoint of step 2)
    shutil.rmtree(tmp_path / "a")
    shutil.rmtree(tmp_path / "ckpt")  # train_text_base leaves its last checkpoint (finetune_base removes it)
    with monkeypatch.context() as m:
        _stop_after(m, 3)
        with pytest.raises(KeyboardInterrupt):
            train_text_base(moved, tmp_path / "a", CFG, progress=False, checkpoint_dir=tmp_path / "ckpt")
    with open(f"{moved}/train.jsonl", "a") as f:
        f.write(json.dumps({"id": "extra", "x": "item[99] a[red]", "y": "the red cat one."}) + "\n")
    with monkeypatch.context() as m:
        calls = _count(m)
        train_text_base(moved, tmp_path / "a", CFG, progress=False, checkpoint_dir=tmp_path / "ckpt")
    assert len(calls) == 6
    assert "was written with another data_sha256: training from step 0" in capsys.readouterr().err


def test_ema_decay_saves_the_moving_average_of_the_weights(tmp_path, monkeypatch):
    """``BaseTrainConfig.ema_decay``: the synthetic base saves e_k = d e_(k-1) + (1 - d) p_k over its steps' weights
    p_k (e_1 = p_1), computed here in float64 from the weights recorded after each step; 0 saves the last step's."""
    from zfree.data.synth import DataConfig, write_benchmark
    from zfree_lab.run.base_training import train_base

    data = write_benchmark(DataConfig(n_train=64, n_val=16, n_test=16), tmp_path / "bench")
    cfg = BaseTrainConfig(n_layer=1, n_embd=16, n_head=2, batch_size=8, max_steps=5, warmup_steps=2, eval_every=5,
                          max_minutes=None, target_ratio=1.0)
    for decay in (0.0, 0.6):
        seen, real = [], base_training.lm_step

        def step(model, *a, **k):
            loss = real(model, *a, **k)
            seen.append({n: p.detach().double().clone() for n, p in model.named_parameters()})
            return loss

        with monkeypatch.context() as m:
            m.setattr(base_training, "lm_step", step)
            train_base(data, tmp_path / f"base-{decay}", BaseTrainConfig(**{**cfg.__dict__, "ema_decay": decay}),
                       threads=1, progress=False)
        want = dict(seen[0])
        for p in seen[1:]:
            want = {n: decay * want[n] + (1 - decay) * p[n] for n in want}
        saved = _weights(tmp_path / f"base-{decay}")
        named = {n: t for n, t in saved.items() if n in want or f"transformer.{n}" in want}
        assert len(seen) == 5 and named
        for n, t in named.items():
            ref = want.get(n, want.get(f"transformer.{n}"))
            assert torch.allclose(t.double(), ref, atol=1e-6), n
        log = json.loads((tmp_path / f"base-{decay}" / "train_log.json").read_text())
        if decay:
            assert not torch.allclose(next(iter(named.values())).double(), seen[-1][next(iter(named))], atol=1e-6)
            h = log["history"][-1]  # the average scored, the last step's weights beside it
            assert h["val_c_base_last_step"] > 0 and h["val_c_base_last_step"] != h["val_c_base"]
        else:
            assert "val_c_base_last_step" not in log["history"][-1]


def test_ema_decay_is_refused_for_a_text_base_and_checked():
    with pytest.raises(ValueError, match="ema_decay"):
        BaseTrainConfig(ema_decay=1.0)
    with pytest.raises(ValueError, match="ema_decay=0.9 applies to the synthetic"):
        train_text_base("nowhere", "nowhere-out", BaseTrainConfig(ema_decay=0.9), progress=False)


def test_a_fine_tunes_progress_in_a_log_is_one_line_per_evaluation(data, tmp_path, capsys):
    """In a log (a study's preparation under nohup: stderr is no terminal) the base model's bar is plain lines,
    one per evaluation with its c_base, not one line of every redraw joined by carriage returns."""
    log = train_text_base(data, tmp_path / "a", CFG, progress=True)
    err = capsys.readouterr().err
    assert "\r" not in err, repr(err[:300])
    lines = [ln for ln in err.splitlines() if ln.startswith("text base model:")]
    evaluated = [h["val_c_base"] for h in log["history"]]
    assert len(evaluated) == 3  # steps 2, 4 and 6
    shown = [ln for ln in lines if "val_c_base=" in ln]
    assert [float(ln.split("val_c_base=")[1].rstrip("]")) for ln in shown[:3]] == pytest.approx(evaluated, abs=1e-4)
    assert "6/6" in lines[-1] and len(lines) <= 5, lines  # the first state, 3 evaluations, the last state


def test_a_data_folder_without_metadata_is_one_line_naming_the_benchmarks_inside(tmp_path, capsys):
    """`zfree base train --data data/synth` (the folder above the benchmark) said "[Errno 2] No such file or
    directory: 'data/synth/metadata.json'"; now one line naming the benchmark folders inside, exit 2, nothing written."""
    from zfree_lab.cli import main

    (tmp_path / "synth" / "default").mkdir(parents=True)
    (tmp_path / "synth" / "default" / "metadata.json").write_text("{}")
    for data, says in ((tmp_path / "synth", f"these folders in it are: {tmp_path / 'synth' / 'default'}"),
                       (tmp_path / "nowhere", "no such folder")):
        assert main(["base", "train", "--data", str(data), "--out", str(tmp_path / "out"), "--max-steps", "1"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"data folder {data}: " in err and says in err, err
        assert not (tmp_path / "out").exists()
