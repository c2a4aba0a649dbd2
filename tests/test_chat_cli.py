"""`localspec chat` as a command: what it does before the full-screen app starts."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import assert_one_line_error, localspec


def test_chat_without_a_terminal_says_so_and_exits(model_path: Path) -> None:
    # stdin and stdout are pipes here (as in `localspec chat </dev/null >file`): a full-screen app cannot run, and
    # before this was checked it wrote escape codes and never exited (the timeout turns that into a failure)
    result = localspec(["chat", "--model", str(model_path)], input="", timeout=60)
    assert_one_line_error(result.code, result.stderr, "needs a terminal", "localspec run")
    assert result.stdout == ""
