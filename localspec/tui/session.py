"""The conversation on screen and its saved copy, kept in step: every change to the turns goes through here.

Free of Textual, like ``conversation.py``. Without a store nothing is saved (tests, or a history that could not
be opened); a store that fails mid-chat is reported once through ``on_error`` and the chat goes on unsaved.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from localspec.events import Stats
from localspec.tui.conversation import Conversation, Turn
from localspec.tui.store import ChatStore


class Session:
    def __init__(
        self, store: ChatStore | None, system: str | None, on_error: Callable[[str], None] = lambda _: None
    ) -> None:
        self.store = store
        self.system = system  # for new conversations; a resumed one keeps its own
        self.model = ""  # the model's name, recorded with a new conversation (known once it is open)
        self.on_error = on_error
        self.conversation = Conversation(system=system)
        self.id: int | None = None  # in the store; a conversation is created there with its first turn

    @property
    def turns(self) -> list[Turn]:
        return self.conversation.turns

    def add_user(self, text: str) -> Turn:
        return self._save(self.conversation.add_user(text))

    def add_assistant(self, text: str, stats: Stats | None, drafter: str, stop_reason: str) -> Turn:
        return self._save(self.conversation.add_assistant(text, stats, drafter, stop_reason))

    def save_answer(
        self, turn: Turn | None, text: str, stats: Stats | None, drafter: str, stop_reason: str
    ) -> Turn:
        """The answer being written, as far as it got: added the first time (``turn`` None), then rewritten in
        place, here and in the store (one transaction each)."""
        if turn is None:
            return self.add_assistant(text, stats, drafter, stop_reason)
        turn.text, turn.stats, turn.drafter, turn.stop_reason = text, stats, drafter, stop_reason
        store, conversation_id = self.store, self.id
        if store is not None and conversation_id is not None and turn.saved_id is not None:
            self._guard(lambda: store.update_turn(conversation_id, turn))
        return turn

    def take_back(self, turn: Turn) -> list[Turn]:
        """Remove ``turn`` and the turns after it, here and in the store."""
        removed = self.conversation.take_back(turn)
        if self.store is not None and self.id is not None:
            self._guard(lambda: self.store.remove_turns(self.id, removed))  # type: ignore[union-attr,arg-type]
        return removed

    def new(self) -> None:
        """Start an empty conversation (the previous one stays saved)."""
        self.conversation = Conversation(system=self.system)
        self.id = None

    def resume(self, conversation_id: int) -> None:
        """Continue a saved conversation. Raises UserError if there is none with that id."""
        assert self.store is not None
        self.conversation = self.store.load(conversation_id)
        self.id = conversation_id

    def _save(self, turn: Turn) -> Turn:
        store = self.store
        if store is not None:

            def write() -> None:
                if self.id is None:
                    self.id = store.create(self.model, self.conversation.system)
                store.add_turn(self.id, turn)

            self._guard(write)
        return turn

    def _guard(self, write: Callable[[], None]) -> None:
        try:
            write()
        except sqlite3.Error as exc:
            assert self.store is not None
            self.on_error(f"Could not save to {self.store.path} ({exc}): this conversation is no longer saved.")
            self.store = None
