"""Why an answer ended, in each face's words, from one table: the loop's reasons (``events.Finished``) as the
Python API's results and batch records say them, and those as OpenAI's API says them (every serve face, and OpenAI
Batch output lines)."""

from __future__ import annotations

# the loop's reason → a result's: OpenAI's words where there is one, localspec's own where not (a context that
# filled up, an answer interrupted, a grammar that allowed nothing more)
RESULT = {"eog": "stop", "stop": "stop", "length": "length", "context_full": "context_full",
          "interrupted": "interrupted", "dead_end": "dead_end", "tool_calls": "tool_calls"}
# a result's reason → OpenAI's (stop, length, tool_calls): a full context is a length; an answer a grammar or a
# client's going away ended is a stop
OPENAI = {"stop": "stop", "length": "length", "context_full": "length", "interrupted": "stop", "dead_end": "stop",
          "tool_calls": "tool_calls"}


def result_reason(reason: str) -> str:
    return RESULT.get(reason, reason)


def openai_reason(reason: str) -> str:
    """A loop's or a result's reason, as OpenAI's API says it."""
    return OPENAI.get(result_reason(reason), "stop")


def calls_reason(reason: str) -> str:
    """An answer that holds tool calls, as OpenAI's API says it ended: ``tool_calls``, or ``length`` where the token
    limit (or the context) cut it."""
    return "length" if openai_reason(reason) == "length" else "tool_calls"
