"""What the keys do, mixed into ChatApp (which keeps the layout, the model's life and the answer as it streams):
write the last answer again, edit and resend the last question, copy an answer, start a new conversation, the saved
conversations (resume, delete), the choice when the context is full, stop, help, the drafter, ghosts, save, quit.

The mixin names its host by what it uses of it (``ChatHost``), not by its class: the app imports the commands, and
nothing here imports the app.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from localspec.errors import UserError
from localspec.settings import DRAFTERS
from localspec.tui.screens import ConfirmScreen, ContextFullScreen, ConversationsScreen, HelpScreen
from localspec.tui.widgets import Legend

if TYPE_CHECKING:
    from textual.notifications import SeverityLevel
    from textual.screen import Screen
    from textual.widget import Widget

    from localspec.engine.chat import Message
    from localspec.runtime import Runtime
    from localspec.settings import Settings
    from localspec.tui.conversation import Conversation, Turn
    from localspec.tui.engine import Engine
    from localspec.tui.live import LiveAnswer
    from localspec.tui.prompt import PromptInput
    from localspec.tui.session import Session
    from localspec.tui.widgets import StatsPanel, Transcript

W = TypeVar("W", bound="Widget")


class ChatHost(Protocol):
    """``self`` in ChatCommands: the Textual app they are mixed into (ChatApp), as far as they use it."""

    # the app's state and parts
    options: Settings
    save_dir: Path
    engine: Engine
    session: Session
    ready: bool  # the model is open
    busy: bool  # an answer is being generated
    show_ghosts: bool
    drafter_choice: str
    last_saved: Path | None
    _live: LiveAnswer | None

    @property
    def rt(self) -> Runtime | None: ...
    @property
    def conversation(self) -> Conversation: ...
    @property
    def transcript(self) -> Transcript: ...
    @property
    def stats_panel(self) -> StatsPanel: ...
    @property
    def prompt_input(self) -> PromptInput: ...

    predict_next: str | None
    def _ask(self) -> None: ...
    def _unqueue(self) -> None: ...
    def _count_tokens(self, messages: list[Message]) -> int: ...
    def _drain(self, *, final: bool = False, save: bool = True) -> None: ...

    # Textual's App
    @property
    def screen(self) -> Screen[Any]: ...
    @property
    def screen_stack(self) -> list[Screen[Any]]: ...
    def notify(self, message: str, *, severity: SeverityLevel = "information", timeout: float | None = None) -> None:
        ...
    def push_screen(self, screen: Screen[Any], callback: Callable[[Any], None] | None = None) -> Any: ...
    def copy_to_clipboard(self, text: str) -> None: ...
    def query_one(self, selector: type[W]) -> W: ...
    def exit(self) -> None: ...

    # the commands' own, called from one another
    def _can_change(self) -> bool: ...
    def _take_back(self, turn: Turn) -> None: ...
    def _clear(self) -> None: ...
    def _delete_saved(self, conversation_id: int) -> bool: ...
    def _resume_chosen(self, conversation_id: int | None) -> None: ...
    def _show_saved(self, conversation_id: int) -> None: ...
    def _context_choice(self, choice: str) -> None: ...
    def action_stop(self) -> None: ...


class ChatCommands:
    """Actions and their helpers; ``self`` is the app they are mixed into (``ChatHost``)."""

    # ---- changing the conversation --------------------------------------------------------------------------

    def _can_change(self: ChatHost) -> bool:
        if self.busy:
            self.notify("Stop the answer first (Esc).", severity="warning")
        elif not self.ready:
            self.notify("The model is not open yet.", severity="warning")
        return self.ready and not self.busy

    def _take_back(self: ChatHost, turn: Turn) -> None:
        """Remove ``turn`` and everything after it: from the conversation, its saved copy and the screen."""
        self.transcript.take_back(self.session.take_back(turn))
        self._live = None

    def action_regenerate(self: ChatHost) -> None:
        if not self._can_change():
            return
        if not self.conversation.turns:
            self.notify("Nothing to answer yet.", timeout=2)
            return
        if self.conversation.turns[-1].role == "assistant":
            self._take_back(self.conversation.turns[-1])
        self._ask()

    def action_edit_last(self: ChatHost) -> None:
        turn = self.conversation.last("user")
        if not self._can_change() or turn is None:
            return
        self._take_back(turn)
        self.prompt_input.put_back(turn.text)  # anything typed meanwhile stays, after it
        self.prompt_input.focus()
        self.notify("Edit your message, then Enter sends it again.", timeout=3)

    def action_predict(self: ChatHost) -> None:
        """The next answer is drafted from the last one (OpenAI's Predicted Outputs): "change X in what you just
        wrote" then costs a pass for every few tokens it keeps. Each token is still the model's own choice."""
        turn = self.conversation.last("assistant")
        if turn is None or not turn.text:
            self.notify("No answer to predict from yet.", timeout=2)
            return
        self.predict_next = turn.text
        self.notify("The next answer drafts from the last one: ask for the change you want.", timeout=4)

    def action_copy_answer(self: ChatHost) -> None:
        turn = self.conversation.last("assistant")
        if turn is None or not turn.text:
            self.notify("No answer to copy yet.", timeout=2)
            return
        self.copy_to_clipboard(turn.text)
        self.notify(f"Copied the last answer ({len(turn.text)} characters).", timeout=2)

    def action_clear(self: ChatHost) -> None:
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

    def _clear(self: ChatHost) -> None:
        # the model's cache needs no reset: the next prompt shares only its opening with the old one, and the
        # generator re-uses exactly the common prefix
        self._unqueue()
        self.session.new()
        self.transcript.clear()
        self._live = None
        self.stats_panel.reset()

    # ---- saved conversations ---------------------------------------------------------------------------------

    def _store_failed(self: ChatHost, error: str) -> None:
        self.transcript.add_notice(error, severity="warning")

    def action_conversations(self: ChatHost) -> None:
        store = self.session.store
        if store is None:
            self.notify("Conversations are not being saved in this chat.", severity="warning")
        elif self.busy:
            self.notify("Stop the answer first (Esc).", severity="warning")
        else:
            self.push_screen(ConversationsScreen(store.list(), self._delete_saved), self._resume_chosen)

    def _delete_saved(self: ChatHost, conversation_id: int) -> bool:
        store = self.session.store
        if store is None or not store.delete(conversation_id):
            return False
        self.engine.forget(conversation_id)  # its turns leave the history it drafts from too
        if conversation_id == self.session.id:
            self._clear()
            self.transcript.add_notice("The conversation that was on screen is deleted; this is a new one.")
        return True

    def _resume_chosen(self: ChatHost, conversation_id: int | None) -> None:
        if conversation_id is not None and conversation_id != self.session.id:
            self._show_saved(conversation_id)

    def _show_saved(self: ChatHost, conversation_id: int) -> None:
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

    # ---- a full context --------------------------------------------------------------------------------------

    def _offer_context_choice(self: ChatHost, detail: str) -> None:
        def chosen(choice: str | None) -> None:
            self._context_choice(choice or "keep")

        self.push_screen(ContextFullScreen(detail), chosen)

    def _context_choice(self: ChatHost, choice: str) -> None:
        pending = bool(self.conversation.turns) and self.conversation.turns[-1].role == "user"
        if choice == "start-over":
            question = self.conversation.turns[-1].text if pending else None
            self._clear()
            if question is not None:
                self.transcript.show_turn(self.session.add_user(question))
                self._ask()
        elif choice == "drop-oldest":
            n_ctx = self.options.runtime.n_ctx
            # leave room for an answer: up to --max-tokens, but never more than half the context
            budget = n_ctx - min(self.options.generation.max_tokens, n_ctx // 2)
            dropped = self.conversation.fit(self._count_tokens, budget)
            self.transcript.add_notice(
                f"Dropped the {dropped} oldest exchange(s) from the model's context (still shown above)."
                if dropped else "There is no older exchange to drop."
            )
            if pending and (dropped or self._count_tokens(self.conversation.messages()) < n_ctx):
                self._ask()
        else:
            self.transcript.add_notice("The context is full: Ctrl+L starts over.", severity="warning")

    # ---- keys ------------------------------------------------------------------------------------------------

    def check_action(self: ChatHost, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "stop":
            return True if self.busy else None  # shown dimmed while there is nothing to stop
        if action in ("help", "quit", "interrupt"):
            return True
        return len(self.screen_stack) == 1  # the others act on the chat, not on a dialog over it

    def action_help(self: ChatHost) -> None:
        if isinstance(self.screen, HelpScreen):
            self.screen.dismiss(None)
            return
        if len(self.screen_stack) > 1:
            return
        self.push_screen(HelpScreen())

    def action_stop(self: ChatHost) -> None:
        if self.busy:
            self.engine.stop_requested.set()

    def action_interrupt(self: ChatHost) -> None:
        """Ctrl+C: people press it to stop an answer, or to quit. Copy a selection, else stop, else say what quits."""
        selected = self.prompt_input.selected_text if self.prompt_input.has_focus else ""
        if selected:
            self.copy_to_clipboard(selected)
            self.notify(f"Copied ({len(selected)} characters).", timeout=2)
        elif self.busy:
            self.action_stop()
            self.notify("Stopping the answer. Ctrl+Q quits.", timeout=4)
        else:
            self.notify("Ctrl+Q quits; Esc stops an answer; F1 shows every key.", timeout=4)

    def action_cycle_drafter(self: ChatHost) -> None:
        cycle = [d for d in DRAFTERS if d != "draft" or self.options.speculation.draft_model]
        current = self.drafter_choice if self.drafter_choice in cycle else cycle[-1]
        self.drafter_choice = cycle[(cycle.index(current) + 1) % len(cycle)]
        active = self.rt.drafter_name if self.rt is not None else self.drafter_choice
        self.stats_panel.show_drafter(active, None, pending=self.drafter_choice)
        self.notify(f"Drafter for the next answer: {self.drafter_choice}", timeout=2)

    def action_toggle_ghosts(self: ChatHost) -> None:
        self.show_ghosts = not self.show_ghosts
        self.query_one(Legend).set_ghosts(self.show_ghosts)
        if self._live is not None:
            view = self._live.view
            view.show_ghosts = self.show_ghosts
            if not self.show_ghosts:
                view.drop_ghosts()
                view.repaint()

    def action_save(self: ChatHost) -> None:
        name = f"localspec-chat-{datetime.now():%Y%m%d-%H%M%S}.md"
        path = self.save_dir / name
        model = self.rt.model_name if self.rt is not None else "no model"
        try:
            path.write_text(self.conversation.to_markdown(model), encoding="utf-8")
        except OSError as exc:
            self.notify(f"Could not save {path}: {exc.strerror or exc}", severity="error")
            return
        self.last_saved = path
        # in the transcript, not a toast that fades: the full path, to be found later
        self.transcript.add_notice(f"Saved the transcript to {path}")

    async def action_quit(self: ChatHost) -> None:
        self.engine.stop_requested.set()  # the answer stops at its next step; on_unmount waits before closing
        if self.busy:
            self._drain(final=True)  # what the engine wrote by now is saved, marked interrupted
        self.exit()

