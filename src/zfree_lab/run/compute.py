"""Training compute in forward-token units: equal steps and
batch are not equal compute when a remedy makes extra passes (the aggressive encoder's inner
updates, hard EM's E-steps and hand-over gate, K decoder passes against one). ``TokenCounter``
counts every token position forwarded through the decoder body during training: a forward
pre-hook on the module the CVAEs call (``backbone.base_model``), reading ``input_ids`` or
``inputs_embeds`` (batch x new positions; a pass over the y-region with the x-prefix's key/value
cache counts only the y positions it computes). Evaluation is excluded (``paused``), so runs
evaluated the same way compare on what their training cost. The posterior's separate encoder
(``posterior_features="encoder"``) is not counted.
"""

from __future__ import annotations

import contextlib

import torch


class TokenCounter:
    """Counts token positions through ``body`` while ``active``; ``total`` (int) accumulates.
    ``remove()`` takes the hook off."""

    def __init__(self, body: torch.nn.Module, start: int = 0):
        self.total = int(start)
        self.active = True
        self._handle = body.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        if not self.active:
            return None
        x = kwargs.get("input_ids")
        if x is None:
            x = kwargs.get("inputs_embeds")
        if x is None and args:
            x = args[0]
        if isinstance(x, torch.Tensor) and x.dim() >= 2:
            self.total += int(x.shape[0] * x.shape[1])
        return None

    @contextlib.contextmanager
    def paused(self):
        """Nothing counted inside (evaluation)."""
        before, self.active = self.active, False
        try:
            yield
        finally:
            self.active = before

    def remove(self) -> None:
        """Take the forward pre-hook off ``body``; ``total`` keeps its count."""
        self._handle.remove()


def decoder_body(model: torch.nn.Module) -> torch.nn.Module:
    """The module the CVAEs forward tokens through (``model.backbone.base_model``)."""
    return model.backbone.base_model
