"""zfree.core.validation: the field checks of the frozen configs; each refusal is a ValueError
naming the field and the value, each boundary is where its docstring puts it."""

from __future__ import annotations

import math
from typing import Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zfree.core.validation import check_choice, check_int, check_range


def test_check_choice():
    kinds = Literal["discrete", "continuous"]
    check_choice("latent_kind", "discrete", kinds)
    with pytest.raises(ValueError, match=r"^latent_kind='vq' is not one of \['discrete', 'continuous'\]$"):
        check_choice("latent_kind", "vq", kinds)


def test_check_int():
    check_int("steps", 0)
    check_int("steps", 5, lo=5)
    for bad in (True, 1.0, "3", None):
        with pytest.raises(ValueError, match=rf"^steps={bad!r} must be an integer$"):
            check_int("steps", bad)
    with pytest.raises(ValueError, match=r"^steps=4 must be >= 5$"):
        check_int("steps", 4, lo=5)


def test_check_range_boundaries():
    check_range("beta", 0.0, lo=0.0)  # closed below
    check_range("beta", 1, lo=0, hi=1)  # closed above; an int is a number
    with pytest.raises(ValueError, match=r"^beta=0.0 must be > 0$"):
        check_range("beta", 0.0, lo=0, lo_open=True)
    with pytest.raises(ValueError, match=r"^beta=-0.1 must be >= 0$"):
        check_range("beta", -0.1, lo=0)
    with pytest.raises(ValueError, match=r"^beta=1.5 must be <= 1$"):
        check_range("beta", 1.5, hi=1)
    for bad in (float("nan"), float("inf"), True, "0.1", None):
        with pytest.raises(ValueError, match=r"^beta=.* must be a finite number$"):
            check_range("beta", bad)


@given(st.floats(allow_nan=True, allow_infinity=True), st.floats(-5, 5), st.floats(-5, 5), st.booleans())
def test_check_range_accepts_exactly_the_interval(x, lo, hi, lo_open):
    inside = math.isfinite(x) and (x > lo if lo_open else x >= lo) and x <= hi
    try:
        check_range("x", x, lo=lo, hi=hi, lo_open=lo_open)
        ok = True
    except ValueError as e:
        assert str(e).startswith("x=")
        ok = False
    assert ok == inside
