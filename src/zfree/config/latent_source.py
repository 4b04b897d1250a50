"""Where a run's z comes from, as a typed value: the CVAE's posterior, the z-free control's single
value, a label oracle's label, or the label written into x. ``ModelConfig.latent_source`` keeps its text
form ("posterior", "control", "label:<key>", "null:<key>", "text:<key>") in every stored config and summary, so run ids and existing run folders
read as before; every reader parses it here, in one place, instead of slicing the text.

The control and the oracles are the given-z runs of docs/concepts/controls.md (the z-free control,
the label oracles, their null oracles and the text oracles).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

LatentSourceKind = Literal["posterior", "control", "label", "null", "text"]
_PREFIX = "label:"
#: the null oracle of a label: z := the label of another row (a seeded permutation of the rows' values),
#: so z has the label's K and marginal but carries nothing about its own row's y
_NULL = "null:"
#: the text oracle of a label: a z-free arm (K = 1, the control's parameters) whose x has the row's label
#: written into it as text (``zfree_lab.run.text_oracle``): what the label is worth given as input, no latent
_TEXT = "text:"


@dataclass(frozen=True)
class LatentSource:
    """A parsed ``latent_source``: ``kind`` "posterior" (q(z|x,y) learned), "control" (z held at one
    value: K = 1), "label" (z := the row's value of ``label``, a key of the rows' labels or
    "strategy") or "null" (z := that label's value on another row: a seeded permutation of the values
    over the rows, the same K and marginal, independent of the row's y) or "text" (K = 1 as the control,
    the row's value of ``label`` written into its x: ``zfree_lab.run.text_oracle``); ``label`` is None unless
    kind is "label", "null" or "text"."""

    kind: LatentSourceKind
    label: str | None = None

    @classmethod
    def parse(cls, text: Any) -> LatentSource:
        """The typed form of ``text`` ("posterior", "control", or "label:<key>", "null:<key>" or "text:<key>"
        with a non-empty key;
        None reads as "posterior", the default of a summary that predates the field). Raises ValueError
        naming ``latent_source`` and the text otherwise."""
        if text is None or text == "posterior":
            return cls("posterior")
        if text == "control":
            return cls("control")
        if isinstance(text, str) and text.startswith(_PREFIX) and text[len(_PREFIX):].strip():
            return cls("label", text[len(_PREFIX):])
        if isinstance(text, str) and text.startswith(_NULL) and text[len(_NULL):].strip():
            return cls("null", text[len(_NULL):])
        if isinstance(text, str) and text.startswith(_TEXT) and text[len(_TEXT):].strip():
            return cls("text", text[len(_TEXT):])
        raise ValueError(f"latent_source={text!r}: expected 'posterior', 'control', 'label:<key>', 'null:<key>' "
                         f"or 'text:<key>'")

    @classmethod
    def oracle(cls, key: str) -> LatentSource:
        """The label oracle of ``key``."""
        return cls.parse(_PREFIX + key)

    @classmethod
    def null_oracle(cls, key: str) -> LatentSource:
        """The null oracle of ``key`` (its values permuted over the rows)."""
        return cls.parse(_NULL + key)

    @classmethod
    def text_oracle(cls, key: str) -> LatentSource:
        """The text oracle of ``key`` (the label written into x, K = 1)."""
        return cls.parse(_TEXT + key)

    @property
    def z_free(self) -> bool:
        """True for the arms with one latent value (K = 1): the control and the text oracle."""
        return self.kind in ("control", "text")

    @property
    def given(self) -> bool:
        """True for the control and the oracles: z is given, not inferred (no posterior, no rate)."""
        return self.kind != "posterior"

    def __str__(self) -> str:
        """The text form stored in configs and summaries."""
        return {"label": _PREFIX, "null": _NULL, "text": _TEXT}.get(self.kind, "") + self.label if self.label else self.kind
