"""OpenAI's response objects, built from a generation's text and stats (chat and text completions, whole or as
stream chunks), with llama-server's ``timings`` and localspec's own speculation figures beside ``usage``."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from localspec.events import Stats
from localspec.structured.tools import Calls

# what a Finished reason is called in the API: a context that filled up ends the answer as a token limit would
FINISH_REASONS = {"eog": "stop", "stop": "stop", "length": "length", "context_full": "length", "interrupted": "stop",
                  "tool_calls": "tool_calls"}


@dataclass
class Answer:
    """One response being built: its id, kind (chat or text) and model, and what it has so far."""

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

    def whole(self, text: str, reason: str, stats: Stats, reused: int, drafters: Counter[str],
              calls: Calls | None = None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": FINISH_REASONS.get(reason, reason)}
        if calls is not None and calls.calls:  # the answer called tools (structured/tools.py)
            choice |= {"finish_reason": "tool_calls",
                       "message": {"role": "assistant", "content": calls.content, "tool_calls": list(calls.calls)}}
        elif self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice |= {"text": text, "logprobs": None}
        return {"id": self.id, "object": self.object, "created": self.created, "model": self.model,
                "choices": [choice], "usage": usage(stats, reused), "timings": timings(stats, reused, drafters)}

    def chunk(self, text: str | None = None, *, first: bool = False, reason: str | None = None,
              extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """A stream chunk: the first (a chat's role), a piece of text, or the last (its finish reason)."""
        finish = FINISH_REASONS.get(reason, reason) if reason is not None else None
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return {"id": self.id, "object": self.object + ("" if not self.chat else ".chunk"), "created": self.created,
                "model": self.model, "choices": [choice], **(extra or {})}

    def calls_chunk(self, calls: Calls) -> dict[str, Any]:
        """The answer's tool calls, whole, as OpenAI streams them (a delta per call, indexed; its arguments in one
        piece: a client accumulates them either way)."""
        delta = {"tool_calls": [{"index": i, **call} for i, call in enumerate(calls.calls)]}
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}

    def usage_chunk(self, stats: Stats, reused: int) -> dict[str, Any]:
        """``stream_options.include_usage``: one more chunk, with no choices and the usage."""
        return {"id": self.id, "object": self.object + (".chunk" if self.chat else ""), "created": self.created,
                "model": self.model, "choices": [], "usage": usage(stats, reused)}


def usage(stats: Stats, reused: int) -> dict[str, Any]:
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.generated_tokens,
            "total_tokens": stats.prompt_tokens + stats.generated_tokens,
            "prompt_tokens_details": {"cached_tokens": reused}}


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
        "grammar_ms": round(stats.grammar_seconds * 1000, 3),
        "drafter": drafters.most_common(1)[0][0] if drafters else "none",
        "target_passes": stats.target_passes,
        "tokens_per_pass": round(stats.mean_accepted_length, 3),
        "acceptance_by_position": [round(a / d, 4) if d else 0.0 for a, d in stats.accepted_by_position],
    }
