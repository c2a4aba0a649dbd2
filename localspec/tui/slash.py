"""Slash commands typed into the chat's input, as people type them in other chats: /help, /new, /save, /quit.

A message is a command only when it is a single ``/word`` and nothing else: ``/usr/bin/env`` or ``/quit now``
go to the model as they are. An unknown ``/word`` is not sent (it was most likely meant as a command); the input
keeps it and a hint says what the commands are. ``//word`` sends ``/word`` itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_WORD = re.compile(r"/([A-Za-z][\w-]*)")


@dataclass(frozen=True)
class SlashCommand:
    names: tuple[str, ...]  # the first is the one the help shows
    action: str  # the ChatApp action it runs (the same as its key)
    does: str


COMMANDS = (
    SlashCommand(("help",), "help", "the keys and commands (F1)"),
    SlashCommand(("new", "clear"), "clear", "a new conversation, after a yes (Ctrl+L)"),
    SlashCommand(("save",), "save", "save the transcript as Markdown (Ctrl+S)"),
    SlashCommand(("predict",), "predict", "the next answer drafts from the last one: ask for a change to it"),
    SlashCommand(("quit", "exit"), "quit", "quit (Ctrl+Q)"),
)


def command_word(text: str) -> str | None:
    """The command word of ``text`` (lower case, without the slash) if it is a single /word, else None."""
    match = _WORD.fullmatch(text.strip())
    return match.group(1).lower() if match else None


def find(word: str) -> SlashCommand | None:
    return next((c for c in COMMANDS if word in c.names), None)


def as_message(text: str) -> str:
    """What a message that is not a command sends: ``//word…`` loses one slash (a message that starts with /)."""
    return text[1:] if text.startswith("//") else text


def unknown_hint(word: str) -> str:
    names = " ".join(f"/{c.names[0]}" for c in COMMANDS)
    return f"/{word} is not a command ({names}); to send it as a message, start it with //"
