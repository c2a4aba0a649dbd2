"""Dialogs over the chat: help, a full context, a yes/no question, and the saved conversations."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, OptionList, Static
from textual.widgets.option_list import Option

from localspec.tui.slash import COMMANDS
from localspec.tui.store import SavedConversation

HELP_TEXT = """\
Type a message and press Enter; Shift+Enter or Ctrl+J starts a new line, and a
paste keeps all its lines. The answer streams in as the target accepts tokens.
You can type while the model loads: Enter then sends once it is open.

Colours: green tokens came from the drafter and the target accepted them; plain
ones the target wrote itself; dim struck-through text (briefly) is a draft the
target rejected, shown where it was rejected. When a pass verified several
candidate continuations at once (a token tree, --branches), the green tokens
are the branch that won, and each losing branch follows in [brackets].

Keys
  Enter         send                  Shift+Enter, Ctrl+J   new line
  Up / Down     your earlier messages (on the first / last line of the input)
  Esc, Ctrl+C   stop the answer being written (what is there stays; stopped
                before it began, your question goes back into the input)
  Ctrl+R        write the last answer again
  F3            take your last message back to edit it; Enter resends it
  F4            copy the last answer (Ctrl+C copies text selected in the input)
  Ctrl+O        saved conversations: Enter resumes one, d deletes it (asks)
  Ctrl+L        start a new conversation (asks first; a saved one stays saved)
  F2            next drafter: none → ngram → draft → early-exit → layer-skip → auto
  Ctrl+G        show / hide rejected drafts
  Ctrl+S        save the transcript as Markdown (the chat says where)
  F1, or ?      this help (? in an empty input)
  Ctrl+Q        quit

Commands (a message that is only a /word)
{commands}
  Any other /word is not sent; start a message with // to send it with one /.

Conversations are saved as they happen, an answer while it streams;
`localspec chat --resume` continues the latest. Stats: tok/s is generated tokens
over decoding time; acceptance is accepted / drafted tokens; length is tokens
gained per target pass (1.0: plain decoding); branches (once a pass verified a
token tree) is the candidates per tree pass, and how many passes were trees;
history (once a draft came from earlier chats and requests) is how many of
those drafted tokens were accepted.
The speedup is an estimate (est.) of how much longer target-only decoding would
have taken, from the cost of one plain step; it is never shown above the tokens
per pass, since a pass costs at least a plain step (≤: it was capped there).
"""


def help_text() -> str:
    commands = "\n".join(
        f"  {' '.join('/' + n for n in c.names):<13} {c.does}" for c in COMMANDS
    )
    return HELP_TEXT.format(commands=commands)


class HelpScreen(ModalScreen[None]):
    """Keys and colours, over the chat."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,f1,question_mark,q", "dismiss_help", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Static(Content("localspec chat — help"), classes="panel-title")
            yield Static(Content(help_text()), id="help-text")
            yield Button("Close (Esc)", id="help-close", variant="primary")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(None)

    def action_dismiss_help(self) -> None:
        self.dismiss(None)


class ContextFullScreen(ModalScreen[str]):
    """The conversation no longer fits the context: start over, drop the oldest turns, or keep it as it is."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "choose('start-over')", "Start over"),
        Binding("d", "choose('drop-oldest')", "Drop oldest turns"),
        Binding("escape", "choose('keep')", "Keep"),
    ]

    def __init__(self, detail: str) -> None:
        super().__init__()
        self.detail = detail

    def compose(self) -> ComposeResult:
        with Vertical(id="full-box", classes="dialog"):
            yield Static(Content("The context is full"), classes="panel-title")
            yield Static(Content(self.detail))
            yield Button("Start over (s)", id="start-over", variant="warning")
            yield Button("Drop the oldest turns (d)", id="drop-oldest", variant="primary")
            yield Button("Keep the conversation (Esc)", id="keep")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id or "keep")

    def action_choose(self, choice: str) -> None:
        self.dismiss(choice)


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question; y or Enter on Yes says yes, n or Esc says no."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]

    def __init__(self, title: str, detail: str, yes: str) -> None:
        super().__init__()
        self.title_text, self.detail, self.yes = title, detail, yes

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box", classes="dialog"):
            yield Static(Content(self.title_text), classes="panel-title")
            yield Static(Content(self.detail))
            yield Button(f"{self.yes} (y)", id="yes", variant="warning")
            yield Button("Cancel (Esc)", id="no")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()  # Enter right after the key keeps everything as it was

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class ConversationsScreen(ModalScreen[int | None]):
    """The saved conversations, newest first: Enter resumes the highlighted one, d deletes it."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Close"),
        Binding("d,delete", "delete", "Delete"),
    ]

    def __init__(self, saved: list[SavedConversation], delete: Callable[[int], bool]) -> None:
        super().__init__()
        self.saved = saved
        self._delete = delete

    def compose(self) -> ComposeResult:
        with Vertical(id="conversations-box", classes="dialog"):
            yield Static(Content("Saved conversations"), classes="panel-title")
            options = [Option(Content(f"{c.id:>4}  {c.describe()}"), id=str(c.id)) for c in self.saved]
            yield OptionList(*options, id="conversations")
            hint = ("Enter resume · d delete (asks first) · Esc close" if self.saved
                    else "No saved conversations yet. Esc closes.")  # fmt: skip
            yield Static(Content.styled(hint, "dim"))

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        options.focus()
        if self.saved:
            options.highlighted = 0

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        assert event.option.id is not None
        self.dismiss(int(event.option.id))

    def action_delete(self) -> None:
        """Ask first: a conversation deleted is gone (there is no undo)."""
        options = self.query_one(OptionList)
        index = options.highlighted
        if index is None:
            return
        option = options.get_option_at_index(index)
        assert option.id is not None
        chosen = next(c for c in self.saved if c.id == int(option.id))

        def answered(yes: bool | None) -> None:
            if yes and self._delete(chosen.id):
                options.remove_option(str(chosen.id))
                self.notify(f"Conversation {chosen.id} deleted.", timeout=2)
            options.focus()

        turns = "1 turn" if chosen.turns == 1 else f"{chosen.turns} turns"
        detail = f"“{chosen.title}” ({turns}) is deleted for good."
        self.app.push_screen(ConfirmScreen(f"Delete conversation {chosen.id}?", detail, "Delete"), answered)

    def action_close(self) -> None:
        self.dismiss(None)
