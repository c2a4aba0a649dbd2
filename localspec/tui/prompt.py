"""The message box of the chat: several lines, Enter sends, history on Up/Down, keys applied in typing order."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from textual import events
from textual.binding import Binding, BindingType
from textual.widgets import TextArea

# Keys Textual names after a raw control character: xterm's modifyOtherKeys form of a modified key,
# ESC[27;<modifiers>;<code>~, comes out as "shift+\r" for Shift+Enter, which matches no binding (it was swallowed)
_CONTROL_KEYS = {"\r": "enter", "\t": "tab", "\x1b": "escape", "\x7f": "backspace"}


def key_name(key: str) -> str:
    """``key`` as Textual names it for the kitty form of the same key: ``shift+\\r`` → ``shift+enter``."""
    *modifiers, last = key.split("+")
    return "+".join([*modifiers, _CONTROL_KEYS.get(last, last)]) if modifiers else key


class PromptInput(TextArea):
    """Where the user writes. Enter sends; Shift+Enter or Ctrl+J starts a new line (terminals that cannot tell
    Shift+Enter from Enter still send Ctrl+J); a paste keeps all its lines. Up on the first line recalls the
    user's earlier messages, Down on the last line goes forward again (back to what was being written).

    Every key is applied here, in the order it arrived. Textual inserts a printable key as soon as the widget
    handles it, but runs a widget's key bindings (Backspace, arrows, …) only after the key has bubbled up to the
    app through the queues of every ancestor: typed fast, ``…ghi3⌫⌫⌫⌫XYZ`` became ``…ghi3XYZ`` and then lost
    letters to the late Backspaces. For the same reason ``?`` (help, when the box is empty) is decided here: the
    app, looking from outside, saw an empty box while the earlier keys were still queued for it.

    Enter hands the text to ``submit`` at once, and clears the box when it was taken: keys typed right after Enter
    are already queued behind it, and a message handled later would clear them too (``ab⏎cd`` lost the ``cd``).
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("shift+enter,ctrl+j", "newline", "New line", show=False),
    ]

    def __init__(
        self,
        *,
        submit: Callable[[str], bool] = lambda _: False,
        placeholder: str = "",
        id: str | None = None,
        disabled: bool = False,
    ) -> None:
        """``submit(text)``: Enter with ``text`` (trimmed, not empty); True if it was taken (the box clears)."""
        super().__init__(
            soft_wrap=True, tab_behavior="focus", highlight_cursor_line=False, placeholder=placeholder, id=id,
            disabled=disabled,
        )  # fmt: skip
        self.submit = submit
        self.sent: list[str] = []  # the user's earlier messages, oldest first (Up recalls them)
        self._recalled: int | None = None  # index into history of the message shown, None: the user's draft
        self._draft = ""

    # ---- keys ----------------------------------------------------------------------------------------------

    async def _on_key(self, event: events.Key) -> None:
        # Runs before TextArea's own handler (Textual dispatches along the class hierarchy until prevent_default).
        key = key_name(event.key)
        if key == "enter":
            self._consume(event)
            self._send()
        elif event.character == "?" and not self.text:
            self._consume(event)
            await self.run_action("app.help")
        elif key == "up" and self.cursor_at_first_line and self.sent:
            self._consume(event)
            self._recall(-1)
        elif key == "down" and self.cursor_at_last_line and self._recalled is not None:
            self._consume(event)
            self._recall(+1)
        else:
            binding = next((b for b in self._bindings.key_to_bindings.get(key, ()) if not b.priority), None)
            if binding is not None:
                self._consume(event)
                await self.run_action(binding.action)
            # otherwise TextArea inserts it (printable) or it bubbles up to the app's bindings (Esc, F2, …)

    def _send(self) -> None:
        text = _trim(self.text)
        if text and self.submit(text):
            self.set_text("")

    @staticmethod
    def _consume(event: events.Key) -> None:
        event.stop()
        event.prevent_default()

    async def _on_paste(self, event: events.Paste) -> None:
        # terminals paste line ends as \r; the message keeps them as line breaks
        event.prevent_default()
        event.stop()
        text = event.text.replace("\r\n", "\n").replace("\r", "\n")
        if text and not self.read_only:
            self._type(text)

    def action_newline(self) -> None:
        self._type("\n")

    def _type(self, text: str) -> None:
        """Put ``text`` in place of the selection and the cursor after it, as typing does."""
        result = self.replace(text, *self.selection, maintain_selection_offset=False)
        self.move_cursor(result.end_location)

    # ---- history -------------------------------------------------------------------------------------------

    def remember(self, text: str) -> None:
        """Add a sent message to the history (Up recalls it) and forget any recall in progress."""
        if not self.sent or self.sent[-1] != text:
            self.sent.append(text)
        self._recalled = None

    def _recall(self, step: int) -> None:
        if self._recalled is None:
            self._draft = self.text
            index = len(self.sent) - 1
        else:
            index = self._recalled + step
        if index < 0:
            return  # already at the oldest message
        if index >= len(self.sent):
            self._recalled = None
            self.load_text(self._draft)
        else:
            self._recalled = index
            self.load_text(self.sent[index])
        self.move_cursor(self.document.end)

    def set_text(self, text: str) -> None:
        """Replace the box's content."""
        self.load_text(text)
        self._recalled = None
        self.move_cursor(self.document.end)

    def put_back(self, text: str) -> None:
        """Put a message taken back for editing in front of what is being typed (which stays, on the next line);
        the cursor goes to the end of the message."""
        typed = self.text
        self.load_text(text + ("\n" + typed if typed.strip() else ""))
        self._recalled = None
        lines = text.split("\n")
        self.move_cursor((len(lines) - 1, len(lines[-1])) if typed.strip() else self.document.end)


def _trim(text: str) -> str:
    """Without blank lines around it and trailing spaces; the first line keeps its indentation (code)."""
    lines = text.rstrip().split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    return "\n".join(lines)
