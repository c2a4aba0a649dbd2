"""One generation asked of a batch: a prompt (plain text or chat messages) and the settings it overrides."""

from __future__ import annotations

from dataclasses import dataclass

from localspec.engine.chat import Message
from localspec.schema import ConstraintSpec
from localspec.structured.tools import ToolUse

# how a result is written back: as the line came (plain), or as OpenAI Batch API output for either endpoint
STYLES = ("plain", "openai-chat", "openai-completions")


@dataclass(frozen=True, slots=True)
class Request:
    """``prompt`` or ``messages`` (exactly one). A setting left None takes the job's (the command's options);
    ``drafter`` and ``k`` are this request's speculation (a drafter that needs no model: none, ngram, auto)."""

    id: str
    prompt: str | None = None
    messages: tuple[Message, ...] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] | None = None
    top_k: int | None = None
    min_p: float | None = None
    drafter: str | None = None
    k: int | None = None
    style: str = "plain"
    line: int = 0  # where it came from in an input file (1-based; 0: not from a file)
    # what the answer must match (OpenAI's response_format: a JSON schema, JSON, a grammar, a regex)
    constraint: ConstraintSpec | None = None
    tools: ToolUse | None = None  # the tools the answer may call (OpenAI's tools, tool_choice, parallel_tool_calls)
    # what the answer will mostly be (OpenAI's Predicted Outputs: prediction.content): drafted from, never imposed
    prediction: str | None = None
