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
