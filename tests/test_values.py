"""zfree.core.values: text and Python values typed by a field's declared type (coerce_value), the
machine check of a torch device, and the per-field conversion of a frozen config; every refusal is
a ConfigError (a ValueError) naming the field and the value."""

from __future__ import annotations

import dataclasses
from typing import Literal, Optional

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from zfree.core.errors import ConfigError
from zfree.core.values import check_device, coerce_value, field_types, typed_fields


@pytest.mark.parametrize("text,want", [("true", True), (" Yes ", True), ("on", True), ("1", True), ("FALSE", False),
                                       ("no", False), ("off", False), ("0", False)])
def test_bool_text(text, want):
    assert coerce_value("flag", text, bool) is want


@pytest.mark.parametrize("text,want", [("3", 3), (" -12 ", -12), ("+7", 7), ("007", 7)])
def test_int_text(text, want):
    got = coerce_value("steps", text, int)
    assert got == want and type(got) is int


@pytest.mark.parametrize("text,want", [("1e-3", 1e-3), ("1.0e-3", 1e-3), ("3", 3.0), (" -0.5 ", -0.5), ("inf", float("inf"))])
def test_float_text(text, want):
    got = coerce_value("lr", text, float)
    assert got == want and type(got) is float


def test_literal_optional_and_str():
    kinds = Literal["discrete", "continuous"]
    assert coerce_value("latent_kind", "discrete", kinds) == "discrete"
    assert coerce_value("latent_kind", "'continuous'", kinds) == "continuous"  # quotes stripped
    assert coerce_value("latent_kind", ' "discrete" ', kinds) == "discrete"
    for none in (None, "none", "NULL", "~", "", "  "):
        assert coerce_value("seed", none, Optional[int]) is None
    assert coerce_value("seed", "5", Optional[int]) == 5 and coerce_value("seed", "5", int | None) == 5
    assert coerce_value("name", "x", str) == "x"
    marker = object()
    assert coerce_value("sub", marker, list) is marker  # sub-configs / sequences: left to their own checks


def test_python_values_must_already_have_the_type():
    assert coerce_value("lr", 2, float) == 2  # an int is a valid float
    assert coerce_value("steps", 5, int) == 5 and coerce_value("flag", False, bool) is False
    for typ in (int, float):
        with pytest.raises(ConfigError):
            coerce_value("n", True, typ)  # a bool is never a number
    with pytest.raises(ConfigError):
        coerce_value("flag", 1, bool)
    with pytest.raises(ConfigError):
        coerce_value("steps", 2.0, int)
    with pytest.raises(ConfigError):
        coerce_value("kind", True, Literal[1, 2])  # True == 1, but a bool is not the choice 1


@pytest.mark.parametrize("value,typ,match", [
    ("maybe", bool, "must be true or false"), ("1.5", int, "must be an integer"), ("1e3", int, "must be an integer"),
    ("ten", float, "must be a number"), ("vq", Literal["discrete", "continuous"], r"not one of \['discrete', 'continuous'\]"),
    (3, str, "must be a string"), ("x", Optional[int], "must be an integer"), ("9" * 5000, int, "must be an integer"),
])
def test_parse_errors_name_the_field_and_value(value, typ, match):
    with pytest.raises(ConfigError, match=match) as e:
        coerce_value("my_field", value, typ)
    assert str(e.value).startswith(f"my_field={value!r}")
    assert isinstance(e.value, ValueError)


@given(st.integers(-10**30, 10**30))
def test_int_text_round_trips(n):
    assert coerce_value("n", str(n), int) == n


@given(st.floats(allow_nan=False))
def test_float_text_round_trips(x):
    assert coerce_value("x", repr(x), float) == x


def test_check_device():
    for ok in ("auto", "cpu"):
        check_device(ok)
    with pytest.raises(ConfigError, match="device='gpu0' is not a torch device"):
        check_device("gpu0")
    with pytest.raises(ConfigError, match="expected cpu, cuda, cuda:N or mps"):
        check_device("meta")
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ConfigError, match=rf"device='cuda:{n}' is not available on this machine \({n} CUDA"):
        check_device(f"cuda:{n}")
    if n:
        check_device("cuda")
    if not torch.backends.mps.is_available():
        with pytest.raises(ConfigError, match="device='mps' is not available"):
            check_device("mps")


@dataclasses.dataclass(frozen=True)
class _Cfg:
    steps: int = 1
    lr: "float" = 0.1
    kind: Literal["a", "b"] = "a"
    seed: Optional[int] = None

    def __post_init__(self):
        typed_fields(self)


def test_field_types_and_typed_fields_convert_text_per_field():
    assert field_types(_Cfg) == {"steps": int, "lr": float, "kind": Literal["a", "b"], "seed": Optional[int]}
    cfg = _Cfg(steps="3", lr="1e-2", kind="'b'", seed="null")
    assert (cfg.steps, cfg.lr, cfg.kind, cfg.seed) == (3, 0.01, "b", None)
    kept = _Cfg()
    assert kept.lr == 0.1 and kept.steps == 1
    with pytest.raises(ConfigError, match="^steps='three' must be an integer"):
        _Cfg(steps="three")
