"""OpenAI's chat and text completion objects, built from an answer's pieces (serve/pieces.py), whole or as stream
chunks, with llama-server's ``timings`` and localspec's own speculation figures beside ``usage``."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from localspec.events import Stats
from localspec.serve.pieces import CallPiece, Ended, FailedPiece, Piece, TextPiece
from localspec.serve.protocol import ApiError


@dataclass
class Answer:
    """One chat or text completion being sent: its id, kind and model (serve/face.py's ``FaceAnswer``)."""

    chat: bool
    model: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex[:24]

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    def whole(self, ended: Ended) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": ended.reason}
        calls = ended.calls
        if calls is not None and calls.calls:  # the answer called tools (structured/tools.py)
            choice["message"] = {"role": "assistant", "content": calls.content, "tool_calls": list(calls.calls)}
        elif self.chat:
            choice["message"] = {"role": "assistant", "content": ended.text}
        else:
            choice |= {"text": ended.text, "logprobs": None}
        return {"id": self.id, "object": self.object, "created": self.created, "model": self.model,
                "choices": [choice], "usage": usage(ended.stats, ended.reused),
                "timings": timings(ended.stats, ended.reused, ended.drafters)}

    async def stream(self, pieces: AsyncIterator[Piece], include_usage: bool) -> AsyncIterator[bytes]:
        """Server-sent events: a chunk a piece, OpenAI's way (a call: a ``tool_calls`` delta with its id and name,
        then its arguments in pieces), the finish reason, the usage where asked, ``[DONE]``."""
        yield sse(self.chunk(first=True))
        async for piece in pieces:
            if isinstance(piece, TextPiece):
                yield sse(self.chunk(piece.text))
            elif isinstance(piece, CallPiece):
                yield sse(self.call_chunk(piece))
            elif isinstance(piece, Ended):
                yield sse(self.chunk(reason=piece.reason,
                                     extra={"timings": timings(piece.stats, piece.reused, piece.drafters)}))
                if include_usage:
                    yield sse(self.usage_chunk(piece.stats, piece.reused))
            else:  # its own cause, in OpenAI's error shape
                yield sse(failure(piece).body())
        yield b"data: [DONE]\n\n"

    def failed(self, error: ApiError) -> bytes:
        """The answer failed after its stream began: its error as the last event."""
        return sse(error.body()) + b"data: [DONE]\n\n"

    def chunk(self, text: str | None = None, *, first: bool = False, reason: str | None = None,
              extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """A stream chunk: the first (a chat's role), a piece of text, or the last (its finish reason)."""
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
        return {"id": self.id, "object": self.object + ("" if not self.chat else ".chunk"), "created": self.created,
                "model": self.model, "choices": [choice], **(extra or {})}

    def call_chunk(self, piece: CallPiece) -> dict[str, Any]:
        """A piece of a tool call as OpenAI streams one: the first with its id, type and name, the rest with the
        next part of its arguments."""
        call: dict[str, Any] = {"index": piece.index, "function": {"arguments": piece.arguments}}
        if piece.name is not None:
            call |= {"id": piece.id, "type": "function", "function": {"name": piece.name,
                                                                      "arguments": piece.arguments}}
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]}

    def usage_chunk(self, stats: Stats, reused: int) -> dict[str, Any]:
        """``stream_options.include_usage``: one more chunk, with no choices and the usage."""
        return {"id": self.id, "object": self.object + (".chunk" if self.chat else ""), "created": self.created,
                "model": self.model, "choices": [], "usage": usage(stats, reused)}


def sse(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def failure(piece: FailedPiece) -> ApiError:
    """A request's own failure as its answer: a 400 where its input was at fault, else a 500 naming the cause."""
    if piece.status < 500:
        return ApiError(piece.status, piece.message)
    return ApiError(piece.status, piece.message, type="server_error")


def usage(stats: Stats, reused: int) -> dict[str, Any]:
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.generated_tokens,
            "total_tokens": stats.prompt_tokens + stats.generated_tokens,
            "prompt_tokens_details": {"cached_tokens": reused},
            # a prediction's tokens the answer holds and the rest (0 without one); its drafts are in ``timings``
            "completion_tokens_details": {"reasoning_tokens": 0, **stats.prediction_usage()}}


def timings(stats: Stats, reused: int, drafters: Counter[str]) -> dict[str, Any]:
    """llama-server's names (prompt_n is what was computed, cache_n what the cache held) and localspec's own."""
    prompt_n = stats.prompt_tokens - reused
    predicted_ms = stats.decode_seconds * 1000
    return {
        "cache_n": reused,
        "prompt_n": prompt_n,
        "prompt_ms": round(stats.prefill_seconds * 1000, 3),
        "prompt_per_second": round(prompt_n / stats.prefill_seconds, 2) if stats.prefill_seconds > 0 else 0.0,
        "predicted_n": stats.generated_tokens,
        "predicted_ms": round(predicted_ms, 3),
        "predicted_per_second": round(stats.tokens_per_second, 2),
        "draft_n": stats.drafted,
        "draft_n_accepted": stats.accepted,
        # of those, drafted from this scope's earlier requests (localspec/history)
        "draft_n_cache": stats.cache_drafted,
        "draft_n_cache_accepted": stats.cache_accepted,
        # of those, the tokens a grammar forced (structured output), and the grammar's host time
        "draft_n_forced": stats.forced_drafted,
        "draft_n_forced_accepted": stats.forced_accepted,
        # of those, drafted from the request's prediction (OpenAI's Predicted Outputs)
        "draft_n_prediction": stats.prediction_drafted,
        "draft_n_prediction_accepted": stats.prediction_accepted,
        "grammar_ms": round(stats.grammar_seconds * 1000, 3),
        "drafter": drafters.most_common(1)[0][0] if drafters else "none",
        "target_passes": stats.target_passes,
        "tokens_per_pass": round(stats.mean_accepted_length, 3),
        "acceptance_by_position": [round(a / d, 4) if d else 0.0 for a, d in stats.accepted_by_position],
    }
