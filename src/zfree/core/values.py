"""Values typed where they enter: text (``--set``, YAML, a papermill parameter) or Python values
converted or checked by a config field's declared type; and the check of a torch device."""

from __future__ import annotations

import functools
import re
from dataclasses import fields
from enum import Enum
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from zfree.core.errors import ConfigError

_TRUE, _FALSE = {"true", "yes", "on", "1"}, {"false", "no", "off", "0"}
_NONE = {"none", "null", "~", ""}


def _unquote(text: str) -> str:
    t = text.strip()
    return t[1:-1] if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"" else t


def _coerce_enum(name: str, value: Any, typ: type[Enum]) -> Enum:
    """The member of the str-valued enum ``typ`` whose value is ``value`` (text unquoted first)."""
    if isinstance(value, typ):
        return value
    raw = _unquote(value) if isinstance(value, str) else value
    if isinstance(raw, str) and raw in {m.value for m in typ}:  # any other type (a list, a bool) is refused
        return typ(raw)
    raise ConfigError(f"{name}={value!r} is not one of {[m.value for m in typ]}")


def coerce_value(name: str, value: Any, typ: Any) -> Any:
    """``value`` converted to the declared type ``typ`` of field ``name``.

    Text (a ``--set`` value, a YAML string, a raw papermill parameter) is parsed: bool from
    true/false/yes/no/on/off/1/0; int from decimal digits; float from any Python float literal
    (``1e-3``, ``1.0e-3``, ``3``); Literal from one of its choices (quotes stripped); a str-valued
    Enum (``zfree.config.LatentKind``) to its member from the member's value; Optional
    from none/null/~ or the inner type. A Python value must already have the type (an int is a
    valid float; a bool is never an int or float). Raises ``ConfigError`` (a ValueError)
    naming the field, the value and the expected type.
    """
    origin = get_origin(typ)
    is_text = isinstance(value, str)
    if origin is Union or type(typ).__name__ == "UnionType":
        args = [a for a in get_args(typ) if a is not type(None)]
        if value is None or (is_text and value.strip().lower() in _NONE):
            return None
        return coerce_value(name, value, args[0] if len(args) == 1 else Any)
    if origin is Literal:
        valid = get_args(typ)
        if not isinstance(value, bool) and value in valid:
            return value
        if is_text and _unquote(value) in valid:
            return _unquote(value)
        raise ConfigError(f"{name}={value!r} is not one of {list(valid)}")
    if isinstance(typ, type) and issubclass(typ, Enum):
        return _coerce_enum(name, value, typ)
    if typ is bool:
        if isinstance(value, bool):
            return value
        if is_text and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise ConfigError(f"{name}={value!r} must be true or false")
    if typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if is_text:
            t = value.strip()
            if re.fullmatch(r"[+-]?[0-9]+", t):
                try:
                    return int(t)
                except ValueError:  # more digits than int() accepts (sys.get_int_max_str_digits)
                    pass
        raise ConfigError(f"{name}={value!r} must be an integer")
    if typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        if is_text:
            try:
                return float(value.strip())
            except ValueError:
                pass
        raise ConfigError(f"{name}={value!r} must be a number (e.g. 0.001 or 1.0e-3)")
    if typ is str:
        if is_text:
            return value
        raise ConfigError(f"{name}={value!r} must be a string")
    return value  # sub-configs and sequences: checked by their own __post_init__


def check_device(device: str) -> None:
    """Refuse a torch device this machine does not have (``ConfigError`` naming it): ``cpu``;
    ``cuda`` / ``cuda:N`` only with CUDA and N < the device count; ``mps`` only on Apple GPUs;
    ``auto`` (cuda when present, else cpu) always."""
    import torch  # lazy: zfree.config (read by `zfree --help`) imports this module

    if device == "auto":
        return
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ConfigError(f"device={device!r} is not a torch device ({e})") from None
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0 or (dev.index or 0) >= n:
            raise ConfigError(f"device={device!r} is not available on this machine "
                              f"({n} CUDA device(s)); use device='cpu' or 'auto'")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"device={device!r} is not available on this machine; use device='cpu'")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"device={device!r}: expected cpu, cuda, cuda:N or mps")


@functools.lru_cache(maxsize=None)
def field_types(cls) -> dict[str, Any]:
    """``{field name: declared type}`` of a dataclass ``cls`` (string annotations resolved)."""
    hints = get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls)}


def typed_fields(obj) -> None:
    """Convert (text) or check (Python values) every field of a frozen config by its declared
    type, first thing in ``__post_init__``; ``ConfigError`` names the field."""
    for name, typ in field_types(type(obj)).items():
        value = getattr(obj, name)
        new = coerce_value(name, value, typ)
        if new is not value:
            object.__setattr__(obj, name, new)
