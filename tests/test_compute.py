"""Training compute in forward-token units (zfree_lab.run.compute; issue "A remedies leaderboard", item 3)."""

from __future__ import annotations

import torch

from tests.tiny import tiny_flat
from zfree.config import TrainConfig
from zfree_lab.run.compute import TokenCounter
from zfree_lab.run.training import train_cvae


def _cfg(data, base, **kw):
    return TrainConfig.from_flat(tiny_flat(data, base, **{"steps": 4, "device": "cpu", **kw}))


class _Body(torch.nn.Module):
    def forward(self, input_ids=None, inputs_embeds=None, attention_mask=None):
        return input_ids if input_ids is not None else inputs_embeds


def test_counter_counts_batch_times_positions_and_pauses():
    body = _Body()
    c = TokenCounter(body, start=5)
    body(input_ids=torch.zeros(3, 7, dtype=torch.long))
    body(inputs_embeds=torch.zeros(2, 4, 8))
    with c.paused():
        body(input_ids=torch.zeros(9, 9, dtype=torch.long))
    assert c.total == 5 + 21 + 8
    c.remove()
    body(input_ids=torch.zeros(3, 7, dtype=torch.long))
    assert c.total == 34


def test_evaluation_is_not_counted_and_extra_passes_are(tiny_run, tmp_path):
    """The same training evaluated every step or only at the end costs the same forward tokens; the
    hard-EM aid (its E-step and gate passes) and K = 4 decoder passes cost more than the control's one."""
    data, base = tiny_run
    often = train_cvae(_cfg(data, base, eval_every=1), tmp_path / "often", progress=False)
    once = train_cvae(_cfg(data, base, eval_every=4), tmp_path / "once", progress=False)
    assert often["compute/forward_tokens"] == once["compute/forward_tokens"] > 0
    assert 0 < once["compute/train_wall_s"] <= once["wall_s"]
    assert 0 < once["compute/first_step_s"] <= once["compute/train_wall_s"]  # step 1 alone (the probe's warm-up)
    hard = train_cvae(_cfg(data, base, eval_every=4, aid="hard_em_then_soft", handover_check_every=2,
                           hard_em_max_steps=4, handover_rows=16), tmp_path / "hard", progress=False)
    control = train_cvae(_cfg(data, base, eval_every=4, n_latent=1, latent_source="control", beta=0.0),
                         tmp_path / "control", progress=False)
    assert hard["compute/forward_tokens"] > once["compute/forward_tokens"] > control["compute/forward_tokens"]


def test_the_last_checkpoint_is_not_taken_from_the_training_time(tiny_run, tmp_path, monkeypatch):
    """``compute/train_wall_s`` (the probe's step time, ``probed_step_seconds``) is the run's wall time
    less its evaluations. The final evaluation's checkpoint is written after the row whose ``wall_s``
    the summary reports, yet inside the evaluation's time: subtracted too, it took a SmolLM2 control's
    probed step from 3.3 s to 1.95 s (2026-12-05). Here each checkpoint takes 3 s more: the training
    time still holds the first step (before, it came out about 3 s short, below the first step)."""
    import time

    import zfree_lab.run.training as tr

    data, base = tiny_run
    save = tr.checkpoint.save_checkpoint

    def slow(*a, **k):
        save(*a, **k)
        time.sleep(3.0)
    monkeypatch.setattr(tr.checkpoint, "save_checkpoint", slow)
    s = train_cvae(_cfg(data, base, eval_every=4), tmp_path / "run", progress=False)
    assert 0 < s["compute/first_step_s"] <= s["compute/train_wall_s"] <= s["wall_s"]
