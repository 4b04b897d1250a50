"""A study folder holds its plan: ``plan.json``, what the first run of a command decided.

The first invocation of a study writes ``OUT/plan.json`` once its grid is decided (after the probes
and the budget's cuts, ``zfree_lab.experiment.estimate.plan``): the *request* (the spec as asked, with
its ``--set`` overrides, and the budget) and what was *fitted* to it (the steps, batch, evaluated
rows, betas, weightings and oracles left after the cuts, the micro-batch, the workers) and the run
ids. The same command again reuses that plan: nothing is re-probed or re-cut, the same run ids are
trained, finished runs are skipped and only what is missing runs. A command whose request differs
(other preset, spec, ``--set``, data file, model or budget) is refused in one line naming what
differs, before anything in the folder is touched; ``--workers`` may differ (it changes no result).
One request is an extension, not another study: the same one with more seeds (``zfree study --seeds 0-2``
after ``--seeds 0``, or after the preset's own seed). It keeps the plan's cuts (the new seeds' runs get the
same steps, rows and grid as the planned ones, so the seeds stay paired) and adds the new seeds' runs; it is
accepted only when every planned run is among the extended grid's (``extend_plan``), and the plan then
records the request it grew from.
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


def more_seeds(saved: dict, request: dict) -> tuple[list[int] | None, list[int]] | None:
    """(the plan's seeds, the new ones) when ``request`` is the saved plan's with more seeds: ``spec.seeds``
    is the only difference, the new list keeps every seed of the plan's (a plan without seeds ran the
    spec's own seed, which the new list must then hold: ``extend_plan`` checks it by the run ids). Else None."""
    diff = differences(saved["request"], request)
    old, new = saved["request"]["spec"].get("seeds"), request["spec"].get("seeds")
    if not diff or any(not d.startswith("spec.seeds:") for d in diff) or new is None:
        return None
    return (old, list(new)) if old is None or set(old) <= set(new) else None


def check_request(out: Path, saved: dict, request: dict) -> tuple[list[int] | None, list[int]] | None:
    """ConfigError in one line naming what differs between the saved plan's request and this one; the
    same request with more seeds passes (``extend_plan`` finishes the check). Returns ``more_seeds``'s
    answer: None for the same request, (the plan's seeds, the new ones) for more seeds."""
    diff = differences(saved["request"], request)
    grown = more_seeds(saved, request) if diff else None
    if diff and grown is None:
        more = f" (and {len(diff) - 2} more)" if len(diff) > 2 else ""
        raise ConfigError(f"{out / PLAN_FILE}: this study was planned for another request: {'; '.join(diff[:2])}{more}; "
                          "rerun the command that made it (finished runs are kept) or use a new --out")
    return grown


def write_plan(out: Path, request: dict, spec: ExperimentSpec, workers: int, run_ids: list[str],
               estimate: dict | None, grown_from: list[dict] | None = None) -> None:
    """Write ``out/plan.json`` (atomically): the request, the fitted spec, workers, run ids and the
    estimate's record (``estimate.json``'s, None without one); ``grown_from``: the earlier requests of a
    plan extended with more seeds (``extend_plan``), oldest first."""
    atomic_write_json(out / PLAN_FILE, {"request": request, "fitted": fitted_of(spec), "workers": workers,
                                        "run_ids": run_ids, "estimate": estimate,
                                        "made": time.strftime("%Y-%m-%d %H:%M:%S"),
                                        **({"grown_from": grown_from} if grown_from else {})})


def extend_plan(out: Path, saved: dict, request: dict, spec: ExperimentSpec, workers: int,
                run_ids: list[str]) -> str:
    """Rewrite the saved plan for the same request with more seeds (``more_seeds``): ``spec`` is the plan's
    fitted spec with the new seeds and ``run_ids`` its grid's. ConfigError, before the plan is touched, when
    a planned run is not among ``run_ids`` (the plan ran another seed than the new list holds). Returns
    the line to print."""
    old, new = more_seeds(saved, request)  # type: ignore[misc]  # (check_request let only this through)
    missing = [r for r in saved.get("run_ids", []) if r not in set(run_ids)]
    if missing:
        raise ConfigError(f"{out / PLAN_FILE}: --seeds {','.join(map(str, new))} does not hold the seed its "
                          f"{len(missing)} planned run(s) were made with (e.g. {missing[0]}); add the new seeds to the "
                          "plan's, or use a new --out")
    grown = [*saved.get("grown_from", []), {"request": saved["request"], "run_ids": saved.get("run_ids", []),
                                             "made": saved.get("made")}]
    write_plan(out, request, spec, workers, run_ids, saved.get("estimate"), grown)
    added = len(run_ids) - len(saved.get("run_ids", []))
    seeds = "the spec's own seed" if old is None else f"seeds {old}"
    return (f"plan: {out / PLAN_FILE} (made {saved.get('made', '?')}) extended from {seeds} to seeds {new} with its "
            f"cuts, no probe: {added} new runs, {len(run_ids)} in all; finished ones are skipped")
