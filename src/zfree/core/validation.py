"""Field checks of the frozen configs: each raises ValueError naming the field (``zfree.config``,
``zfree.data.synth.DataConfig``)."""

from __future__ import annotations

import math
from typing import Any, get_args


def check_choice(name: str, value: Any, literal) -> None:
    """ValueError naming ``name`` unless ``value`` is one of the ``Literal``'s values (listed)."""
    valid = get_args(literal)
    if value not in valid:
        raise ValueError(f"{name}={value!r} is not one of {list(valid)}")


def check_int(name: str, value: Any, lo: int | None = None) -> None:
    """ValueError naming ``name`` unless ``value`` is an int (not a bool) and >= ``lo``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name}={value!r} must be an integer")
    if lo is not None and value < lo:
        raise ValueError(f"{name}={value!r} must be >= {lo}")


def check_range(name: str, value: float, lo: float | None = None, hi: float | None = None,
                 lo_open: bool = False) -> None:
    """ValueError naming ``name`` unless ``value`` is a finite number in [lo, hi] ((lo, hi] with ``lo_open``)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{name}={value!r} must be a finite number")
    if lo is not None and (value <= lo if lo_open else value < lo):
        raise ValueError(f"{name}={value!r} must be {'>' if lo_open else '>='} {lo}")
    if hi is not None and value > hi:
        raise ValueError(f"{name}={value!r} must be <= {hi}")
