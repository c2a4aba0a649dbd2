"""A streamed answer with tools offered: which of its text can be sent, and its calls as they are written.

Text is held back only while it may still become a call (structured/call_shapes.py): at the answer's start, while it
is a prefix of a call's opening; anywhere, the tail that may be the start of the template's marker. From the first
bytes that can no longer start a call on, text is sent as it comes. A call is sent once its opening names an offered
tool, which is where the constraint's grammar takes it over (structured/constraint.py): first its id and name, then
its arguments' JSON as the model writes it, piece by piece, as OpenAI streams a call. The reader is as lenient as
``read_calls`` about spacing, so what is streamed as a call is what the answer's end reads as one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from localspec.structured.call_shapes import anchored_start, heads, strip_lead
from localspec.structured.tools import HERMES_OPEN, Calls, ToolUse, new_call_id


@dataclass(frozen=True, slots=True)
class TextPiece:
    """Answer text that can no longer become a call."""

    text: str


@dataclass(frozen=True, slots=True)
class CallPiece:
    """A piece of tool call ``index``: its first piece carries the id and the name (``name`` is None after it);
    ``arguments``: the next part of its arguments' JSON text (the pieces of one call join into it)."""

    index: int
    id: str
    name: str | None = None
    arguments: str = ""


_NAME = re.compile(r'\{\s*"name"\s*:\s*"([A-Za-z0-9_.-]{1,64})"')
_ARGUMENTS = re.compile(r'"arguments"\s*:\s*(?=\S)')


class CallWatch:
    """Fed an answer's text as it is generated; yields TextPiece and CallPiece values."""

    def __init__(self, use: ToolUse) -> None:
        names = use.names()
        self._names = frozenset(names)
        # both spacings: the reader takes either (the grammar writes the prompt's)
        self._heads = heads(names, ": ", use.parallel) + heads(names, ":", use.parallel)
        self.text = ""
        self._sent = 0  # text up to here is sent (as text, or as a call)
        self._mode = "start"  # start: a call may open the answer; text: only a marker may start one; call
        self._at = 0  # in a call: where the scan goes on
        self._arguments: _Value | None = None  # the arguments being streamed
        self.ids: list[str] = []
        self._streamed = 0  # calls whose arguments were sent whole

    def feed(self, piece: str, end: bool = False) -> Iterator[TextPiece | CallPiece]:
        self.text += piece
        text = self.text
        if self._mode == "start":
            opens = anchored_start(text, self._heads)
            if opens:
                self._mode, self._at = "call", strip_lead(text)[0]  # type: ignore[index]
            elif opens is False:
                self._mode = "text"
        if self._mode == "text":
            at = text.find(HERMES_OPEN, self._sent)
            if at >= 0:
                if at > self._sent:
                    yield TextPiece(text[self._sent:at])
                self._mode, self._at, self._sent = "call", at, at
            else:
                upto = len(text) if end else len(text) - _marker_prefix(text)
                if upto > self._sent:
                    yield TextPiece(text[self._sent:upto])
                    self._sent = upto
        if self._mode == "call":
            yield from self._scan()

    def _scan(self) -> Iterator[CallPiece]:
        text = self.text
        while True:
            if self._arguments is None:
                if len(self.ids) == self._streamed:  # between calls: the next one's name
                    m = _NAME.search(text, self._at)
                    if m is None or m.group(1) not in self._names:
                        return
                    self.ids.append(new_call_id())
                    yield CallPiece(len(self.ids) - 1, self.ids[-1], m.group(1))
                    self._at = m.end()
                m = _ARGUMENTS.search(text, self._at)
                if m is None:
                    return
                self._arguments = _Value()
                self._at = m.end()
            end = self._arguments.feed(text, self._at)
            if end > self._at:
                yield CallPiece(len(self.ids) - 1, self.ids[-1], None, text[self._at:end])
                self._at = self._sent = end
            if not self._arguments.closed:
                return
            self._arguments = None
            self._streamed += 1

    def settle(self, calls: Calls) -> Iterator[TextPiece | CallPiece]:
        """The answer's end, once read (``read_calls``): the calls not streamed yet, whole; or, where it holds no
        call, the text still held back."""
        if calls.calls:
            for i, call in enumerate(calls.calls[self._streamed:], start=self._streamed):
                f = call["function"]
                if i >= len(self.ids):
                    yield CallPiece(i, call["id"], f["name"], f["arguments"])
            return
        if len(self.text) > self._sent and not self.ids:
            yield TextPiece(self.text[self._sent:])


def _marker_prefix(text: str) -> int:
    """How many of ``text``'s last characters may be the start of the marker."""
    for n in range(min(len(HERMES_OPEN) - 1, len(text)), 0, -1):
        if HERMES_OPEN.startswith(text[-n:]):
            return n
    return 0


class _Value:
    """Where one JSON value ends, read a character at a time as it is written."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = self.escaped = self.started = self.closed = False

    def feed(self, text: str, at: int) -> int:
        """Read ``text`` from ``at``; where reading stopped (the value's end, or the text's)."""
        for i in range(at, len(text)):
            c = text[i]
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif c == "\\":
                    self.escaped = True
                elif c == '"':
                    self.in_string = False
                    if self.depth == 0:
                        self.closed = True
                        return i + 1
            elif self.started and self.depth == 0 and (c in ",}]" or c.isspace()):  # a scalar's end
                self.closed = True
                return i
            elif c == '"':
                self.in_string = self.started = True
            elif c in "{[":
                self.depth += 1
                self.started = True
            elif c in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.closed = True
                    return i + 1
            elif not c.isspace():
                self.started = True
        return len(text)
