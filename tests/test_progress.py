"""zfree.core.progress: every bar is a bar on a terminal and plain lines in a log (a study's preparation
fine-tunes its base model for 300 steps; in a nohup log its bar had been one line of every redraw)."""

from __future__ import annotations

import io
import sys

import pytest

from zfree.core import progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def log(capsys):
    """stderr as a log: pytest's capture, which is no terminal (a file or a pipe)."""

    class Log:
        def getvalue(self):
            return capsys.readouterr().err

    return Log()


def _steps(b, n, postfix_at=()):
    for i in range(1, n + 1):
        b.update(1)
        if i in postfix_at:
            b.set_postfix(val_c_base=f"{1 / i:.4f}")
    b.close()


def test_a_bar_in_a_log_is_lines_without_carriage_returns(log):
    assert progress.in_a_log() and not progress.on_terminal()
    _steps(progress.bar(total=300, initial=150, desc="text base model", mininterval=2), 150, postfix_at=(50, 100))
    text = log.getvalue()
    assert "\r" not in text and "\x1b" not in text, repr(text)
    lines = text.splitlines()
    assert all(ln.startswith("text base model:") for ln in lines), lines
    # the first state, one line per evaluation (its postfix), the last state: the 150 updates between them
    # come within LOG_EVERY_S of each other and draw nothing
    assert len(lines) == 4, lines
    assert "150/300" in lines[0] and "val_c_base=0.0200" in lines[1] and "val_c_base=0.0100" in lines[2]
    assert "300/300" in lines[-1]


def test_a_state_already_in_the_log_is_not_written_again(log):
    """A training whose last step is an evaluation wrote its final state twice (the evaluation's line, then the
    bar's closing line)."""
    _steps(progress.bar(total=4, desc="base model"), 4, postfix_at=(2, 4))
    lines = log.getvalue().splitlines()
    assert [ln.split("|")[-1].split(" [")[0].strip() for ln in lines] == ["0/4", "2/4", "4/4"], lines


def test_a_bar_on_a_terminal_redraws_itself(monkeypatch):
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    assert progress.on_terminal() and not progress.in_a_log()
    _steps(progress.bar(total=3, desc="steps"), 3)
    assert "\r" in term.getvalue() and "3/3" in term.getvalue()


@pytest.mark.parametrize("kw", [dict(progress=False), dict(terminal_only=True)])
def test_no_bar_without_progress_and_none_in_a_log_for_a_terminal_only_bar(log, kw):
    b = progress.bar(total=4, desc="scoring", **kw)
    assert b.disable
    _steps(b, 4, postfix_at=(2,))
    assert log.getvalue() == ""


def test_log_line_is_stamped_and_keeps_its_detail(log):
    progress.log_line("runs: 2 of 3 done", "p1: failed")
    progress.log_line("base model ready")
    first, second = log.getvalue().splitlines()
    assert first.startswith("runs: 2 of 3 done (p1: failed, ") and first.endswith(")") and len(first.split(", ")[-1]) == 9
    assert second.startswith("base model ready (") and second[-9:-1].count(":") == 2
