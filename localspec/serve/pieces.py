"""An answer as every API face sends it: text pieces, tool-call pieces, and its end (docs/architecture.md, "Agents as
the judge": one event stream, translated out by each API).

The chat completions face (serve/responses.py), the Responses API (serve/responses_api.py) and Anthropic's Messages
API (serve/messages_api.py) each turn these into their own objects or stream events; none of them reads the
scheduler's events itself. With tools offered, text is held back only while it may still become a call, and a call
is sent only once the grammar holds it (structured/call_watch.py), so nothing sent is ever taken back.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from localspec.events import Finished, Prefill, Stats, Step
from localspec.finish_reasons import calls_reason, openai_reason
from localspec.speculative.jobs import Failed
from localspec.structured.call_watch import CallPiece, CallWatch, TextPiece
from localspec.structured.tools import Calls, ToolUse


@dataclass(frozen=True, slots=True)
class Ended:
    """The answer's end: all its text, its calls (None: no tools were offered), the finish reason as OpenAI's API
    says it (stop, length, tool_calls: localspec/finish_reasons.py), its figures."""

    text: str
    calls: Calls | None
    reason: str
    stats: Stats
    reused: int  # prompt tokens the cache held
    drafters: Counter[str] = field(default_factory=Counter)

    @property
    def content(self) -> str | None:
        """The answer's text as a message: what came before the calls (None where it is only calls)."""
        return self.calls.content if self.calls is not None and self.calls.calls else self.text


@dataclass(frozen=True, slots=True)
class FailedPiece:
    """The request failed inside the scheduler: its HTTP status and one line."""

    status: int
    message: str


# TextPiece and CallPiece are the call watch's own (structured/call_watch.py): the stream's pieces as it sees them
Piece = TextPiece | CallPiece | Ended | FailedPiece
ReadCalls = Callable[[str, ToolUse, tuple[str, ...]], Awaitable[Calls]]


async def answer_pieces(events: Callable[[], Awaitable[Any]], tools: ToolUse | None, read_calls: ReadCalls,
                        drafters: Counter[str]) -> AsyncIterator[Piece]:
    """The pieces of one answer, from its scheduler events (``events()``: the next one), up to its end.
    ``read_calls(text, tools, ids)``: the calls in the whole answer, with the ids its pieces already gave."""
    reused = 0
    text = ""
    watch = CallWatch(tools) if tools is not None else None
    while True:
        event = await events()
        if isinstance(event, Prefill):
            reused = event.prompt_tokens - event.new_tokens
            continue
        if isinstance(event, Failed):
            yield FailedPiece(event.status, event.message)
            return
        piece = "".join(t.text for t in event.emitted) if isinstance(event, Step) else \
            event.tail if isinstance(event, Finished) else ""
        text += piece
        if watch is None:
            if piece:
                yield TextPiece(piece)
        else:
            for out in watch.feed(piece, end=isinstance(event, Finished)):
                yield out
        if isinstance(event, Finished):
            calls = None
            reason = openai_reason(event.reason)
            if tools is not None and watch is not None:
                calls = await read_calls(text, tools, watch.ids)
                if calls.calls:
                    reason = calls_reason(event.reason)
                for out in watch.settle(calls):
                    yield out
            yield Ended(text, calls, reason, event.stats, reused, drafters)
            return
