"""Where a run's z comes from, as a typed value: the CVAE's posterior, the z-free control's single
value, or a label oracle's label. ``ModelConfig.latent_source`` keeps its text form ("posterior",
"control", "label:<key>") in every stored config and summary, so run ids and existing run folders
read as before; every reader parses it here, in one place, instead of slicing the text.

The control and the oracles are the given-z runs of docs/concepts/controls.md (the z-free control,
the label oracles and their null oracles).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

LatentSourceKind = Literal["posterior", "control", "label", "null"]
_PREFIX = "label:"
#: the null oracle of a label: z := the label of another row (a seeded permutation of the rows' values),
#: so z has the label's K and marginal but carries nothing about its own row's y
_NULL = "null:"


@dataclass(frozen=True)
class LatentSource:
    """A parsed ``latent_source``: ``kind`` "posterior" (q(z|x,y) learned), "control" (z held at one
    value: K = 1), "label" (z := the row's value of ``label``, a key of the rows' labels or
    "strategy") or "null" (z := that label's value on another row: a seeded permutation of the values
    over the rows, the same K and marginal, independent of the row's y); ``label`` is None unless kind is
    "label" or "null"."""

    kind: LatentSourceKind
    label: str | None = None

    @classmethod
    def parse(cls, text: Any) -> LatentSource:
        """The typed form of ``text`` ("posterior", "control" or "label:<key>" with a non-empty key;
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
        raise ValueError(f"latent_source={text!r}: expected 'posterior', 'control', 'label:<key>' or 'null:<key>'")

    @classmethod
    def oracle(cls, key: str) -> LatentSource:
        """The label oracle of ``key``."""
        return cls.parse(_PREFIX + key)

    @classmethod
    def null_oracle(cls, key: str) -> LatentSource:
        """The null oracle of ``key`` (its values permuted over the rows)."""
        return cls.parse(_NULL + key)

    @property
    def given(self) -> bool:
        """True for the control and the oracles: z is given, not inferred (no posterior, no rate)."""
        return self.kind != "posterior"

    def __str__(self) -> str:
        """The text form stored in configs and summaries."""
        return {"label": _PREFIX, "null": _NULL}.get(self.kind, "") + self.label if self.label else self.kind
