"""A resumable text-base training (``train_text_base(checkpoint_dir=...)``): the fine-tune of a pretrained
model before an entangled study (``zfree_lab.experiment.sources.finetune_base``) takes 300 steps of a
135M-parameter model, about an hour of one CPU thread, and used to restart from step 0 when stopped.

At every evaluation the whole training state is written to ``<folder>/checkpoint`` (the previous one
kept as ``checkpoint.prev`` until the new one is complete; ``zfree_lab.run.checkpoint_io``): the model
and tokenizer (``save_pretrained``), and as plain tensors plus JSON (no pickle, nothing executable is
loaded back) the optimizer and schedule, the batch sampler's and torch's random streams, the history,
the elapsed wall time and the best weights so far. A resumed call continues exactly where the
uninterrupted one would be, so it ends with the same weights. The checkpoint records the arguments it
was written under (``key``); a call with other arguments starts from step 0 and says so.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from zfree.core.io import atomic_write_json, read_json
from zfree.core.progress import hf_bars_only_on_a_terminal
from zfree_lab.run.checkpoint_io import load_checkpoint_dir, load_plain_state, save_plain_state, write_checkpoint_dir


@dataclass
class Resumed:
    """A loaded checkpoint: ``model_dir`` (weights and tokenizer, for ``from_pretrained``) and its state."""

    model_dir: Path
    state: dict
    best_state: dict

    def restore(self, opt, sched, rng, best) -> tuple[int, list, float]:
        """Put the optimizer's, schedule's, sampler's (``np.random.Generator``) and torch's random state
        back, and ``best`` (``base_training._Best``); returns ``(step, history, elapsed seconds)``."""
        s = self.state
        opt.load_state_dict(s["optimizer"])
        sched.load_state_dict(s["schedule"])
        rng.bit_generator.state = s["sampler_rng"]
        torch.set_rng_state(s["torch_rng"])
        best.c, best.step, best.since = s["best"]["c"], s["best"]["step"], s["best"]["since"]
        best.state = self.best_state or None
        return s["step"], list(s["history"]), s["elapsed_s"]


class TextCheckpoint:
    """The checkpoint folder of one training call; ``key``: the JSON-able arguments it must match."""

    def __init__(self, folder: Path | str, key: dict):
        self.folder = Path(folder)
        self.key = json.loads(json.dumps(key, sort_keys=True, default=str))

    def _dirs(self) -> list[Path]:
        return [self.folder / "checkpoint", self.folder / "checkpoint.prev"]

    def latest(self) -> Resumed | None:
        """The newest complete checkpoint written under the same ``key``, or None (none yet, or written
        under other arguments: then removed, with a line on stderr naming the first field that differs)."""
        found = load_checkpoint_dir(self._dirs(), self._load)
        if found is None:
            return None
        folder, (key, resumed) = found
        if resumed is None:
            field = next((k for k in sorted(set(key) | set(self.key)) if key.get(k) != self.key.get(k)), "?")
            print(f"zfree: the checkpoint in {self.folder} was written with another {field}: training from step 0",
                  file=sys.stderr)
            self.clear()
            return None
        print(f"zfree: resuming the base training from its checkpoint at step {resumed.state['step']} "
              f"({folder})", file=sys.stderr)
        return resumed

    def _load(self, folder: Path) -> tuple[dict, Resumed | None]:
        """The folder's key, and its state only when the key matches (another key's tensors stay unread)."""
        key = read_json(folder / "key.json")
        if key != self.key:
            return key, None
        return key, Resumed(folder / "model", load_plain_state(folder, "state"), load_plain_state(folder, "best"))

    def save(self, step: int, model, tok, opt, sched, rng, best, history: list, elapsed: float) -> None:
        """Write the state after ``step`` (``Resumed.restore`` reads it back)."""
        state = {"step": step, "optimizer": opt.state_dict(), "schedule": sched.state_dict(),
                 "sampler_rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state(),
                 "best": {"c": best.c, "step": best.step, "since": best.since}, "history": history,
                 "elapsed_s": elapsed}

        def write(tmp: Path) -> None:
            with hf_bars_only_on_a_terminal():
                model.save_pretrained(tmp / "model")
            tok.save_pretrained(tmp / "model")
            save_plain_state(tmp, state, "state")
            save_plain_state(tmp, dict(best.state or {}), "best")
            atomic_write_json(tmp / "key.json", self.key)

        self.folder.mkdir(parents=True, exist_ok=True)
        write_checkpoint_dir(self.folder / "checkpoint", write)

    def clear(self) -> None:
        """Remove the checkpoint folder (after the training's output is complete)."""
        shutil.rmtree(self.folder, ignore_errors=True)
