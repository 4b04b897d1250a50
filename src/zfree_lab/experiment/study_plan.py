"""A study folder holds its plan: ``plan.json``, what the first run of a command decided.

The first invocation of a study writes ``OUT/plan.json`` once its grid is decided (after the probes
and the budget's cuts, ``zfree_lab.experiment.estimate.plan``): the *request* (the spec as asked, with
its ``--set`` overrides, and the budget) and what was *fitted* to it (the steps, batch, evaluated
rows, betas, weightings and oracles left after the cuts, the micro-batch, the workers) and the run
ids. The same command again reuses that plan: nothing is re-probed or re-cut, the same run ids are
trained, finished runs are skipped and only what is missing runs. A command whose request differs
(other preset, spec, ``--set``, data file, model or budget) is refused in one line naming what
differs, before anything in the folder is touched; ``--workers`` may differ (it changes no result).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from zfree.core.errors import ConfigError
from zfree.core.io import atomic_write_json, read_json
from zfree.core.paths import ROOT, ROOT_PREFIX
from zfree_lab.experiment.spec import ExperimentSpec
from zfree_lab.experiment.spec_file import spec_from_dict

PLAN_FILE = "plan.json"
#: spec fields that change how a study runs, not what it computes: left out of the request
_NOT_REQUESTED = ("workers",)
#: spec fields added later, left out of the request at their default (a plan written before them still matches)
_LATER_DEFAULTS = {"text_oracles": False}


def _jsonable(v: Any) -> Any:
    """``v`` as plain JSON values: paths absolute (a rerun from another folder is the same request), or
    ``zfree:<path from ROOT>`` inside this checkout (a rerun from another clone of the repository is the same
    request: its shipped folders are its own copy), tuples as lists, dataclasses as dicts."""
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: _jsonable(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, Path):
        p = v.expanduser().resolve()
        return ROOT_PREFIX + p.relative_to(ROOT).as_posix() if p.is_relative_to(ROOT) else str(p)
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)


def request_of(spec: ExperimentSpec, budget_s: float | None) -> dict:
    """What a command asks for: the spec as given (``--set`` included) and the budget in seconds."""
    asked = {k: v for k, v in _jsonable(spec).items() if k not in _NOT_REQUESTED
             and not (k in _LATER_DEFAULTS and v == _LATER_DEFAULTS[k])}
    return {"spec": asked, "budget_s": budget_s}


def fitted_of(spec: ExperimentSpec) -> dict:
    """The parts of a spec the estimate may cut (``zfree_lab.experiment.estimate.fit_budget``)."""
    return {"train": _jsonable(spec.train), "boundary": None if spec.boundary is None else _jsonable(spec.boundary),
            "oracles": None if spec.oracles is None else list(spec.oracles)}


def apply_fitted(spec: ExperimentSpec, fitted: dict) -> ExperimentSpec:
    """``spec`` with the cut parts of a saved plan (``fitted_of``), through the spec's own JSON form."""
    return spec_from_dict({**spec.to_dict(), **fitted})


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out  # (an empty mapping reads as absent)
    return {prefix.rstrip("."): d}


def differences(saved: dict, now: dict) -> list[str]:
    """``"key: A in plan.json, B now"`` for every leaf where two requests differ (dotted keys). A plan written
    before requests kept ``zfree:`` paths holds the absolute path of the checkout that made it: it matches
    ``zfree:<rel>`` now when it ends in ``/<rel>`` (``_same_path``)."""
    a, b = _flat(saved), _flat(now)
    return [f"{k}: {json.dumps(a.get(k))} in {PLAN_FILE}, {json.dumps(b.get(k))} now"
            for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k) and not _same_path(a.get(k), b.get(k))]


def _same_path(saved: Any, now: Any) -> bool:
    """Whether an absolute path in an older plan names the shipped folder ``now`` = ``zfree:<rel>`` names: it
    ends in ``/<rel>`` (another checkout's copy, or this one's). The runs themselves are identified by content,
    so a folder that changed between the checkouts trains new runs rather than reusing old ones."""
    if not (isinstance(saved, str) and isinstance(now, str) and now.startswith(ROOT_PREFIX)):
        return False
    rel = now[len(ROOT_PREFIX):]
    return Path(saved).is_absolute() and bool(rel) and saved.endswith("/" + rel)


def load_plan(out: Path) -> dict | None:
    """``out/plan.json`` (None when the study has none yet). ConfigError naming the file when it is
    unreadable (it is written atomically, so only a hand edit breaks it)."""
    p = out / PLAN_FILE
    if not p.exists():
        return None
    try:
        rec = read_json(p)
        rec["request"], rec["fitted"]  # noqa: B018 - the keys a plan must have
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{p}: not a readable study plan ({type(e).__name__}: {e}); move it away to plan "
                          "the study again (finished runs are kept)") from None
    return rec


def check_request(out: Path, saved: dict, request: dict) -> None:
    """ConfigError in one line naming what differs between the saved plan's request and this one."""
    diff = differences(saved["request"], request)
    if diff:
        more = f" (and {len(diff) - 2} more)" if len(diff) > 2 else ""
        raise ConfigError(f"{out / PLAN_FILE}: this study was planned for another request: {'; '.join(diff[:2])}{more}; "
                          "rerun the command that made it (finished runs are kept) or use a new --out")


def write_plan(out: Path, request: dict, spec: ExperimentSpec, workers: int, run_ids: list[str],
               estimate: dict | None) -> None:
    """Write ``out/plan.json`` (atomically): the request, the fitted spec, workers, run ids and the
    estimate's record (``estimate.json``'s, None without one)."""
    atomic_write_json(out / PLAN_FILE, {"request": request, "fitted": fitted_of(spec), "workers": workers,
                                        "run_ids": run_ids, "estimate": estimate,
                                        "made": time.strftime("%Y-%m-%d %H:%M:%S")})
