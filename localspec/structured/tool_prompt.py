"""A request with tools, as the model sees it, and its answer read back: the prompt (the model's own template shows
the tools where it can; else a system message describes them), the constraint of the call's shape, and the calls
found in the answer, each checked against its tool's parameters."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from localspec.bounded_json import loads_or_none
from localspec.schema.json_style import separators_of
from localspec.schema.spec import ConstraintSpec
from localspec.structured.tools import HERMES_CLOSE, HERMES_OPEN, Calls, ToolUse, read_calls

if TYPE_CHECKING:
    from localspec.engine.chat import ChatTemplate, Message
    from localspec.engine.vocab import Vocab
    from localspec.structured.grammars import Grammars




def tool_prompt(template: ChatTemplate, vocab: Vocab, messages: Sequence[Message],
                use: ToolUse) -> tuple[list[int], ConstraintSpec | None]:
    """The prompt's tokens and the answer's constraint. A template that renders tools and asks for ``<tool_call>``
    (Qwen2.5's) shows them itself; any other gets the tools in a system message, and calls as JSON."""
    from localspec.engine.chat import Message

    jinja = getattr(template, "jinja", None)
    if jinja is not None and HERMES_OPEN.encode() in template.template:
        tokens = template.tokenize(vocab, list(messages), tools=use.tools)
        # the call spaced as the rendered prompt writes JSON (its template's tools and instructions among it)
        rendered = b"".join(vocab.piece(t) for t in tokens).decode("utf-8", "replace")
        return tokens, use.constraint("hermes", _single(vocab, HERMES_OPEN), _single(vocab, HERMES_CLOSE),
                                      separators_of([rendered]))
    separators = conversation_separators(messages)
    plain = plain_conversation(messages, separators)
    described = use.system_text(separators)
    if plain and plain[0].role == "system":
        plain[0] = Message("system", f"{plain[0].content}\n\n{described}")
    else:
        plain.insert(0, Message("system", described))
    return template.tokenize(vocab, plain), use.constraint("json", None, None, separators)


def conversation_separators(messages: Sequence[Message]) -> tuple[str, str]:
    """How the conversation's own JSON is spaced: the tools, earlier calls and the call are spaced so."""
    arguments = [c["function"].get("arguments") for m in messages for c in m.tool_calls or ()]
    return separators_of([m.content for m in messages] + [a for a in arguments if isinstance(a, str)])


def plain_conversation(messages: Sequence[Message], separators: tuple[str, str] | None = None) -> list[Message]:
    """A conversation for a template that cannot show calls and results: as text, in the words the tools' system
    message uses (a call as its JSON, a result as "Result of …")."""
    from localspec.engine.chat import Message

    separators = separators or conversation_separators(messages)
    plain: list[Message] = []
    for m in messages:
        if m.role == "tool":
            plain.append(Message("user", f"Result of {m.name or 'the tool'}: {m.content}"))
        elif m.tool_calls:
            calls = [{"name": c["function"]["name"], "arguments": _arguments(c["function"].get("arguments"))}
                     for c in m.tool_calls]
            plain.append(Message("assistant", json.dumps(calls[0] if len(calls) == 1 else calls,
                                                         separators=separators)))
        else:
            plain.append(Message(m.role, m.content))
    return plain


def tool_calls(grammars: Grammars, text: str, use: ToolUse, ids: tuple[str, ...] = ()) -> Calls:
    """The calls in an answer; a call whose arguments do not match its tool's parameters is no call."""
    functions = use.functions()

    separators = separators_of([text])  # the answer's own: as its grammar wrote it

    def valid(name: str, arguments: Mapping[str, Any]) -> bool:
        return grammars.matches(functions[name].get("parameters") or {"type": "object"}, arguments, separators)

    return read_calls(text, use, valid, ids)


def _single(vocab: Vocab, text: str) -> int | None:
    """The token id where ``text`` is one special token of the vocabulary, else None (then it is matched as text)."""
    ids = vocab.tokenize(text, add_special=False, parse_special=True)
    return ids[0] if len(ids) == 1 else None


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        parsed = loads_or_none(value)
        return value if parsed is None else parsed
    return value
