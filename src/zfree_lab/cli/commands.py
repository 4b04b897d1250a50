"""The commands of ``zfree``, one function each (``cmd_<command>_<sub>``), called by ``zfree_lab.cli.main``
with the parsed arguments (``zfree_lab.cli.parser``). Each imports its heavy modules (torch,
transformers, pandas, the trainers) when it runs, so ``zfree --help`` stays fast; a command returns
its exit status (None: 0).
"""

from __future__ import annotations

import difflib

import json
import sys
from dataclasses import fields
from pathlib import Path

from zfree.config import BaseTrainConfig, TrainConfig, parse_assignment, with_default_epsilon
from zfree.core.errors import ConfigError, InputError
from zfree.core.io import read_json
from zfree.core.paths import PATH_FIELDS, resolve_given
from zfree.core.values import check_device
from zfree.data.synth import DataConfig, write_benchmark


def _config_from_args(cls, a):
    """The config dataclass ``cls`` from the options ``zfree_lab.cli.parser`` added for its fields."""
    return cls(**{f.name: getattr(a, f.name) for f in fields(cls)})


def cmd_data_synth(a):
    """``zfree data synth``: write the synthetic strategy benchmark (``DataConfig`` from the options)
    into ``--out``."""
    out = write_benchmark(_config_from_args(DataConfig, a), a.out)
    print(f"benchmark in {out}")


def cmd_data_e2e(a):
    """``zfree data e2e``: convert the cleaned E2E NLG CSVs in ``--src`` to JSONL pairs with labels in
    ``--out``; prints each split's source, rows and distinct x."""
    from zfree_lab.run.e2e import convert_e2e  # lazy: pandas (zfree --help stays fast)

    meta = convert_e2e(a.src, a.out)
    print(json.dumps({k: {f: v[f] for f in ("source", "n_rows", "n_x")} for k, v in meta["splits"].items()}, indent=2))
    print(f"E2E pairs in {a.out}")


def cmd_base_train(a):
    """``zfree base train``: train the base GPT-2 (``BaseTrainConfig`` from the options) into ``--out``
    and write its reference; prints its steps, wall time and final ratio to the analytic c_base."""
    from zfree_lab.run.base_training import train_base  # lazy: torch and transformers (zfree --help stays fast)

    log = train_base(a.data, a.out, _config_from_args(BaseTrainConfig, a), threads=a.threads, init_from=a.init_from)
    print(json.dumps({k: log[k] for k in ("steps", "wall_s", "c_base_analytic", "final_ratio")}, indent=2))


def cmd_base_reference(a):
    """``zfree base reference``: (re)write a base run's z-free reference on the data folder's
    val.jsonl; prints its metadata."""
    from zfree.reference.reference import build_reference  # lazy: torch, transformers

    ref = build_reference(a.base, a.data)
    print(json.dumps(ref.meta, indent=2))


def cmd_score(a):
    """``zfree score``: z-free surprisal of a JSONL file under a causal LM, written to ``--out`` only
    after every row is scored; prints c_base (nats per token), the rows, valid rows, x tokens cut and
    the folder written."""
    from zfree.data.pairs import load_pairs

    load_pairs(a.data, limit=a.limit)  # bad rows in one line before torch and the model load (a minute under load)
    from zfree.reference.scoring import ScoringPolicy, score_file, write_scores  # lazy: torch, transformers

    policy = ScoringPolicy(bos=a.bos, add_eos=not a.no_eos, max_length=a.max_length)
    res = score_file(a.model, a.data, device=a.device, dtype=a.dtype, policy=policy, limit=a.limit,
                     trust_remote_code=a.trust_remote_code, cache=False if a.no_cache else None,
                     cache_dir=a.cache_dir, max_batch_tokens=a.max_batch_tokens, progress=True)
    write_scores(res, a.out)  # only after every row scored: a bad input writes nothing
    print(json.dumps({**{k: res.summary()[k] for k in ("c_base", "n_rows", "n_valid", "x_tokens_cut")},
                      "out": str(Path(a.out).resolve())}, indent=2))  # where the three files are


def _read_flat_config(path: str) -> dict:
    """A flat config JSON (``_``-prefixed record keys dropped; a run folder's config.json has its
    relative data_dir/base_dir resolved against that folder); InputError naming the file."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"config file {p} does not exist")
    try:
        raw = json.loads(p.read_text(encoding="utf-8-sig"))
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"{p}: not a valid JSON config ({e})") from None
    if not isinstance(raw, dict):
        raise InputError(f"{p}: a config is a JSON object of flat fields, got {type(raw).__name__}")
    flat = {k: v for k, v in raw.items() if not str(k).startswith("_")}
    if raw.get("_paths_relative_to") == "run folder":  # a run record: its paths are portable
        from zfree_lab.run.run_config import resolved_flat

        flat = resolved_flat(flat, p.parent)
    return flat


def cmd_train(a):
    """``zfree train``: one CVAE from a flat config (``--config``, ``--set`` overrides typed by each
    field's declaration) into ``--out``, or ``--resume RUN_DIR`` from its own config.json; with
    ``--model``/``--data`` an own-model run (``cmd_train_own``). Prints the summary (``_print_summary``: every
    metric as JSON with ``--json``, else ``run_brief``'s lines). Raises ValueError for missing or conflicting
    options, FileNotFoundError for a missing config, ConfigError
    naming the config for a bad field or an unavailable device, each before torch is imported."""
    if a.fields:
        print(field_listing())
        return 0
    if a.model or a.data:
        return cmd_train_own(a)
    if a.resume:
        if a.config or a.set:
            raise ValueError("--resume RUN_DIR takes the run's own config.json; do not combine it with --config/--set")
        a.config, a.out = str(Path(a.resume) / "config.json"), a.resume
        if not Path(a.config).exists():
            raise FileNotFoundError(f"{a.config} does not exist: {a.resume} is not a run folder")
    if not a.config or not a.out:
        raise ValueError("give --config CONFIG.json --out RUN_DIR, or --resume RUN_DIR")
    overrides = _set_overrides(a.set)
    flat = _read_flat_config(a.config)
    flat.update(with_default_epsilon(overrides, flat))
    defaults = TrainConfig().to_flat()
    for k in PATH_FIELDS:  # a relative folder not in the working directory, or the default, names ROOT's
        v = flat.get(k, defaults[k])
        flat[k] = resolve_given(v) if isinstance(v, str) and v.strip() else v
    try:
        cfg = TrainConfig.from_flat(flat)
    except ValueError as e:
        raise ConfigError(f"config {a.config}{' with --set' if a.set else ''}: {e}") from None
    check_device(cfg.optim.device)
    from zfree_lab.run.training import train_cvae  # lazy: torch and transformers (zfree --help stays fast)

    _print_summary(train_cvae(cfg, a.out), a.out, a.json)


def _print_summary(summary: dict, out, as_json: bool) -> None:
    """A finished run's summary: every metric as JSON with ``--json``, else ``run_brief``'s lines."""
    if as_json:
        print(json.dumps({k: v for k, v in summary.items() if "/" in k}, indent=2))
        return
    from zfree_lab.report.run_brief import run_brief

    print("\n".join(run_brief(summary, out)))


def _set_overrides(assignments: list[str] | None) -> dict:
    """The ``--set FIELD=VALUE`` options as ``{field: typed value}`` (typed by each field's declaration:
    steps=true is refused); ConfigError naming an unknown field with the closest known one. Light: no torch."""
    return dict(parse_assignment(kv) for kv in assignments or [])


def field_listing() -> str:
    """``zfree train --fields``: one line per flat config field, ``name = default  # section``, in the config's
    order (the paths, then objective, model, optim, aid): what an unknown-field error points to."""
    defaults, lines = TrainConfig().to_flat(), []
    for section, cls in {"paths": None, **TrainConfig._SUB}.items():
        names = ("data_dir", "base_dir") if cls is None else [f.name for f in fields(cls)]
        lines += [f"{n} = {json.dumps(defaults[n])}  # {section}" for n in names]
    return "\n".join(lines)


def cmd_train_own(a):
    """``zfree train --model M --data F.jsonl --out RUN``: split, base link and reference in RUN, one CVAE there.
    The config (defaults, ``--set``) is validated first: a bad one is refused before torch is imported, the
    model loaded or RUN created."""
    if not (a.model and a.data and a.out) or a.config or a.resume:
        raise ValueError("give --model MODEL --data FILE.jsonl --out RUN_DIR (without --config/--resume)")
    overrides = with_default_epsilon(_set_overrides(a.set))
    try:  # the paths are placeholders: own_train_config sets RUN's, and checks the data and model itself
        TrainConfig.from_flat({**TrainConfig().to_flat(), "data_dir": a.out, "base_dir": a.out,
                               "c_base_source": "pretrained_source", **overrides})
    except ValueError as e:
        raise ConfigError(f"--set {' '.join(a.set or [])}: {e}") from None
    from zfree_lab.experiment.own_study import own_train_config  # lazy: torch, transformers (zfree --help stays fast)
    from zfree_lab.run.training import train_cvae  # lazy: as above

    cfg = own_train_config(a.model, a.data, a.out, val=a.val, overrides=overrides)
    check_device(cfg.optim.device)
    _print_summary(train_cvae(cfg, a.out), a.out, a.json)


def _report_failures(failed: list[tuple[str, Path]], logs: dict[str, str] | None = None,
                     errors: dict[str, str] | None = None) -> int:
    """Print each failed point's full message, its error.json and its cluster job's log (``logs``:
    run id -> path) to stderr; 1 if any failed. A point without a readable error.json (a cluster
    job killed before it could write one) prints its status's error (``errors``: run id -> text)."""
    for run_id, err_file in failed:
        try:
            msg = read_json(err_file).get("error", "?")
        except (OSError, ValueError):
            msg = (errors or {}).get(run_id) or "(error.json unreadable)"
        log = (logs or {}).get(run_id)
        print(f"FAILED {run_id}: {msg}\n  see {err_file}" + (f"\n  job log {log}" if log else ""), file=sys.stderr)
    return 1 if failed else 0


def cmd_study(a):
    """``zfree study``: a preset's study, or an own-model study with ``--model`` and ``--data`` (a
    preset bound to a model fetches it and uses the shipped data); every run that failed in this
    invocation is printed to stderr. Returns 1 if one failed, else 0. Raises ConfigError for
    ``--preset`` with ``--spec``, ValueError for an own-model study without both ``--model`` and
    ``--data`` or for ``--val``/``--budget`` without one."""
    overrides = with_default_epsilon(_set_overrides(a.set))  # an unknown field is refused before the imports below
    if a.data:  # its rows too (a light module): bad data is refused in a second, not after the imports below
        from zfree.data.pairs import load_pairs

        for f in (a.data, a.val):
            if f and Path(f).is_file():  # a missing file or a device: refused by the study's own check
                load_pairs(f)
    # lazy: the experiment layer imports torch, transformers and the training stack (seconds); `zfree --help` need not
    from zfree_lab.experiment.catalog import DEFAULT_OWN_BUDGET
    from zfree_lab.experiment.estimate import parse_budget
    from zfree_lab.experiment.own_study import BOUND_PRESETS, OWN_PRESETS, run_own_study
    from zfree_lab.experiment.study import PRESETS, run_study

    # the invocation's start (``zfree_lab.cli.invocation_start``: the process's, for the `zfree` command): the
    # budget counts its start-up and imports too, and the scan for this invocation's failed runs below reads
    # the error.json files written since then
    started = a.started
    if a.preset is not None and a.spec is not None:
        raise ConfigError(f"--preset {a.preset!r} and --spec {a.spec}: give one (the spec is the whole grid, "
                          f"a preset another)")
    if a.preset is not None and a.preset not in {**PRESETS, **OWN_PRESETS}:
        close = difflib.get_close_matches(a.preset, [*PRESETS, *OWN_PRESETS], n=1)
        raise ValueError(f"--preset {a.preset!r}{f' (did you mean {close[0]!r}?)' if close else ''} is not one of "
                         f"{sorted(PRESETS)} (the shipped base), "
                         f"{sorted(set(OWN_PRESETS) - set(BOUND_PRESETS))} (with --model and --data) or "
                         f"{sorted(BOUND_PRESETS)} (a model zfree fetches)")
    if a.preset in BOUND_PRESETS and not (a.model or a.data or a.spec):  # its model fetched, the shipped data
        from zfree_lab.run.fetch import fetch_model

        name, a.data, shipped_val = BOUND_PRESETS[a.preset]
        a.model, a.val = str(fetch_model(name)), a.val or shipped_val
    if a.model or a.data or a.spec:
        if not (a.model and a.data):
            raise ValueError("an own-model study needs --model MODEL and --data FILE.jsonl (--spec/--val optional)")
        run_own_study(a.model, a.data, a.out, val=a.val, preset=a.preset or "own", spec=a.spec, workers=a.workers,
                      overrides=overrides, seeds=a.seeds, started=started,
                      finetune=a.finetune_base, finetune_steps=a.finetune_steps, estimate=not a.no_estimate,
                      render=not a.no_report, budget_s=parse_budget(DEFAULT_OWN_BUDGET if a.budget is None and (a.preset or "own") == "own"
                                            and not a.spec else a.budget))
    else:
        if a.val or a.budget:
            raise ValueError(f"{'--val' if a.val else '--budget'} needs --model and --data (an own-model study)")
        run_study(a.preset or "default", a.out, retrain_base=a.retrain_base, workers=a.workers,
                  estimate=not a.no_estimate, overrides=overrides, seeds=a.seeds, started=started,
                  render=not a.no_report)
    # the pipeline prints its FAILED lines; a point that failed in this invocation left an error.json since it
    # started (one left by an earlier invocation is older: that run is not reported as failed now)
    runs = Path(a.out).resolve() / "runs"
    failed = sorted((e.parent.name, e) for e in runs.glob("*/error.json") if e.stat().st_mtime >= started)
    code = _report_failures(failed)
    if code:
        print(f"zfree: study {a.preset or 'own'!r}: {len(failed)} run(s) failed", file=sys.stderr)
    return code


def cmd_model_fetch(a):
    """``zfree model fetch``: download a known model and convert it to a transformers folder; prints the folder,
    and only it, on stdout (``M="$(zfree model fetch NAME)"``): progress, a library's prints included, goes to stderr."""
    from contextlib import redirect_stdout

    from zfree_lab.run.fetch import fetch_model  # lazy: torch and transformers convert the weights

    with redirect_stdout(sys.stderr):
        folder = fetch_model(a.name, a.root)
    print(folder)


def cmd_report(a):
    """``zfree report``: aggregate a study or sweep folder and render its report.html; prints its path."""
    from zfree_lab.experiment.render import render_report  # lazy: pandas, matplotlib, papermill (zfree --help stays fast)

    print(render_report(a.study_dir, progress=True))


def cmd_status(a):
    """``zfree status``: print how far a study or sweep folder has got (``study_status``); ``--json``: the
    record. Reads the folder only."""
    from zfree_lab.experiment.study_status import format_status, study_status

    st = study_status(a.study_dir, metrics=a.metrics)
    print(json.dumps(st, indent=2) if a.json else format_status(st))


def cmd_sweep(a):
    """``zfree sweep``: run a YAML sweep spec on the local pool or through submitit (with
    ``--sbatch-test-only`` only ask the scheduler whether it accepts the job options), then its report
    unless ``--no-report`` (none when every point failed). Returns 1 if a point failed (each printed to stderr,
    every point included), else 0. Raises
    ConfigError for a device of a local point that this machine does not have."""
    # lazy: as in cmd_study
    from zfree_lab.experiment.executor import make_executor
    from zfree_lab.experiment.sweeps import load_spec, run_sweep
    from zfree_lab.run.locks import STUDY_MARKS, claim_folder

    spec = load_spec(a.spec)
    out = Path(a.out or Path("runs") / f"sweep-{spec.name}")
    kind = a.executor or spec.executor
    if kind == "local":  # the points run on this machine: its devices must exist
        for dev in sorted({p.params["device"] for p in spec.points()}):
            check_device(dev)
    opts = {**spec.executor_options, **({"cluster": a.cluster} if a.cluster else {})}
    # the folder is checked and made zfree's own before submitit writes its job folder (out/submitit) into it
    claim_folder(out, "sweep folder", STUDY_MARKS)
    if a.sbatch_test_only:
        return _sbatch_check(opts, out / "submitit")
    ex = make_executor(kind, a.workers or spec.workers, folder=out / "submitit", **(opts if kind == "submitit" else {}))
    try:
        statuses = run_sweep(spec, out, executor=ex, render=not a.no_report)  # report.html unless no point finished
    finally:
        ex.shutdown()
    failed = [s for s in statuses if s["status"] == "failed"]  # run_sweep's closing line counted them
    return _report_failures([(f["run_id"], out.resolve() / "runs" / f["run_id"] / "error.json") for f in failed],
                            logs={f["run_id"]: f["log"] for f in failed if f.get("log")},
                            errors={f["run_id"]: f["error"] for f in failed})


def _sbatch_check(options: dict, folder: Path) -> int:
    """``zfree sweep --sbatch-test-only``: the sbatch script of one job of the spec, checked by the
    scheduler (``zfree_lab.experiment.cluster.sbatch_test_only``); prints its answer, 0 when accepted,
    ConfigError (exit 2) naming the script and the scheduler's refusal."""
    from zfree_lab.experiment.cluster import sbatch_script, sbatch_test_only

    script = sbatch_script(folder, options)
    r = sbatch_test_only(script, folder)
    if r.returncode != 0:
        raise ConfigError(f"sbatch --test-only refused {folder / 'check.sbatch'}: {r.stderr.strip() or r.returncode}")
    print(r.stderr.strip() or r.stdout.strip())
    return 0


def cmd_lab(a):
    """``zfree lab [STUDY]``: the shipped notebooks copied to ``--dir`` (``zfree_lab.report.lab_launch``),
    then JupyterLab started there in place of this process, the explorer on STUDY; with
    ``--print-only`` the command is printed instead. InputError naming the ``lab`` extra when
    JupyterLab is not installed (checked first, before anything is copied)."""
    import os

    from zfree_lab.report.lab_launch import check_jupyterlab, lab_plan

    if not a.print_only:
        check_jupyterlab()
    plan = lab_plan(a.study, a.dir, port=a.port, ip=a.ip, no_browser=a.no_browser)
    kept = f", {len(plan.kept)} kept (already there: yours)" if plan.kept else ""
    print(f"notebooks in {plan.folder}: {len(plan.copied)} copied{kept}; JupyterLab opens explore.ipynb: "
          f"Run > Run All Cells draws the explorer", file=sys.stderr)
    if a.print_only:
        print(plan.command_line())
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(plan.argv[0], plan.argv, {**os.environ, **plan.env})  # JupyterLab owns the terminal (Ctrl-C) from here
