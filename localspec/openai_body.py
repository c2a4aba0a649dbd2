"""OpenAI request bodies, read once for every face that takes them: `localspec serve`'s routes, `localspec batch`'s
lines (an OpenAI Batch line's ``body``, and localspec's own lines, which are the same fields beside an ``id``) and
``generate_many``'s mappings. One reader, so that batch and serve cannot drift apart on what a body means.

Strict: a known field of the wrong type or out of range is an error naming it (``"5"`` is not a number, as OpenAI's
own server says). What localspec cannot do (``n`` > 1, logprobs, penalties, the old ``functions``) is an
error that says so, never a silently different answer; a value that asks for nothing (``n: 1``,
``presence_penalty: 0``, ``tools: []``) is accepted. Unknown fields are ignored, as OpenAI's server does.

Plain Python rather than pydantic: batch and the Python API must not need the `serve` extra.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from localspec import bounded_json
from localspec.engine.chat import Message
from localspec.errors import UserError
from localspec.request import STYLES, Request
from localspec.schema import ConstraintError, ConstraintSpec
from localspec.settings import MODEL_FREE_DRAFTERS, TEMPERATURE_MAX
from localspec.structured.tools import ToolUse, read_tools

Kind = Literal["chat", "completion"]
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
K_MAX = 16
STOPS_MAX = 4


class BodyError(UserError):
    """A body that cannot run as asked; ``param`` names the field (OpenAI's ``error.param``), dotted with list
    indexes as ``messages.0.content``."""

    def __init__(self, param: str | None, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class Body:
    """What one body asks for: the generation, and how the answer is to be sent (serve's concern; batch writes
    every answer whole)."""

    request: Request
    model: str | None = None
    stream: bool = False
    include_usage: bool = False


def loads(text: str | bytes) -> Any:
    """A body's JSON, with nesting past ``bounded_json.DEPTH_MAX`` a ValueError like any other bad JSON."""
    return bounded_json.loads(text)


def parse_body(data: object, kind: Kind | None, id: str, *, style: str = "plain", line: int = 0) -> Body:
    """``data`` as a chat (``messages``) or text completion (``prompt``) body; ``kind`` None: whichever the body
    holds (localspec's own lines). BodyError names the first field it gets wrong."""
    if not isinstance(data, Mapping):
        raise BodyError(None, "the body must be a JSON object")
    prompt, messages = _get(data, "prompt"), _get(data, "messages")
    if kind is None:
        if (prompt is None) == (messages is None):
            raise BodyError(None, "give either a prompt or messages")
        kind = "chat" if messages is not None else "completion"
    if kind == "chat" and messages is None:
        raise BodyError("messages", "a chat completion needs messages (a non-empty list)")
    if kind == "completion" and prompt is None:
        raise BodyError("prompt", "a text completion needs a prompt")
    _unsupported(data, kind)
    max_tokens = _number(data, "max_tokens", int, 1, None)
    if kind == "chat":  # OpenAI's newer name for it, which wins where both are given
        max_tokens = _number(data, "max_completion_tokens", int, 1, None) or max_tokens
    stream_options = _get(data, "stream_options")
    if stream_options is not None and not isinstance(stream_options, Mapping):
        raise BodyError("stream_options", "stream_options must be an object")
    speculation = _get(data, "speculation")
    if speculation is not None and not isinstance(speculation, Mapping):
        raise BodyError("speculation", "speculation must be an object")
    speculation = speculation or {}
    request = Request(
        id,
        prompt=_prompt(prompt) if kind == "completion" else None,
        messages=_messages(messages) if kind == "chat" else None,
        max_tokens=max_tokens,
        temperature=_number(data, "temperature", float, 0, TEMPERATURE_MAX),
        top_p=_number(data, "top_p", float, 0, 1, low_open=True),
        top_k=_number(data, "top_k", int, 0, None),
        min_p=_number(data, "min_p", float, 0, 1, high_open=True),
        seed=_number(data, "seed", int, 0, None),
        stop=_stop(_get(data, "stop")),
        drafter=_drafter(_get(speculation, "drafter")),
        k=_number(speculation, "k", int, 0, K_MAX, param="speculation.k"),
        style=style,
        line=line,
        constraint=_constraint(_get(data, "response_format")),
        tools=_tools(data, kind),
        prediction=_prediction(_get(data, "prediction")),
    )
    _number(speculation, "branches", int, 1, 1, param="speculation.branches",
            why="token trees are not verified inside the shared pass")
    return Body(request, model=_string(data, "model"), stream=bool(_flag(data, "stream")),
                include_usage=bool(_flag(stream_options or {}, "include_usage", "stream_options.include_usage")))


def check_request(request: Request) -> Request:
    """A Request built in Python (``localspec.generate_many``), read as the same line would be: one reader, so
    neither a k past K_MAX, a missing prompt, a drafter that needs a model nor a lone surrogate gets past it."""
    if not isinstance(request.id, str):
        raise BodyError("id", f"a request's id must be a string, got {request.id!r}")
    if request.style not in STYLES:
        raise BodyError("style", f"style must be one of {', '.join(STYLES)}, got {request.style!r}")
    messages = request.messages
    if messages is not None:
        if not isinstance(messages, (tuple, list)) or not all(isinstance(m, Message) for m in messages):
            raise BodyError("messages", "a Request's messages must be a tuple of localspec Message(role, content)")
        messages = [{"role": m.role, "content": m.content,
                     **({"tool_calls": list(m.tool_calls)} if m.tool_calls else {}),
                     **({"tool_call_id": m.tool_call_id, "name": m.name} if m.role == "tool" else {})}
                    for m in messages]
    fields = {"prompt": request.prompt, "messages": messages, "max_tokens": request.max_tokens,
              "temperature": request.temperature, "top_p": request.top_p, "top_k": request.top_k,
              "min_p": request.min_p, "seed": request.seed,
              "stop": list(request.stop) if isinstance(request.stop, tuple) else request.stop,
              "speculation": {"drafter": request.drafter, "k": request.k},
              "response_format": ConstraintSpec.of(request.constraint),
              "prediction": None if request.prediction is None else {"type": "content",
                                                                      "content": request.prediction},
              **({"tools": request.tools.tools, "tool_choice": _choice(request.tools.choice),
                  "parallel_tool_calls": request.tools.parallel} if request.tools is not None else {})}
    return parse_body(fields, None, request.id, style=request.style, line=request.line).request


# -- what localspec cannot do --

# field → the values that ask for nothing; any other value is refused, with why
_NO_OPS: dict[str, tuple[tuple[Any, ...], str]] = {
    "n": ((1,), "only n=1 is supported (one choice per request); send several requests instead"),
    "best_of": ((1,), "only best_of=1 is supported (one choice per request)"),
    "presence_penalty": ((0,), "presence_penalty is not supported (it would change the answer): leave it 0"),
    "frequency_penalty": ((0,), "frequency_penalty is not supported (it would change the answer): leave it 0"),
    "logit_bias": (({},), "logit_bias is not supported: leave it out or empty"),
    "functions": (([],), "functions (function calling) are not supported: the answer is text"),
    "function_call": (("none",), "function_call: functions are not supported, so only 'none'"),
    "modalities": ((["text"],), "modalities: only [\"text\"] is supported"),
    "audio": ((), "audio output is not supported"),
    "echo": ((False,), "echo is not supported"),
    "suffix": (("",), "suffix (fill-in-the-middle) is not supported"),
    "logprobs": ((False, 0), "logprobs are not supported"),
    "top_logprobs": ((0,), "logprobs are not supported"),
}


def _unsupported(data: Mapping[str, Any], kind: Kind) -> None:
    for name, (fine, why) in _NO_OPS.items():
        value = _get(data, name)
        if value is None:
            continue
        # True == 1 and 0.0 == 0 in Python; a bool only stands for itself
        if not any(value == f and isinstance(value, bool) == isinstance(f, bool) for f in fine):
            raise BodyError(name, why)


# -- fields --


def _get(data: Mapping[str, Any], key: str) -> Any:
    """A field's value; null is the same as leaving it out."""
    return data.get(key)


def lone_surrogate(text: str) -> int | None:
    """Where ``text`` holds a lone surrogate (not valid Unicode: it cannot be written as UTF-8), else None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def _unicode(text: str, param: str) -> str:
    at = lone_surrogate(text)
    if at is not None:
        raise BodyError(param, f"{param} holds a lone surrogate ({text[at]!a} at character {at}): "
                               "it is not valid Unicode; send the character it was meant to be")
    return text


def _prompt(value: Any) -> str:
    if isinstance(value, list) and len(value) == 1:  # OpenAI's prompt may be a list: one string at most here
        value = value[0]
    if not isinstance(value, str):
        raise BodyError("prompt", "prompt must be a string (or a list of one string)")
    return _unicode(value, "prompt")


def _messages(raw: Any) -> tuple[Message, ...]:
    if not isinstance(raw, list) or not raw:
        raise BodyError("messages", "messages must be a non-empty list")
    out = []
    for i, m in enumerate(raw):
        # a string first: a list or an object as the role is unhashable, and looking it up in ROLES would raise
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or m["role"] not in ROLES:
            raise BodyError(f"messages.{i}.role", f"messages[{i}]: each message needs a role "
                                                  f"({', '.join(ROLES)}) and content")
        role = ROLES[m["role"]]
        if role == "tool":  # a tool's result, answering one of the assistant's calls
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise BodyError(f"messages.{i}.tool_call_id", f"messages[{i}]: a tool message needs the "
                                                              "tool_call_id of the call it answers")
            name = m.get("name") if isinstance(m.get("name"), str) else None
            out.append(Message("tool", _content(m, i), tool_call_id=_unicode(call_id, f"messages.{i}.tool_call_id"),
                               name=None if name is None else _unicode(name, f"messages.{i}.name")))
        elif role == "assistant" and m.get("tool_calls"):
            out.append(Message("assistant", _content(m, i), tool_calls=_calls(m["tool_calls"], i)))
        else:
            out.append(Message(role, _content(m, i)))
    return tuple(out)


def _calls(raw: Any, i: int) -> tuple[dict[str, Any], ...]:
    """An assistant's earlier tool calls, as OpenAI sends them back: {id, type: function, function: {name,
    arguments: a JSON string}}."""
    param = f"messages.{i}.tool_calls"
    if not isinstance(raw, list):
        raise BodyError(param, f"messages[{i}].tool_calls must be a list of calls")
    calls = []
    for j, call in enumerate(raw):
        f = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(f, Mapping) or not isinstance(f.get("name"), str) \
                or not isinstance(f.get("arguments", "{}"), str):
            raise BodyError(f"{param}.{j}", f"messages[{i}].tool_calls[{j}] must be {{\"id\", \"type\": "
                                            "\"function\", \"function\": {\"name\", \"arguments\": a JSON string}}")
        where = f"{param}.{j}.function"
        arguments = _unicode(f.get("arguments", "{}"), f"{where}.arguments")
        try:  # escaped in the JSON text ("\\ud800"), a lone surrogate is as invalid once the arguments are read
            value = json.loads(arguments)
            deep = bounded_json.depth_over(value, bounded_json.DEPTH_MAX)
        except RecursionError:
            deep = True
        except ValueError:  # arguments that are not JSON are passed on as the text they are
            value, deep = None, False
        if deep:
            raise BodyError(f"{where}.arguments", f"messages[{i}].tool_calls[{j}].function.arguments nests deeper "
                                                  f"than {bounded_json.DEPTH_MAX} levels")
        if value is not None:
            _unicode(json.dumps(value, ensure_ascii=False), f"{where}.arguments")
        calls.append({"id": _unicode(str(call.get("id") or f"call_{i}_{j}"), f"{param}.{j}.id"), "type": "function",
                      "function": {"name": _unicode(f["name"], f"{where}.name"), "arguments": arguments}})
    return tuple(calls)


def _content(message: Mapping[str, Any], i: int) -> str:
    param = f"messages.{i}.content"
    content = message.get("content")
    if content is None and message["role"] == "assistant":  # OpenAI's: an assistant turn that only called tools
        return ""
    if isinstance(content, list):  # OpenAI's content parts: text only
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise BodyError(param, f"messages[{i}].content: only text parts are supported")
            texts.append(part["text"])
        content = "".join(texts)
    if not isinstance(content, str):
        raise BodyError(param, f"messages[{i}]: a message's content must be a string or a list of text parts")
    return _unicode(content, param)


def _number(data: Mapping[str, Any], key: str, kind: type, low: float, high: float | None, *,
            low_open: bool = False, high_open: bool = False, param: str | None = None, why: str = "") -> Any:
    value = _get(data, key)
    param = param or key
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise BodyError(param, f"{param} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    above = value > low if low_open else value >= low
    below = high is None or (value < high if high_open else value <= high)
    if not (above and below):  # NaN fails both
        if high is None:
            rule = f"at least {low:g}" if low else "0 or more"
        elif low == high:
            rule = f"{low:g}" + (f" ({why})" if why else "")
        else:
            rule = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
            if not low_open and not high_open:
                rule = f"between {low:g} and {high:g}"
        raise BodyError(param, f"{param} must be {rule}, got {value!r}")
    return kind(value)


def _stop(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > STOPS_MAX:
        raise BodyError("stop", f"stop must be a non-empty string or a list of at most {STOPS_MAX} of them")
    return tuple(_unicode(s, "stop") for s in stops)


def _prediction(value: Any) -> str | None:
    """OpenAI's ``prediction``: ``{"type": "content", "content": a string or a list of text parts}``; its text, or
    None where it predicts nothing (an empty text)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise BodyError("prediction", 'prediction must be an object: {"type": "content", "content": "<the text the '
                                      'answer will mostly be>"}')
    if value.get("type") != "content":
        raise BodyError("prediction.type", f"prediction.type must be \"content\" (the only kind of prediction), got "
                                           f"{value.get('type')!r}")
    content = value.get("content")
    if isinstance(content, list):  # content parts, as a message's: text only
        if not all(isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise BodyError("prediction.content", "prediction.content: only text parts ({\"type\": \"text\", "
                                                  "\"text\": ...}) are supported")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise BodyError("prediction.content", "prediction.content must be a string or a list of text parts")
    # its size is held to PREDICTION_MAX_TOKENS where it is tokenized (Prompts.prediction_tokens)
    return _unicode(content, "prediction.content") or None


def _constraint(value: Any) -> ConstraintSpec | None:
    try:
        return ConstraintSpec.of(value)
    except ConstraintError as e:
        raise BodyError(e.param or "response_format", str(e)) from None


def _choice(choice: str) -> Any:
    return choice if choice in ("auto", "required") else {"type": "function", "function": {"name": choice}}


def _tools(data: Mapping[str, Any], kind: Kind) -> ToolUse | None:
    try:
        use = read_tools(_get(data, "tools"), _get(data, "tool_choice"), _get(data, "parallel_tool_calls"))
    except ConstraintError as e:
        raise BodyError(e.param or "tools", str(e)) from None
    if use is not None and kind != "chat":
        raise BodyError("tools", "tools need a chat completion (messages), not a text completion")
    if use is not None and _get(data, "response_format") not in (None, {"type": "text"}):
        raise BodyError("response_format", "give either tools or a response_format, not both")
    return use


def _drafter(value: Any) -> str | None:
    if value is not None and value not in MODEL_FREE_DRAFTERS:  # many sequences share one pass
        raise BodyError("speculation.drafter", f"speculation.drafter must be {', '.join(MODEL_FREE_DRAFTERS[:-1])} "
                                               f"or {MODEL_FREE_DRAFTERS[-1]} (auto: n-gram lookup, then the "
                                               "server's draft model if it has one)")
    return value


def _string(data: Mapping[str, Any], key: str) -> str | None:
    value = _get(data, key)
    if value is not None and not isinstance(value, str):
        raise BodyError(key, f"{key} must be a string")
    return value


def _flag(data: Mapping[str, Any], key: str, param: str | None = None) -> bool | None:
    value = _get(data, key)
    if value is not None and not isinstance(value, bool):
        raise BodyError(param or key, f"{param or key} must be true or false")
    return value
