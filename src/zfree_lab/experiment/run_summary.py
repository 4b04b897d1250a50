"""A run's summary.json as the tables read it (``read_run_summary``): checked to be a run's summary
(one line naming the file and key otherwise), with only what a table column can hold.

A summary.json holds the flat config (text, numbers, bools), the metrics (numbers, bools, None), the
gate rows' record (``TEXT_FIELDS``) and the aid's traces (``LIST_FIELDS``). A hand edit or a plug-in
can put anything there; a dict or text in a metric field flowed into summary.csv and the report
(issue 61), so it is left out, with one warning naming the run and the fields.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

from zfree.core.errors import InputError
from zfree.core.io import read_json

#: keys of a run's summary.json with their JSON types (a hand-made or foreign file is named, not a traceback)
_SUMMARY_TYPES = {"weighting": (str,), "beta": (int, float), "steps": (int,)}
#: the non-config keys of a summary.json that hold text (the gate rows' record: zfree_lab.run.run_data.RunData.gate_record)
#: or a list (the aid's traces: zfree_lab.run.run_folder.write_summary); every other key beside the flat
#: config's is a metric
TEXT_FIELDS = ("aid/gate_split", "aid/gate_ids_sha256")
LIST_FIELDS = ("aid/gate", "aid/restarts", "aid/aggressive_mi")
#: what a value may be, by kind of field
_METRIC = (int, float, bool, type(None))
_ALLOWED = {"metric": _METRIC, "config": (*_METRIC, str), "text": (str, type(None)), "list": (list, type(None))}


@functools.cache
def _config_keys() -> frozenset[str]:
    from zfree.config import TrainConfig  # lazy: the config layer's dataclasses, read once

    return frozenset(TrainConfig.flat_fields())


def _kind(key: str) -> str:
    if key in TEXT_FIELDS:
        return "text"
    if key in LIST_FIELDS:
        return "list"
    return "config" if key in _config_keys() else "metric"


def metric_fields_only(d: dict, path: Path) -> dict:
    """``d`` (a summary.json) without the values a table cannot hold (``_ALLOWED`` by ``_kind``): a
    dict, list or text in a metric field, a dict or list in a config field (TrainConfig's flat keys),
    anything but text in ``TEXT_FIELDS`` or a list in ``LIST_FIELDS``. One warning per run naming its
    summary.json and the fields left out (they read as NaN downstream)."""
    bad = {k: type(v).__name__ for k, v in d.items() if not isinstance(v, _ALLOWED[_kind(k)])}
    if bad:
        shown = ", ".join(f"{k!r} ({t})" for k, t in list(bad.items())[:6])
        more = f", ... ({len(bad)} fields)" if len(bad) > 6 else ""
        warnings.warn(f"{path}: {shown}{more} not a number (nor a known text or list field): left out of "
                      f"summary.csv and the report", stacklevel=3)
    return {k: v for k, v in d.items() if k not in bad}


def read_run_summary(path: Path) -> dict:
    """A run's summary.json, checked to be a run summary: InputError in one line naming the file
    and the key otherwise (a list or a wrong-typed key raised AttributeError/TypeError); its values a
    table cannot hold left out with a warning (``metric_fields_only``)."""
    try:
        d = read_json(path)
    except ValueError as e:
        raise InputError(f"{path}: not JSON ({e}); move the run folder away or rerun it") from None
    if not isinstance(d, dict):
        raise InputError(f"{path}: not a run summary (a JSON object expected, got a {type(d).__name__}); "
                         "move the run folder away or rerun it")
    for key, types in _SUMMARY_TYPES.items():  # (a key absent reads as NaN downstream)
        v = d.get(key)
        if key in d and (not isinstance(v, types) or isinstance(v, bool)):
            raise InputError(f"{path}: not a run summary ({key!r} is {v!r}; expected a "
                             f"{' or '.join(t.__name__ for t in types)}); move the run folder away or rerun it")
    return metric_fields_only(d, path)
