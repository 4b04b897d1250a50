"""Config fields added after run ids were first recorded: ``later(default)`` declares one, with the
default that reproduces the runs of the versions before it. At that default such a field is left out of
a run's identity (``zfree.config.LATER_FIELD_DEFAULTS``, read by ``without_log_only``), so finished runs
recorded without it keep their ids and are reused; set to anything else it is part of the identity like
every other field. Declared at the field, so adding one is one line of its config section."""

from __future__ import annotations

from dataclasses import field, fields
from typing import Any

#: the metadata key that marks a field as added later
LATER = "zfree_later"


def later(default: Any):
    """A dataclass field with ``default`` (an immutable value) that is left out of a run's identity at it."""
    return field(default=default, metadata={LATER: True})


def later_defaults(*classes: type) -> dict[str, Any]:
    """``{field: default}`` of every field ``later`` declared in the dataclasses ``classes``, in their order."""
    return {f.name: f.default for cls in classes for f in fields(cls) if f.metadata.get(LATER)}
