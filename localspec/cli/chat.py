"""`localspec chat`: the interactive face; a Textual app that streams answers and shows the speculation."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from localspec.cli import app, user_errors
from localspec.cli.options import Options, generation_options
from localspec.errors import UserError


@app.command()
@generation_options(hide=("verbose",), max_tokens=1024, temperature=0.7, ctx=8192)
def chat(
    system: Annotated[str | None, typer.Option("--system", help="System message that opens the conversation.")] = None,
    save_dir: Annotated[
        Path | None, typer.Option("--save-dir", help="Where Ctrl+S writes transcripts (default: the current folder).")
    ] = None,
    *,
    options: Options,
) -> None:
    """Chat with a model in the terminal and watch the speculation: drafted tokens the model accepted are
    green, rejected drafts flash struck-through, and a side panel shows tok/s and acceptance live.

    Keys: Enter send · Esc stop · F2 next drafter · Ctrl+G rejected drafts · Ctrl+L clear · Ctrl+S save ·
    F1 or ? help · Ctrl+Q quit. `--temperature 0` makes answers deterministic (greedy).

    Examples:

      localspec chat

      localspec chat --drafter ngram --temperature 0 --system "Answer briefly."
    """
    with user_errors():
        # Textual draws on the terminal and reads keys from it: with a pipe or a file instead it would write escape
        # codes there and wait for keys that never come
        if not (sys.stdin.isatty() and sys.stdout.isatty() and sys.stderr.isatty()):
            raise UserError("localspec chat needs a terminal; use `localspec run` for scripted generation")
        if save_dir is not None and not save_dir.is_dir():
            raise UserError(f"--save-dir {save_dir} is not a folder")
    _prepare_model(options.model)

    from localspec.tui.app import ChatApp

    ChatApp(options, system=system, save_dir=save_dir).run()


def _prepare_model(spec: str | None) -> None:
    """Assemble the embedded model (or find a pulled one) before the full-screen app takes the terminal.

    Assembling prints progress that a full-screen app would hide; any failure here is left for the app to show
    as a notice, where the user sees it alongside what to do next.
    """
    from localspec.models.registry import resolve_model

    try:
        resolve_model(spec)
    except UserError:
        pass
