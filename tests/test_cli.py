"""The ``zfree`` command itself (``zfree_lab.cli.main``, ``zfree_lab.cli.parser``): what it answers before any
sub-command runs."""

from __future__ import annotations

import pytest

import zfree
import zfree_lab
from zfree_lab.cli import main


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out == f"zfree {zfree.__version__}\n"


def test_bare_zfree_prints_the_help_and_exits_0(capsys):
    """Issue 60: bare ``zfree`` was argparse's "the following arguments are required: cmd" (exit 2)."""
    assert main([]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("usage: zfree") and "zfree COMMAND --help" in out and err == ""


@pytest.mark.parametrize("argv", [["train", "--config", "absent.json", "--out", "run"], ["study", "--out", "study"]])
def test_an_unknown_set_field_names_the_closest_field_not_all_of_them(argv, tmp_path, monkeypatch, capsys):
    """Issue 60: the error listed all 72 field names and suggested none (and, for a study, came after the
    experiment layer's imports)."""
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--set", "betta=1"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [err.strip()] and "unknown config field 'betta' (did you mean 'beta'?)" in err
    assert "lr_new" not in err and not (tmp_path / argv[-1]).exists()


def test_an_unknown_preset_names_the_closest_one(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["study", "--preset", "smok", "--out", "study"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [err.strip()] and "--preset 'smok' (did you mean 'smoke'?) is not one of" in err
    assert not (tmp_path / "study").exists()
    assert main(["study", "--preset", "qqqqqq", "--out", "study"]) == 2
    assert "did you mean" not in capsys.readouterr().err  # nothing close: the list alone


def test_an_invalid_own_train_config_is_refused_before_torch_and_before_the_run_folder(tmp_path):
    """Issue 60: ``zfree train --model M --data F --out RUN --set ...`` with an invalid config (example
    weighting with epsilon 0) loaded torch, split the data into RUN and linked the model before refusing it,
    leaving a half-written run folder. Now it is one line, no heavy import, nothing written."""
    import subprocess
    import sys

    (tmp_path / "pairs.jsonl").write_text('{"x": "a", "y": "b"}\n')
    (tmp_path / "no-model").mkdir()  # a model folder (a missing path or an empty folder is refused first) never loaded
    (tmp_path / "no-model" / "config.json").write_text("{}")
    code = ("import sys\nfrom zfree_lab.cli import main\n"
            "rc = main(['train', '--model', 'no-model', '--data', 'pairs.jsonl', '--out', 'run',"
            " '--set', 'weighting=example', '--set', 'epsilon=0'])\n"
            "print(rc, sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.stdout == "2 []\n"
    assert r.stderr == ("zfree: error: --set weighting=example epsilon=0: epsilon=0.0 must be > 0 for example "
                        "weighting (w = 1 / (b + epsilon))\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["no-model", "pairs.jsonl"]


@pytest.fixture
def lab_home(tmp_path, monkeypatch):
    """A working folder with a study written by ``zfree study --out runs/my-study`` (its runs/ only)."""
    (tmp_path / "runs" / "my-study" / "runs").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ZFREE_STUDY", raising=False)
    monkeypatch.delenv("ZFREE_RUNS", raising=False)
    return tmp_path


def test_zfree_lab_copies_the_notebooks_chooses_the_study_and_prints_the_command(lab_home, monkeypatch, capsys):
    """Issue 60: from a wheel there was no way to explore (the notebooks in site-packages, the explorer
    looking in the lab folder's runs/). ``zfree lab STUDY --print-only``: the shipped notebooks copied to
    ./zfree-lab, JupyterLab's command on that folder with the project's contents manager, the study and
    the runs/ it was typed beside in the environment the explorer reads; no server started."""
    import shlex
    import sys

    from zfree.core.paths import NOTEBOOKS, runs_home
    from zfree_lab.report.lab_launch import lab_copy

    monkeypatch.delenv("HF_HUB_OFFLINE")  # set for the suite; zfree lab sets it as make lab does, unless set
    assert main(["lab", "runs/my-study", "--print-only", "--no-browser", "--port", "9999"]) == 0
    out, err = capsys.readouterr()
    lab = lab_home / "zfree-lab"
    shipped = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))
    assert "explore.ipynb" in shipped and all((lab / n).read_text() == lab_copy(NOTEBOOKS / n) for n in shipped)
    assert sorted(p.name for p in lab.iterdir()) == shipped  # unpaired copies (lab_copy): no jupytext.toml
    assert err == (f"notebooks in {lab}: {len(list(lab.iterdir()))} copied; JupyterLab opens explore.ipynb: "
                   "Run > Run All Cells draws the explorer\n")
    words = shlex.split(out)
    env = dict(w.split("=", 1) for w in words[:3])
    assert env == {"ZFREE_STUDY": str(lab_home / "runs" / "my-study"), "ZFREE_RUNS": str(runs_home().resolve()),
                   "HF_HUB_OFFLINE": "1"}
    assert words[3:6] == [sys.executable, "-m", "jupyterlab"]
    assert {f"--ServerApp.root_dir={lab}", "--ServerApp.contents_manager_class=zfree_lab.report.lab_contents.LabContentsManager",
            "--ContentsManager.pre_save_hook=zfree_lab.report.lab.strip_on_save", "--no-browser", "--port=9999"} <= set(words[6:])
    (lab / "explore.ipynb").write_text("my edits")  # a second time: the user's notebook is kept
    assert main(["lab", "--print-only"]) == 0
    out, err = capsys.readouterr()
    assert (lab / "explore.ipynb").read_text() == "my edits"
    assert err == (f"notebooks in {lab}: 0 copied, {len(list(lab.iterdir()))} kept (already there: yours); "
                   "JupyterLab opens explore.ipynb: Run > Run All Cells draws the explorer\n")
    assert "ZFREE_STUDY" not in out  # no STUDY: the explorer opens the newest under ZFREE_RUNS


def test_the_explorer_reads_the_study_and_the_runs_zfree_lab_sets(lab_home, monkeypatch):
    """What the kernel of explore.ipynb sees in the lab folder: the study given, else the newest study
    of the runs/ zfree lab was typed beside (not of the lab folder, its working directory)."""
    from zfree.core.paths import runs_home
    from zfree_lab.experiment.study_folders import choose_study
    from zfree_lab.report.lab_launch import lab_plan

    (lab_home / "runs" / "my-study" / "runs" / "r1").mkdir()
    (lab_home / "runs" / "my-study" / "runs" / "r1" / "summary.json").write_text("{}")
    plan = lab_plan("runs/my-study", copy=False)
    monkeypatch.chdir(plan.folder.parent)
    for k, v in plan.env.items():
        monkeypatch.setenv(k, v)
    assert choose_study(None) == lab_home / "runs" / "my-study"
    monkeypatch.delenv("ZFREE_STUDY")
    monkeypatch.setenv("ZFREE_RUNS", str(lab_home / "runs"))  # as a wheel's zfree lab sets it: ./runs
    (lab_home / "zfree-lab").mkdir()
    monkeypatch.chdir(lab_home / "zfree-lab")
    assert runs_home() == lab_home / "runs" and choose_study(None) == lab_home / "runs" / "my-study"


def test_zfree_lab_without_jupyterlab_is_one_line_naming_the_lab_extra(lab_home, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "jupyterlab" else real(name, *a))
    assert main(["lab", "runs/my-study"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [err.strip()] and "JupyterLab is not installed" in err
    assert "pip install 'zfree[lab]'" in err and not (lab_home / "zfree-lab").exists()  # nothing copied


@pytest.mark.parametrize("where", ["the shipped notebooks", "the package", "the lab's package", "a missing study",
                                   "not a study"])
def test_zfree_lab_refuses_a_folder_inside_the_installation_and_a_study_that_is_none(where, lab_home, capsys):
    from pathlib import Path

    from zfree.core.paths import NOTEBOOKS

    args = {"the shipped notebooks": ["--dir", str(NOTEBOOKS)],
            "the package": ["--dir", str(Path(zfree.__file__).parent / "lab")],
            "the lab's package": ["--dir", str(Path(zfree_lab.__file__).parent / "lab")],
            "a missing study": ["runs/no-such-study"], "not a study": ["zfree-lab-not-a-study"]}[where]
    (lab_home / "zfree-lab-not-a-study").mkdir()
    assert main(["lab", *args, "--print-only"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("zfree: error: ") and err.count("\n") == 1, err
    assert not (Path(zfree.__file__).parent / "lab").exists() and not (lab_home / "zfree-lab").exists()
    assert not (Path(zfree_lab.__file__).parent / "lab").exists()


def test_train_fields_lists_every_flat_field_with_its_default_what_unknown_field_errors_point_to(capsys):
    """An unknown field's error pointed to docs/reference/config.md, which a clone holds without the list (`make
    docs` generates it): it now points to `zfree train --fields`, which lists every field the config takes."""
    import json

    from zfree.config import TrainConfig

    assert main(["train", "--fields"]) == 0
    lines = capsys.readouterr().out.splitlines()
    defaults = TrainConfig().to_flat()
    assert [ln.split(" = ")[0] for ln in lines] == TrainConfig.flat_fields() == list(defaults)
    for ln in lines:
        name, rest = ln.split(" = ", 1)
        value, section = rest.rsplit("  # ", 1)
        assert json.loads(value) == defaults[name] and section in ("paths", "objective", "model", "optim", "aid")
    assert lines[0] == 'data_dir = "data/synth/default"  # paths'


def test_a_closed_stdout_ends_the_command_without_a_traceback(tmp_path):
    """`zfree train --fields | head -1`: the reader leaves, the write fails; the shell's SIGPIPE status, no
    traceback on stderr."""
    import subprocess
    import sys

    code = "import sys; from zfree_lab.cli import main; sys.exit(main(['train', '--fields']))"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # the reader is gone before the command writes
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141 and "Traceback" not in err and "BrokenPipe" not in err, err
