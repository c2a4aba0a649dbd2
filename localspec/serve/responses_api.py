"""OpenAI's Responses API (``POST /v1/responses``) as a face (serve/face.py): a Responses body is translated into a
chat completions body and read by the one body reader (localspec/openai_body.py), and the answer's pieces
(serve/pieces.py) are translated out into a ``Response`` object or its typed stream events (docs/architecture.md,
"Agents as the judge": one reader, many faces).

Stateless: the server keeps no responses, so ``previous_response_id`` (and ``conversation``) is a 400 that says to
send the whole conversation in ``input``; ``store`` is accepted (the API's default is true, and openai-agents may send
it) and nothing is stored, which the answer says with ``"store": false``. What localspec cannot do (hosted tools,
image and file input, ``background``) is a 400 naming the field, never a silently different answer.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from localspec.openai_body import Body, BodyError, parse_body
from localspec.serve.face import Face
from localspec.serve.pieces import CallPiece, Ended, FailedPiece, Piece, TextPiece
from localspec.serve.protocol import ApiError
from localspec.serve.responses import timings

ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text", "text")  # "text": a chat completions part, taken as the same
# localspec's own fields beside OpenAI's (as on /v1/chat/completions), passed to the reader as they are
# chat completions' fields that the Responses API lacks, taken as they are there (``prediction``: Predicted Outputs)
EXTENSIONS = ("speculation", "seed", "top_k", "min_p", "stop", "prediction")
# fields of a stored or server-side state this server does not keep: refused whenever given
STATEFUL = {
    "previous_response_id": "this server keeps no responses: send the whole conversation in input (the earlier "
                            "output items as they came back, then the new ones) and leave previous_response_id out",
    "conversation": "this server keeps no conversations: send the whole conversation in input and leave "
                    "conversation out",
    "prompt": "this server keeps no prompt templates: send instructions and input instead of prompt",
}
# fields that ask for a server feature localspec does not have; a value that asks for nothing is accepted
REFUSED = {
    "background": ((False,), "background responses are not supported: leave background out or false"),
    "max_tool_calls": ((), "max_tool_calls is not supported: use parallel_tool_calls false for one call at most"),
    "context_management": (([],), "context_management (compaction) is not supported: leave it out"),
    "moderation": ((), "moderation is not supported: leave it out"),
}
# an ``include`` value that asks for what no answer here has: refused rather than silently left out
INCLUDE_REFUSED = {"message.output_text.logprobs": "logprobs are not supported"}


@dataclass(frozen=True, slots=True)
class _Echo:
    """What a Response repeats of its request (the API's echo of its settings), in the Responses API's shapes."""

    fields: dict[str, Any] = field(default_factory=dict)




# -- reading: a Responses body → a chat completions body → the one reader --


@dataclass
class _Where:
    """Where each chat message came from in the Responses body, to name the Responses field in an error."""

    messages: list[str] = field(default_factory=list)  # message i → "instructions", "input" or "input.N"
    calls: dict[int, list[str]] = field(default_factory=dict)  # message i's tool call j → "input.N"
    tool: set[int] = field(default_factory=set)  # messages that are a function_call_output


def read(data: object) -> tuple[Body, _Echo]:
    """A Responses body as the one reader's Body, and what its Response repeats; ApiError 400 naming the Responses
    field it gets wrong."""
    if not isinstance(data, Mapping):
        raise ApiError(400, "the body must be a JSON object")
    _refuse(data)
    where = _Where()
    messages = _instructions(data.get("instructions"), where) + _input(data.get("input"), where)
    tools = _tools(data.get("tools"))
    chat: dict[str, Any] = {
        "model": data.get("model"),
        "messages": messages,
        "max_tokens": data.get("max_output_tokens"),
        "temperature": data.get("temperature"),
        "top_p": data.get("top_p"),
        "top_logprobs": data.get("top_logprobs"),
        "stream": data.get("stream"),
        "tools": tools,
        "tool_choice": _tool_choice(data.get("tool_choice")),
        "parallel_tool_calls": data.get("parallel_tool_calls"),
        "response_format": _format(data.get("text")),
        **{name: data[name] for name in EXTENSIONS if name in data},
    }
    try:
        body = parse_body(chat, "chat", "")
    except BodyError as e:
        raise ApiError(400, _rename(str(e), where), param=_param(e.param, where)) from None
    echo = _echo(data, tools)
    _writable(echo)
    return body, echo


def _writable(echo: _Echo) -> None:
    """A Response repeats fields the reader never reads (metadata, reasoning, text.verbosity, a tool's strict): each
    must be JSON a client can read, or the answer would fail after it began (a 500, or a stream cut short): a lone
    surrogate cannot be written as UTF-8, NaN and Infinity are no JSON."""
    for name, value in echo.fields.items():
        try:
            json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")
        except ValueError:  # UnicodeEncodeError among them
            raise ApiError(400, f"{name} holds a lone surrogate (\\ud800 to \\udfff) or NaN or Infinity: it cannot "
                                "be repeated as JSON in the Response; send valid Unicode and finite numbers",
                           param=name) from None


def _refuse(data: Mapping[str, Any]) -> None:
    for name, why in STATEFUL.items():
        if data.get(name) not in (None, ""):
            raise ApiError(400, why, param=name)
    for name, (fine, why) in REFUSED.items():
        value = data.get(name)
        if value is not None and not any(value == f and type(value) is type(f) for f in fine):
            raise ApiError(400, why, param=name)
    include = data.get("include")
    if include is not None:
        if not isinstance(include, list) or not all(isinstance(v, str) for v in include):
            raise ApiError(400, "include must be a list of strings", param="include")
        for i, value in enumerate(include):
            if value in INCLUDE_REFUSED:
                raise ApiError(400, f"include {value!r}: {INCLUDE_REFUSED[value]}", param=f"include.{i}")
    if data.get("store") is not None and not isinstance(data.get("store"), bool):
        raise ApiError(400, "store must be true or false", param="store")
    metadata = data.get("metadata")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise ApiError(400, "metadata must be an object of strings", param="metadata")
    for name in ("user", "safety_identifier", "prompt_cache_key"):
        if data.get(name) is not None and not isinstance(data.get(name), str):
            raise ApiError(400, f"{name} must be a string", param=name)
    truncation = data.get("truncation")
    if truncation not in (None, "disabled", "auto"):  # either way nothing is cut: a prompt over the context is a 400
        raise ApiError(400, "truncation must be 'disabled' or 'auto'", param="truncation")
    reasoning = data.get("reasoning")  # the served model has no separate reasoning to set: accepted, nothing to do
    if reasoning is not None and not isinstance(reasoning, Mapping):
        raise ApiError(400, "reasoning must be an object", param="reasoning")


def _instructions(value: Any, where: _Where) -> list[dict[str, Any]]:
    """``instructions``: the system message before the conversation."""
    if value is None:
        return []
    if not isinstance(value, str):
        raise ApiError(400, "instructions must be a string", param="instructions")
    where.messages.append("instructions")
    return [{"role": "system", "content": value}]


def _input(value: Any, where: _Where) -> list[dict[str, Any]]:
    """``input``: a user's text, or the conversation's items as chat messages. Consecutive function_call items are
    one assistant turn (with the text of an assistant message just before them, as this server answers: its text,
    then its calls); a function_call_output is a tool message."""
    if isinstance(value, str):
        where.messages.append("input")
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise ApiError(400, "input must be a string or a non-empty list of items (messages, function_call and "
                            "function_call_output)", param="input")
    messages: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # call_id → its function's name, for the tool message that answers it
    calls_open = False  # the last message is an assistant turn that function_call items may still join
    for n, item in enumerate(value):
        param = f"input.{n}"
        if not isinstance(item, Mapping):
            raise ApiError(400, f"{param} must be an object (a message, function_call or function_call_output)",
                           param=param)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise ApiError(400, f"{param}.role must be one of {', '.join(ROLES)}", param=f"{param}.role")
            messages.append({"role": role, "content": _text(item.get("content"), f"{param}.content")})
            where.messages.append(param)
            calls_open = role == "assistant"
        elif kind == "function_call":
            call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
            for key, got in (("call_id", call_id), ("name", name), ("arguments", arguments)):
                if not isinstance(got, str) or (key != "arguments" and not got):
                    raise ApiError(400, f"{param}.{key} must be a{' non-empty' if key != 'arguments' else ''} "
                                        "string", param=f"{param}.{key}")
            if not calls_open:
                messages.append({"role": "assistant", "content": None})
                where.messages.append(param)
                calls_open = True
            turn = messages[-1]
            turn.setdefault("tool_calls", []).append(
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
            where.calls.setdefault(len(messages) - 1, []).append(param)
            names[call_id] = name
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise ApiError(400, f"{param}.call_id must be the call_id of the function_call it answers",
                               param=f"{param}.call_id")
            message: dict[str, Any] = {"role": "tool", "tool_call_id": call_id,
                                       "content": _text(item.get("output"), f"{param}.output")}
            if call_id in names:
                message["name"] = names[call_id]
            messages.append(message)
            where.tool.add(len(messages) - 1)
            where.messages.append(param)
            calls_open = False
        elif kind == "reasoning":
            # another model's reasoning (often encrypted): this model never writes one, and no template shows one
            continue
        elif kind == "item_reference":
            raise ApiError(400, f"{param}: this server keeps no items to refer to: send the item itself",
                           param=param)
        else:
            raise ApiError(400, f"{param}: items of type {kind!r} are not supported: only messages, function_call "
                                "and function_call_output (function tools only)", param=f"{param}.type")
    if not messages:
        raise ApiError(400, "input holds no message", param="input")
    return messages


def _text(content: Any, param: str) -> str:
    """A message's content or a call's output: a string, or text parts joined; other parts are refused."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"{param} must be a string or a list of text parts", param=param)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):  # an earlier answer's refusal, as text
            texts.append(part["refusal"])
        elif kind in ("input_image", "input_file", "input_audio"):
            raise ApiError(400, f"{param}.{j}: {kind} parts are not supported: the served model reads text only",
                           param=f"{param}.{j}")
        else:
            raise ApiError(400, f"{param}.{j} must be a text part ({{\"type\": \"input_text\", \"text\": …}})",
                           param=f"{param}.{j}")
    return "".join(texts)


def _tools(value: Any) -> list[dict[str, Any]] | None:
    """Function tools in chat completions' shape; any other tool (hosted ones: web_search, file_search, …) is
    refused, since nothing here would run it."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise ApiError(400, "tools must be a list of function tools", param="tools")
    out = []
    for i, tool in enumerate(value):
        kind = tool.get("type") if isinstance(tool, Mapping) else None
        if kind != "function":
            raise ApiError(400, f"tools.{i}: only function tools are supported here, not {kind!r} (nothing on this "
                                "server runs hosted tools)", param=f"tools.{i}.type" if kind else f"tools.{i}")
        function = {key: tool[key] for key in ("name", "description", "parameters") if tool.get(key) is not None}
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return value  # none, auto, required: the same words; anything else the reader refuses
    if isinstance(value, Mapping) and value.get("type") == "function":
        return {"type": "function", "function": {"name": value.get("name")}}
    kind = value.get("type") if isinstance(value, Mapping) else None
    raise ApiError(400, "tool_choice must be none, auto, required or {\"type\": \"function\", \"name\": …}"
                        + (f", not {kind!r}" if kind else ""), param="tool_choice")


def _format(text: Any) -> Any:
    """``text.format`` as a response_format: json_schema's fields move under ``json_schema``; text, json_object
    and localspec's grammar and regex are the same objects."""
    if text is None:
        return None
    if not isinstance(text, Mapping):
        raise ApiError(400, "text must be an object such as {\"format\": {\"type\": \"text\"}}", param="text")
    form = text.get("format")
    if isinstance(form, Mapping) and form.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {k: v for k, v in form.items() if k != "type"}}
    return form


# a message named in the reader's words, with what follows it: messages[3].content, messages.3.tool_calls.0.id
_MESSAGE = re.compile(r"messages(?:\[(\d+)\]|\.(\d+))((?:\.[A-Za-z_]+|\.\d+|\[\d+\])*)")


def _param(param: str | None, where: _Where) -> str | None:
    """A chat completions field, as the reader names it, as the Responses field it came from."""
    if param is None:
        return None
    head, _, rest = param.partition(".")
    if head == "messages":
        index, _, tail = rest.partition(".")
        if not index.isdigit() or int(index) >= len(where.messages):
            return "input"
        i = int(index)
        if tail.startswith("tool_calls."):
            j, _, tail = tail.removeprefix("tool_calls.").partition(".")
            calls = where.calls.get(i, [])
            at = calls[int(j)] if j.isdigit() and int(j) < len(calls) else where.messages[i]
            return at + ("." + tail.removeprefix("function.") if tail.removeprefix("function.") else "")
        if tail == "content":
            tail = "output" if i in where.tool else tail
        elif tail == "tool_call_id":
            tail = "call_id"
        # "instructions" and a string "input" are the whole field: nothing under them to name
        return where.messages[i] + (f".{tail}" if tail and where.messages[i].startswith("input.") else "")
    return {"max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens"}.get(
        param, re.sub(r"^tools\.(\d+)\.function", r"tools.\1",
                      re.sub(r"^response_format(\.json_schema)?", "text.format", param)))


def _rename(message: str, where: _Where) -> str:
    """The reader's error message in the Responses API's names."""
    def item(m: re.Match[str]) -> str:
        tail = re.sub(r"\[(\d+)\]", r".\1", m.group(3))
        return _param(f"messages.{m.group(1) or m.group(2)}{tail}", where) or "input"

    message = _MESSAGE.sub(item, message)
    message = re.sub(r"\bmax_tokens\b", "max_output_tokens", message)
    message = re.sub(r"\bresponse_format(\.json_schema)?", "text.format", message)
    return re.sub(r"(tools[\[.]\d+\]?)\.function\b", r"\1", message)


def _echo(data: Mapping[str, Any], tools: list[dict[str, Any]] | None) -> _Echo:
    """The request's settings as a Response repeats them (the Responses API's shapes; its defaults where left
    out)."""
    choice = data.get("tool_choice")
    text = data.get("text") if isinstance(data.get("text"), Mapping) else {}
    echoed_tools = [{"type": "function", "name": t["function"]["name"],
                     "description": t["function"].get("description"),
                     "parameters": t["function"].get("parameters"),
                     "strict": original.get("strict", True)}
                    for t, original in zip(tools or [], data.get("tools") or [], strict=False)]
    return _Echo({
        "instructions": data.get("instructions"),
        "max_output_tokens": data.get("max_output_tokens"),
        "metadata": data.get("metadata") or {},
        "parallel_tool_calls": data.get("parallel_tool_calls") is not False,
        "reasoning": data.get("reasoning") or {"effort": None, "summary": None},
        "temperature": data.get("temperature"),
        "text": {"format": text.get("format") or {"type": "text"}, "verbosity": text.get("verbosity") or "medium"},
        "tool_choice": "auto" if choice is None else choice,
        "tools": echoed_tools,
        "top_p": data.get("top_p"),
        "truncation": data.get("truncation") or "disabled",
        "user": data.get("user"),
        "safety_identifier": data.get("safety_identifier"),
        "prompt_cache_key": data.get("prompt_cache_key"),
    })


# -- answering: pieces → a Response, or its stream events --


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _usage(ended: Ended) -> dict[str, Any]:
    stats = ended.stats
    # cache_write_tokens: OpenAI's explicit cache entries, which nothing here makes; what the KV cache held is
    # cached_tokens
    return {"input_tokens": stats.prompt_tokens, "output_tokens": stats.generated_tokens,
            "total_tokens": stats.prompt_tokens + stats.generated_tokens,
            "input_tokens_details": {"cached_tokens": ended.reused, "cache_write_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0, **stats.prediction_usage()}}


def _ending(reason: str) -> tuple[str, dict[str, Any] | None]:
    """A finish reason as the Response's status and incomplete_details: a token limit (or a full context) is
    max_output_tokens; another cut (a grammar's dead end) is named as the scheduler names it."""
    if reason in ("stop", "tool_calls"):
        return "completed", None
    return "incomplete", {"reason": "max_output_tokens" if reason == "length" else reason}


def _message(text: str, status: str) -> dict[str, Any]:
    return {"type": "message", "id": _id("msg"), "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def _call(call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": _id("fc"), "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


@dataclass
class ResponsesAnswer:
    """One Response being sent (serve/face.py's ``FaceAnswer``)."""

    model: str
    echo: _Echo = field(default_factory=lambda: _echo({}, None))
    id: str = field(default_factory=lambda: _id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))
    # the stream's state: its next sequence number and the output items sent so far (for response.failed)
    _sequence: int = 0
    _items: list[dict[str, Any]] = field(default_factory=list)

    def response(self, status: str, output: list[dict[str, Any]], ended: Ended | None = None,
                 incomplete: dict[str, Any] | None = None, error: dict[str, Any] | None = None) -> dict[str, Any]:
        """The Response object: its status and output, the request's settings, its usage and timings once ended."""
        out: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "background": False, "error": error, "incomplete_details": incomplete, "model": self.model,
            "output": output, "previous_response_id": None, "service_tier": "default",
            "store": False,  # nothing is kept (stateless): a later previous_response_id could not find it
            **self.echo.fields,
            "usage": _usage(ended) if ended is not None else None,
        }
        if ended is not None:
            out["completed_at"] = int(time.time())
            out["timings"] = timings(ended.stats, ended.reused, ended.drafters)
        return out

    def whole(self, ended: Ended) -> dict[str, Any]:
        status, incomplete = _ending(ended.reason)
        calls = ended.calls.calls if ended.calls is not None else ()
        output: list[dict[str, Any]] = []
        content = ended.content
        # a message where there is text, and always where there is no call: an answer is never empty of items
        if (content and content.strip()) or not calls:
            output.append(_message(content or "", status if not calls else "completed"))
        for call in calls:
            output.append(_call(call["id"], call["function"]["name"], call["function"]["arguments"], "completed"))
        return self.response(status, output, ended, incomplete)

    def event(self, kind: str, **fields: Any) -> bytes:
        """One typed server-sent event: ``event: TYPE`` and its JSON with its type and sequence number."""
        data = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()

    async def stream(self, pieces: AsyncIterator[Piece], include_usage: bool) -> AsyncIterator[bytes]:
        """The Responses API's events: created and in_progress; per output item its added, its text or arguments
        in deltas, its done events; then completed (or incomplete, or failed) with the whole Response, usage
        always (``include_usage`` is chat completions' option)."""
        items = self._items
        yield self.event("response.created", response=self.response("in_progress", []))
        yield self.event("response.in_progress", response=self.response("in_progress", []))
        calls: dict[int, int] = {}  # a call's index among the answer's calls → its output index
        async for piece in pieces:
            if isinstance(piece, TextPiece):
                if not piece.text:
                    continue
                if not items or items[-1]["type"] != "message" or items[-1]["status"] != "in_progress":
                    for event in self._close("completed"):
                        yield event
                    items.append(_message("", "in_progress"))
                    at = len(items) - 1
                    yield self.event("response.output_item.added", output_index=at,
                                     item={**items[at], "content": []})
                    yield self.event("response.content_part.added", item_id=items[at]["id"], output_index=at,
                                     content_index=0, part=items[at]["content"][0])
                at = len(items) - 1
                items[at]["content"][0]["text"] += piece.text
                yield self.event("response.output_text.delta", item_id=items[at]["id"], output_index=at,
                                 content_index=0, delta=piece.text, logprobs=[])
            elif isinstance(piece, CallPiece):
                if piece.name is not None or piece.index not in calls:
                    for event in self._close("completed"):
                        yield event
                    items.append(_call(piece.id, piece.name or "", "", "in_progress"))
                    calls[piece.index] = at = len(items) - 1
                    yield self.event("response.output_item.added", output_index=at, item=dict(items[at]))
                at = calls[piece.index]
                if piece.arguments:
                    items[at]["arguments"] += piece.arguments
                    yield self.event("response.function_call_arguments.delta", item_id=items[at]["id"],
                                     output_index=at, delta=piece.arguments)
            elif isinstance(piece, Ended):
                status, incomplete = _ending(piece.reason)
                if not items:  # nothing was said: still one (empty) message, as the whole answer has
                    items.append(_message("", "in_progress"))
                    yield self.event("response.output_item.added", output_index=0, item={**items[0], "content": []})
                    yield self.event("response.content_part.added", item_id=items[0]["id"], output_index=0,
                                     content_index=0, part=items[0]["content"][0])
                for event in self._close("completed" if status == "completed" else "incomplete"):
                    yield event
                kind = "response.completed" if status == "completed" else "response.incomplete"
                yield self.event(kind, response=self.response(status, items, piece, incomplete))
            elif isinstance(piece, FailedPiece):
                for event in self._close("incomplete"):
                    yield event
                code = "server_error" if piece.status >= 500 else "invalid_prompt"
                yield self.event("response.failed", response=self.response(
                    "failed", items, error={"code": code, "message": piece.message}))

    def _close(self, status: str) -> list[bytes]:
        """The done events of the item still open (the last one), which ends with ``status``."""
        items = self._items
        if not items or items[-1]["status"] != "in_progress":
            return []
        at, item = len(items) - 1, items[-1]
        item["status"] = status
        if item["type"] == "message":
            part = item["content"][0]
            return [self.event("response.output_text.done", item_id=item["id"], output_index=at, content_index=0,
                               text=part["text"], logprobs=[]),
                    self.event("response.content_part.done", item_id=item["id"], output_index=at, content_index=0,
                               part=part),
                    self.event("response.output_item.done", output_index=at, item=item)]
        return [self.event("response.function_call_arguments.done", item_id=item["id"], output_index=at,
                           name=item["name"], arguments=item["arguments"]),
                self.event("response.output_item.done", output_index=at, item=item)]

    def failed(self, error: ApiError) -> bytes:
        """The answer failed after its stream began: an ``error`` event, then ``response.failed`` with the output
        sent so far."""
        closing = b"".join(self._close("incomplete"))
        code = error.code or ("server_error" if error.status >= 500 else "invalid_prompt")
        return closing + self.event("error", code=code, message=error.message, param=error.param) + \
            self.event("response.failed", response=self.response(
                "failed", self._items, error={"code": code, "message": error.message}))


def _answer(model: str, data: object) -> ResponsesAnswer:
    """A Response for ``data`` (read already: its tools translate), repeating its settings."""
    assert isinstance(data, Mapping)
    return ResponsesAnswer(model, _echo(data, _tools(data.get("tools"))))


def face() -> Face:
    """The Responses API at POST /v1/responses; a prompt over the context is blamed on ``input``."""
    return Face("responses", lambda data: read(data)[0], _answer, prompt_param="input")
