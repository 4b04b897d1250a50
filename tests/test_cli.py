"""The ``zfree`` command itself (``zfree.cli.main``, ``zfree.cli.parser``): what it answers before any
sub-command runs."""

from __future__ import annotations

import pytest

import zfree
from zfree.cli import main


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


def test_an_invalid_own_train_config_is_refused_before_torch_and_before_the_run_folder(tmp_path):
    """Issue 60: ``zfree train --model M --data F --out RUN --set ...`` with an invalid config (example
    weighting with epsilon 0) loaded torch, split the data into RUN and linked the model before refusing it,
    leaving a half-written run folder. Now it is one line, no heavy import, nothing written."""
    import subprocess
    import sys

    (tmp_path / "pairs.jsonl").write_text('{"x": "a", "y": "b"}\n')
    code = ("import sys\nfrom zfree.cli import main\n"
            "rc = main(['train', '--model', 'no-such-model', '--data', 'pairs.jsonl', '--out', 'run',"
            " '--set', 'weighting=example', '--set', 'epsilon=0'])\n"
            "print(rc, sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.stdout == "2 []\n"
    assert r.stderr == ("zfree: error: --set weighting=example epsilon=0: epsilon=0.0 must be > 0 for example "
                        "weighting (seed 002)\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pairs.jsonl"]
