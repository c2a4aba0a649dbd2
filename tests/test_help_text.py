"""Every command's --help reads as paragraphs in an 80-column terminal. Rich keeps a docstring's line breaks, so a
paragraph of several lines, one of them longer than the terminal, wraps that line and leaves a stub under it."""

from __future__ import annotations

from typing import Any

import typer.main
from typer.testing import CliRunner

from localspec.cli import app

WIDTH = 78  # an 80-column terminal less rich's margins


def _commands() -> list[tuple[str, Any]]:
    group: Any = typer.main.get_command(app)
    return [("localspec", group), *((f"localspec {name}", cmd) for name, cmd in group.commands.items())]


def test_no_help_paragraph_has_a_line_wider_than_the_terminal() -> None:
    wide = [f"{name}: {line[:50]}…" for name, cmd in _commands() for paragraph in (cmd.help or "").split("\n\n")
            if len(lines := [line.strip() for line in paragraph.strip().splitlines()]) > 1
            for line in lines if len(line) > WIDTH]
    assert not wide, "rewrap these paragraphs at 76 columns (or make each one line):\n" + "\n".join(wide)


def test_help_renders_without_stubs_at_80_columns() -> None:
    result = CliRunner().invoke(app, ["cache", "--help"], terminal_width=80, env={"COLUMNS": "80"})
    assert result.exit_code == 0
    lines = [line.strip() for line in result.output.splitlines()]
    assert "as token ids (they decode to the text) in the cache folder: one file per" in lines
