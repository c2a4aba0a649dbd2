"""The terminal chat app (`localspec chat`), built with Textual on the generator's events."""

from __future__ import annotations

__all__ = ["ChatApp"]


def __getattr__(name: str) -> object:
    # Textual takes a moment to import: load it only when the chat is actually started.
    if name == "ChatApp":
        from localspec.tui.app import ChatApp

        return ChatApp
    raise AttributeError(name)
