"""`localspec chat` as a command: what it does before the full-screen app starts."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from localspec.cli import app
from localspec.settings import Settings
from tests.conftest import assert_one_line_error, localspec


def test_chat_without_a_terminal_says_so_and_exits(model_path: Path) -> None:
    # stdin and stdout are pipes here (as in `localspec chat </dev/null >file`): a full-screen app cannot run, and
    # before this was checked it wrote escape codes and never exited (the timeout turns that into a failure)
    result = localspec(["chat", "--model", str(model_path)], input="", timeout=60)
    assert_one_line_error(result.code, result.stderr, "needs a terminal", "localspec run")
    assert result.stdout == ""


def test_no_history_keeps_the_conversation_out_of_the_history_on_disk(
    model_path: Path, monkeypatch: pytest.MonkeyPatch, history_on: None
) -> None:
    import localspec.cli.chat as chat_cli
    import localspec.tui.app as tui_app

    opened: list[tuple[Settings, object]] = []

    class Recorder:  # the app, as far as the command goes: what it was opened with
        def __init__(self, options: Settings, **kw: object) -> None:
            opened.append((options, kw["store"]))

        def run(self) -> None:
            pass

    tty = SimpleNamespace(isatty=lambda: True)
    monkeypatch.setattr(chat_cli, "sys", SimpleNamespace(stdin=tty, stdout=tty, stderr=tty))
    monkeypatch.setattr(tui_app, "ChatApp", Recorder)
    runner = CliRunner()
    assert runner.invoke(app, ["chat", "--model", str(model_path), "--no-history"]).exit_code == 0
    options, store = opened[-1]
    assert store is None and options.history.resolved("disk") == "memory"  # neither saved nor kept on disk
    assert runner.invoke(app, ["chat", "--model", str(model_path)]).exit_code == 0
    assert opened[-1][0].history.resolved("disk") == "disk"  # the chat's own default, without the flag
    both = runner.invoke(app, ["chat", "--model", str(model_path), "--no-history", "--keep-history"])
    assert_one_line_error(both.exit_code, both.stderr, "--no-history", "--keep-history")
