"""`localspec chat`: the interactive face; a Textual app that streams answers and shows the speculation."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from localspec.cli import app, user_errors
from localspec.cli.options import generation_options
from localspec.errors import UserError
from localspec.settings import Settings

if TYPE_CHECKING:
    from localspec.tui.store import ChatStore


@app.command()
@generation_options("chat", hide=("verbose",), max_tokens=1024, temperature=0.7, ctx=8192)
def chat(
    conversation: Annotated[
        int | None,
        typer.Argument(metavar="ID", show_default=False,
                       help="With --resume: the saved conversation to continue (an ID from --list).")  # fmt: skip
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue a saved conversation: the latest one, or ID.")
    ] = False,
    list_saved: Annotated[
        bool, typer.Option("--list", help="List the saved conversations (ID, last change, turns, first question).")
    ] = False,
    delete: Annotated[
        int | None, typer.Option("--delete", metavar="ID", help="Delete a saved conversation.", show_default=False)
    ] = None,
    no_history: Annotated[
        bool, typer.Option("--no-history", help="Keep nothing of this conversation: it is not saved, and its tokens "
                           "stay out of the history later runs draft from (they are kept only in memory while it "
                           "runs).")
    ] = False,
    system: Annotated[str | None, typer.Option("--system", help="System message that opens the conversation.")] = None,
    save_dir: Annotated[
        Path | None, typer.Option("--save-dir", help="Where Ctrl+S writes transcripts (default: the current folder).")
    ] = None,
    *,
    options: Settings,
) -> None:
    """Chat with a model in the terminal and watch the speculation.

    Drafted tokens the model accepted are green, rejected drafts flash
    struck-through, and a side panel shows tok/s and acceptance live.

    Keys: Enter send · Shift+Enter or Ctrl+J new line · Esc or Ctrl+C stop
    answering · Ctrl+R answer again · F3 edit the last message · F4 copy the
    answer · Ctrl+O saved conversations · F1 or ? all keys · Ctrl+Q quit.
    Commands: /help · /new · /save · /quit.

    Conversations are saved as they happen; --resume continues one.
    `--temperature 0` makes answers deterministic (greedy).

    Examples:

      localspec chat

      localspec chat --drafter ngram --temperature 0 --system "Answer briefly."

      localspec chat --list

      localspec chat --resume 3
    """
    with user_errors():
        if conversation is not None and not resume:
            raise UserError(f"to continue conversation {conversation}: localspec chat --resume {conversation}")
        if list_saved or delete is not None:
            _manage(list_saved, delete)
            return
        if resume and no_history:
            raise UserError("--resume continues a saved conversation: drop --no-history")
        options = chat_settings(options, no_history)
        store = None if no_history else _open_store()
        resume_id = _resume_id(store, conversation) if resume and store is not None else None
        # Textual draws on the terminal and reads keys from it: with a pipe or a file instead it would write escape
        # codes there and wait for keys that never come
        if not (sys.stdin.isatty() and sys.stdout.isatty() and sys.stderr.isatty()):
            raise UserError("localspec chat needs a terminal; use `localspec run` for scripted generation")
        if save_dir is not None and not save_dir.is_dir():
            raise UserError(f"--save-dir {save_dir} is not a folder")
    _prepare_model(options.model)

    from localspec.tui.app import ChatApp

    chat_app = ChatApp(options, system=system, save_dir=save_dir, store=store, resume=resume_id)
    try:
        chat_app.run()
    finally:
        if store is not None:
            store.close()
        for notice in getattr(getattr(chat_app, "engine", None), "closing", []):  # the terminal is ours again
            print(f"localspec: {notice}", file=sys.stderr)


def chat_settings(options: Settings, no_history: bool) -> Settings:
    """The chat's settings: with --no-history its turns are drafted from in memory only, never written into the
    history on disk (the saved conversation and the history are both what "history" means to the user)."""
    if not no_history:
        return options
    if options.history.mode == "disk":
        raise UserError("--no-history keeps nothing of this conversation on disk: drop --keep-history")
    return replace(options, history=replace(options.history, mode=options.history.resolved("memory")))


def _open_store() -> ChatStore:
    from localspec.tui.store import ChatStore, default_path

    return ChatStore(default_path())


def _resume_id(store: ChatStore, conversation: int | None) -> int:
    """The conversation --resume continues; a one-line UserError if there is none."""
    if conversation is None:
        latest = store.latest()
        if latest is None:
            raise UserError("there is no saved conversation to resume yet: start one with `localspec chat`")
        return latest
    store.load(conversation)  # says so if there is no such conversation
    return conversation


def _manage(list_saved: bool, delete: int | None) -> None:
    """--list and --delete: no terminal needed, no model opened."""
    store = _open_store()
    try:
        if delete is not None:
            if not store.delete(delete):
                raise UserError(f"no saved conversation {delete}: `localspec chat --list` shows them")
            print(f"Deleted conversation {delete}.")
            _forget(delete)
        if list_saved:
            saved = store.list()
            if not saved:
                print(f"No saved conversations yet (they are kept in {store.path}).")
            for c in saved:
                print(f"{c.id:>5}  {c.describe()}")
    finally:
        store.close()


def _forget(conversation: int) -> None:
    """A deleted conversation's turns leave the history later runs draft from, too (they were tagged with its id
    as they were fed)."""
    from localspec.history.history import forget_everywhere

    try:
        forget_everywhere(conversation)
    except OSError as e:
        raise UserError(f"conversation {conversation} is deleted, but the history it fed could not be rewritten "
                        f"({e.strerror or type(e).__name__}): `localspec cache --clear` removes all of it") from None


def _prepare_model(spec: str | None) -> None:
    """Assemble the embedded model (or find a pulled one) before the full-screen app takes the terminal.

    Assembling prints progress that a full-screen app would hide; any failure here is left for the app to show
    as a notice, where the user sees it alongside what to do next.
    """
    from localspec.models.sources import resolve_model

    try:
        resolve_model(spec)
    except UserError:
        pass
