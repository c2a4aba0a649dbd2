"""The keys that change the conversation as a whole, mixed into ChatApp: write the last answer again, edit and
resend the last question, copy an answer, start a new conversation, and the saved conversations (resume, delete).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from localspec.errors import UserError
from localspec.tui.screens import ConfirmScreen, ConversationsScreen

if TYPE_CHECKING:
    from localspec.tui.app import ChatApp
    from localspec.tui.conversation import Turn


class ConversationCommands:
    """Actions and their helpers; ``self`` is the ChatApp (its session, transcript, input and ``_ask``)."""

    # ---- changing the conversation --------------------------------------------------------------------------

    def _can_change(self: ChatApp) -> bool:
        if self.busy:
            self.notify("Stop the answer first (Esc).", severity="warning")
        elif not self.ready:
            self.notify("The model is not open yet.", severity="warning")
        return self.ready and not self.busy

    def _take_back(self: ChatApp, turn: Turn) -> None:
        """Remove ``turn`` and everything after it: from the conversation, its saved copy and the screen."""
        self.transcript.take_back(self.session.take_back(turn))
        self._live = None

    def action_regenerate(self: ChatApp) -> None:
        if not self._can_change():
            return
        if not self.conversation.turns:
            self.notify("Nothing to answer yet.", timeout=2)
            return
        if self.conversation.turns[-1].role == "assistant":
            self._take_back(self.conversation.turns[-1])
        self._ask()

    def action_edit_last(self: ChatApp) -> None:
        turn = self.conversation.last("user")
        if not self._can_change() or turn is None:
            return
        self._take_back(turn)
        self.prompt_input.put_back(turn.text)  # anything typed meanwhile stays, after it
        self.prompt_input.focus()
        self.notify("Edit your message, then Enter sends it again.", timeout=3)

    def action_copy_answer(self: ChatApp) -> None:
        turn = self.conversation.last("assistant")
        if turn is None or not turn.text:
            self.notify("No answer to copy yet.", timeout=2)
            return
        self.copy_to_clipboard(turn.text)
        self.notify(f"Copied the last answer ({len(turn.text)} characters).", timeout=2)

    def action_clear(self: ChatApp) -> None:
        if self.busy:
            self.notify("Stop the answer first (Esc).", severity="warning")
            return
        if not self.conversation.turns:
            self._clear()
            return
        kept = ("It stays saved: Ctrl+O brings it back." if self.session.id is not None
                else "It is not saved anywhere: Ctrl+S saves it as Markdown first.")  # fmt: skip
        question = ConfirmScreen("Start a new conversation?", f"The conversation on screen is cleared. {kept}", "New")
        self.push_screen(question, lambda yes: self._clear() if yes else None)

    def _clear(self: ChatApp) -> None:
        # the model's cache needs no reset: the next prompt shares only its opening with the old one, and the
        # generator re-uses exactly the common prefix
        self._unqueue()
        self.session.new()
        self.transcript.clear()
        self._live = None
        self.stats_panel.reset()

    # ---- saved conversations ---------------------------------------------------------------------------------

    def _store_failed(self: ChatApp, error: str) -> None:
        self.transcript.add_notice(error, severity="warning")

    def action_conversations(self: ChatApp) -> None:
        store = self.session.store
        if store is None:
            self.notify("Conversations are not being saved in this chat.", severity="warning")
        elif self.busy:
            self.notify("Stop the answer first (Esc).", severity="warning")
        else:
            self.push_screen(ConversationsScreen(store.list(), self._delete_saved), self._resume_chosen)

    def _delete_saved(self: ChatApp, conversation_id: int) -> bool:
        store = self.session.store
        if store is None or not store.delete(conversation_id):
            return False
        if conversation_id == self.session.id:
            self._clear()
            self.transcript.add_notice("The conversation that was on screen is deleted; this is a new one.")
        return True

    def _resume_chosen(self: ChatApp, conversation_id: int | None) -> None:
        if conversation_id is not None and conversation_id != self.session.id:
            self._show_saved(conversation_id)

    def _show_saved(self: ChatApp, conversation_id: int) -> None:
        """Put a saved conversation on screen; the next question continues it."""
        try:
            self.session.resume(conversation_id)
        except UserError as exc:
            self.transcript.add_notice(str(exc), severity="error")
            return
        self._unqueue()
        self.transcript.clear()
        self._live = None
        self.stats_panel.reset()
        for turn in self.conversation.turns:
            self.transcript.show_turn(turn)
        self.prompt_input.sent = [t.text for t in self.conversation.turns if t.role == "user"]
        self.transcript.add_notice(f"Resumed conversation {conversation_id}.")
