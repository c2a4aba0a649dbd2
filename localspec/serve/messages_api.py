"""Anthropic's Messages API (``POST /v1/messages``, ``POST /v1/messages/count_tokens``) as a face of the server
(serve/face.py): its body translated into an OpenAI chat completion body for the one reader (openai_body.py), its
answer translated out of the pieces (serve/pieces.py) into a Message or its stream of events, its errors in
Anthropic's shape (``{"type": "error", "error": {"type", "message"}}``).

Supported: ``model``, ``max_tokens`` (required, as Anthropic's API has it), ``system`` (a string or text blocks),
``messages`` (a string or blocks: ``text``, an assistant's ``tool_use``, a user's ``tool_result``; earlier turns'
``thinking`` blocks are dropped, as Anthropic drops them), client ``tools`` with ``input_schema``, ``tool_choice``
(auto, any, tool, none, ``disable_parallel_tool_use``), ``stop_sequences``, ``temperature``, ``top_p``, ``top_k``,
``stream``, ``output_config.format`` (a JSON schema); ``metadata`` and the other fields that ask for nothing here
(``service_tier``, ``cache_control``: the prompt cache is automatic) are ignored. localspec's own ``speculation``
and ``seed`` pass through, as on chat completions.

Refused, with a 400 that says so: image, document and other non-text blocks, ``thinking`` other than disabled, server
tools (a tool whose ``type`` is not ``custom``), MCP servers, and a conversation that ends with the assistant's
message (prefill: the answer would be a new turn, not its continuation).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from localspec.openai_body import STOPS_MAX, Body, BodyError, parse_body
from localspec.serve.face import Face
from localspec.serve.pieces import CallPiece, Ended, FailedPiece, Piece, TextPiece
from localspec.serve.protocol import ApiError
from localspec.serve.responses import failure, timings

# Ended.reason (serve/pieces.py) as Anthropic says it; any other (a grammar's dead end) is the turn's natural end
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
# an HTTP status as Anthropic's error types name it (5xx not listed: api_error)
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}
# fields that mean the same on both APIs, passed on as they are (speculation and seed: localspec's own, as on chat)
# the same in both APIs; ``speculation`` and ``prediction`` (OpenAI's Predicted Outputs) are extensions here
SAME_FIELDS = ("model", "temperature", "top_p", "top_k", "stream", "seed", "speculation", "prediction")
# an OpenAI field the reader may blame → the Anthropic field it came from
PARAMS = {"parallel_tool_calls": "tool_choice.disable_parallel_tool_use", "response_format": "output_config.format"}
# a block's own text joins its neighbours' with a blank line: blocks are separate parts (a system prompt's sections,
# a reminder before the question), and run together they would read as one sentence
JOIN = "\n\n"


def face() -> Face:
    """POST /v1/messages: a generation, which needs ``max_tokens``."""
    return Face("messages", _read, lambda model, _: MessageAnswer(model), error_body, prompt_param="messages")


def count_face() -> Face:
    """POST /v1/messages/count_tokens: the same body read for its prompt alone (Anthropic's has no
    ``max_tokens``); its metrics name is the generation's plus ``/count_tokens`` (app.py's ``count_route``)."""
    return Face("messages", _read_count, lambda model, _: MessageAnswer(model), error_body, prompt_param="messages")


def error_body(error: ApiError) -> dict[str, Any]:
    """An error in Anthropic's shape; its type from the status, as Anthropic's SDK maps the status to its
    exception."""
    kind = ERROR_TYPES.get(error.status, "api_error" if error.status >= 500 else "invalid_request_error")
    # a message may quote the body (a block's type), and a lone surrogate there cannot be written as UTF-8: the
    # error itself would fail, as a 500; quoted as its escape it is the 400 it is
    message = error.message.encode("utf-8", "backslashreplace").decode("utf-8")
    return {"type": "error", "error": {"type": kind, "message": message}}


# -- the body: translated for the one reader --


def _read(data: object) -> Body:
    return _parsed(data, counting=False)


def _read_count(data: object) -> Body:
    return _parsed(data, counting=True)


def _parsed(data: object, counting: bool) -> Body:
    """``data`` (a Messages API body) as the reader's Body; ApiError 400 naming the Anthropic field at fault."""
    if not isinstance(data, Mapping):
        raise ApiError(400, "the body must be a JSON object")
    chat, where = _chat_body(data, counting)
    try:
        return parse_body(chat, "chat", "")
    except BodyError as e:
        raise _blamed(e, where) from None


def _chat_body(data: Mapping[str, Any], counting: bool) -> tuple[dict[str, Any], list[str]]:
    """The OpenAI chat completion body that asks for what ``data`` does, and for each of its messages the Anthropic
    field it came from (where the reader's error is blamed)."""
    if not counting and data.get("max_tokens") is None:
        raise ApiError(400, "max_tokens is required: the most tokens the answer may have", param="max_tokens")
    _refuse(data)
    messages, where = _messages(data)
    chat: dict[str, Any] = {"messages": messages}
    chat |= {name: data[name] for name in SAME_FIELDS if data.get(name) is not None}
    if counting:  # nothing is generated: how it would be sent does not matter
        chat.pop("stream", None)
    else:
        chat["max_tokens"] = data["max_tokens"]
    if data.get("stop_sequences") is not None:
        chat["stop"] = data["stop_sequences"]
    if data.get("tools") is not None:
        chat["tools"] = _tools(data["tools"])
    if data.get("tool_choice") is not None:
        chat |= _tool_choice(data["tool_choice"])
    if data.get("output_config") is not None:
        chat |= _output_config(data["output_config"])
    return chat, where


def _refuse(data: Mapping[str, Any]) -> None:
    """What this server cannot do, said rather than ignored: the answer would not be what was asked."""
    thinking = data.get("thinking")
    if thinking is not None and not (isinstance(thinking, Mapping) and thinking.get("type") == "disabled"):
        raise ApiError(400, "thinking is not supported: this server's model answers without extended thinking; "
                            "leave thinking out or send {\"type\": \"disabled\"}", param="thinking")
    if data.get("mcp_servers"):
        raise ApiError(400, "mcp_servers are not supported: give the tools as client tools and run them yourself",
                       param="mcp_servers")


def _messages(data: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """``system`` and ``messages`` as OpenAI's messages, each with the Anthropic field it came from."""
    out: list[dict[str, Any]] = []
    where: list[str] = []
    if data.get("system") is not None:
        out.append({"role": "system", "content": _text(data["system"], "system")})
        where.append("system")
    raw = data.get("messages")
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, "messages must be a non-empty list of {\"role\", \"content\"}", param="messages")
    names: dict[str, str] = {}  # a tool_use's id → its tool's name, which the result's text says (tool_prompt.py)
    for i, message in enumerate(raw):
        param = f"messages.{i}"
        role = message.get("role") if isinstance(message, Mapping) else None
        if role not in ("user", "assistant", "system"):
            raise ApiError(400, f"messages[{i}] needs a role (user or assistant) and content", param=f"{param}.role")
        content = message.get("content")
        if isinstance(content, str) or role == "system":
            out.append({"role": role, "content": _text(content, f"{param}.content")})
            where.append(f"{param}.content")
        elif not isinstance(content, list):
            raise ApiError(400, f"messages[{i}].content must be a string or a list of content blocks",
                           param=f"{param}.content")
        elif role == "assistant":
            out.append(_assistant(content, param, names))
            where.append(f"{param}.content")
        else:
            for message_out, source in _user(content, param, names):
                out.append(message_out)
                where.append(source)
    if raw[-1].get("role") == "assistant":
        raise ApiError(400, "the last message is the assistant's: continuing it (prefill) is not supported, the "
                            "answer would be a new turn; end the messages with the user's",
                       param=f"messages.{len(raw) - 1}")
    return out, where


def _assistant(content: list[Any], param: str, names: dict[str, str]) -> dict[str, Any]:
    """An assistant's turn: its text blocks as the content, its tool_use blocks as OpenAI ``tool_calls``."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        where = f"{param}.content.{j}"
        kind = _block_type(block, where)
        if kind == "text":
            texts.append(_text_block(block, where))
        elif kind == "tool_use":
            id, name, arguments = block.get("id"), block.get("name"), block.get("input", {})
            if not isinstance(id, str) or not isinstance(name, str) or not isinstance(arguments, Mapping):
                raise ApiError(400, f"{_brackets(where)}: a tool_use block needs an id, a name and an input object",
                               param=where)
            names[id] = name
            calls.append({"id": id, "type": "function",
                          "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}})
        elif kind not in ("thinking", "redacted_thinking"):  # earlier thinking: dropped, as Anthropic drops it
            raise _unsupported_block(kind, where, "an assistant's")
    text = JOIN.join(texts)
    if calls:
        return {"role": "assistant", "content": text or None, "tool_calls": calls}
    return {"role": "assistant", "content": text}


def _user(content: list[Any], param: str, names: dict[str, str]) -> list[tuple[dict[str, Any], str]]:
    """A user's turn: each tool_result block an OpenAI tool message, the text blocks between them user messages,
    in their order (OpenAI's tool messages must follow the calls they answer)."""
    out: list[tuple[dict[str, Any], str]] = []
    texts: list[str] = []

    def flush() -> None:
        if texts:
            out.append(({"role": "user", "content": JOIN.join(texts)}, f"{param}.content"))
            texts.clear()

    for j, block in enumerate(content):
        where = f"{param}.content.{j}"
        kind = _block_type(block, where)
        if kind == "text":
            texts.append(_text_block(block, where))
        elif kind == "tool_result":
            flush()
            out.append((_tool_result(block, where, names), where))
        else:
            raise _unsupported_block(kind, where, "a user's")
    flush()
    return out or [({"role": "user", "content": ""}, f"{param}.content")]


def _tool_result(block: Mapping[str, Any], where: str, names: dict[str, str]) -> dict[str, Any]:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise ApiError(400, f"{_brackets(where)}: a tool_result block needs the tool_use_id of the call it answers",
                       param=f"{where}.tool_use_id")
    content = block.get("content")
    text = "" if content is None else _text(content, f"{where}.content")
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise ApiError(400, f"{_brackets(where)}.is_error must be true or false", param=f"{where}.is_error")
    message: dict[str, Any] = {"role": "tool", "tool_call_id": call_id,
                               "content": f"Error: {text}" if is_error else text}
    if call_id in names:
        message["name"] = names[call_id]
    return message


def _block_type(block: Any, where: str) -> str:
    if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
        raise ApiError(400, f"{_brackets(where)} must be a content block: an object with a type", param=where)
    return block["type"]


def _text(value: Any, param: str) -> str:
    """A string, or text blocks (their texts joined): what a system prompt and a tool result hold."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise ApiError(400, f"{_brackets(param)} must be a string or a list of text blocks", param=param)
    return JOIN.join(_text_block(block, f"{param}.{j}") for j, block in enumerate(value))


def _text_block(block: Any, where: str) -> str:
    kind = _block_type(block, where)
    if kind != "text":
        raise _unsupported_block(kind, where, "this")
    if not isinstance(block.get("text"), str):
        raise ApiError(400, f"{_brackets(where)}: a text block needs its text as a string", param=f"{where}.text")
    return block["text"]


def _unsupported_block(kind: str, where: str, whose: str) -> ApiError:
    if kind in ("image", "document"):
        why = f"{kind} blocks are not supported: this server's model reads text only"
    elif kind in ("tool_use", "tool_result"):
        why = f"a {kind} block cannot be in {whose} message (tool_use is the assistant's, tool_result the user's)"
    else:
        why = f"{kind} blocks are not supported here (text, tool_use and tool_result are)"
    return ApiError(400, f"{_brackets(where)}: {why}", param=where)


def _tools(tools: Any) -> list[dict[str, Any]]:
    """Client tools as OpenAI function tools (the reader checks names, counts and schemas)."""
    if not isinstance(tools, list):
        raise ApiError(400, "tools must be a list of {\"name\", \"description\", \"input_schema\"}", param="tools")
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, Mapping) else None
        if not isinstance(tool, Mapping):
            raise ApiError(400, f"tools[{i}] must be an object: {{\"name\", \"description\", \"input_schema\"}}",
                           param=f"tools.{i}")
        if kind not in (None, "custom"):
            raise ApiError(400, f"tools[{i}]: {kind!r} is a server tool, which this server does not run; give "
                                "client tools (name, description, input_schema) and run them yourself",
                           param=f"tools.{i}.type")
        name, schema, description = tool.get("name"), tool.get("input_schema"), tool.get("description")
        if not isinstance(name, str):
            raise ApiError(400, f"tools[{i}].name must be a string", param=f"tools.{i}.name")
        if not isinstance(schema, Mapping):
            raise ApiError(400, f"tools[{i}].input_schema must be a JSON schema object",
                           param=f"tools.{i}.input_schema")
        if description is not None and not isinstance(description, str):
            raise ApiError(400, f"tools[{i}].description must be a string", param=f"tools.{i}.description")
        function = {"name": name, "parameters": dict(schema)} | ({"description": description} if description else {})
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> dict[str, Any]:
    """auto, any (a call is required), tool (that one), none; ``disable_parallel_tool_use``: one call at most."""
    kind = choice.get("type") if isinstance(choice, Mapping) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise ApiError(400, "tool_choice must be {\"type\": \"auto\"}, {\"type\": \"any\"}, {\"type\": \"tool\", "
                            "\"name\": …} or {\"type\": \"none\"}", param="tool_choice")
    out: dict[str, Any] = {"tool_choice": {"auto": "auto", "any": "required", "none": "none"}.get(kind)}
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise ApiError(400, "tool_choice {\"type\": \"tool\"} needs the name of the tool", param="tool_choice.name")
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    disable = choice.get("disable_parallel_tool_use")
    if disable is not None:
        if not isinstance(disable, bool):
            raise ApiError(400, "tool_choice.disable_parallel_tool_use must be true or false",
                           param="tool_choice.disable_parallel_tool_use")
        out["parallel_tool_calls"] = not disable
    return out


def _output_config(config: Any) -> dict[str, Any]:
    """``format``: a JSON schema the answer's text follows (OpenAI's response_format); ``effort`` asks for
    nothing here."""
    if not isinstance(config, Mapping):
        raise ApiError(400, "output_config must be an object", param="output_config")
    form = config.get("format")
    if form is None:
        return {}
    if not isinstance(form, Mapping) or form.get("type") != "json_schema" or not isinstance(form.get("schema"),
                                                                                          Mapping):
        raise ApiError(400, "output_config.format must be {\"type\": \"json_schema\", \"schema\": a JSON schema}",
                       param="output_config.format")
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": form["schema"]}}}


def _blamed(e: BodyError, where: list[str]) -> ApiError:
    """The reader's error, naming the Anthropic field: ``messages.N…`` is the Nth message sent to the reader (a
    system prompt and tool results make more of them than the body has)."""
    param, message = e.param, str(e)
    if param is None:
        return ApiError(400, message)
    parts = param.split(".")
    if param == "stop":  # the reader's words are OpenAI's (a string or a list); say Anthropic's
        return ApiError(400, f"stop_sequences must be a list of at most {STOPS_MAX} non-empty strings (this "
                             "server's limit)", param="stop_sequences")
    if parts[0] == "tools" and len(parts) == 2 and "function" in message:
        # the one thing of a tool built here that the reader can refuse as a tool's shape is its name
        # (structured/tools.py's read_tools: OpenAI's function names)
        return ApiError(400, f"tools[{parts[1]}].name must be 1 to 64 letters, digits, _ . or -",
                        param=f"tools.{parts[1]}.name")
    if parts[0] == "messages" and len(parts) > 1 and parts[1].isdigit():
        index = int(parts[1])
        mapped = where[index] if index < len(where) else "messages"
    else:
        mapped = next((anthropic + param[len(openai):] for openai, anthropic in PARAMS.items()
                       if param == openai or param.startswith(openai + ".")), param)
    if mapped != param:
        message = message.replace(f"a {param}", f"{param}").replace(param, _brackets(mapped))
    return ApiError(400, message, param=mapped)


def _brackets(param: str) -> str:
    """``messages.0.content.1`` as ``messages[0].content[1]``, as the messages say a place."""
    out = ""
    for part in param.split("."):
        out += f"[{part}]" if part.isdigit() else f".{part}" if out else part
    return out


# -- the answer: a Message, or its stream of events --


@dataclass
class MessageAnswer:
    """One Message being sent (serve/face.py's ``FaceAnswer``)."""

    model: str
    id: str = field(default_factory=lambda: "msg_" + uuid.uuid4().hex[:24])

    def whole(self, ended: Ended) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if ended.content:
            content.append({"type": "text", "text": ended.content})
        for call in ended.calls.calls if ended.calls is not None else ():
            f = call["function"]
            content.append({"type": "tool_use", "id": call["id"], "name": f["name"],
                            "input": json.loads(f["arguments"])})
        return self.message(content, STOP_REASONS.get(ended.reason, "end_turn"), usage(ended)) \
            | {"timings": timings(ended.stats, ended.reused, ended.drafters)}

    def message(self, content: list[dict[str, Any]], stop_reason: str | None, usage: dict[str, int]) -> dict[str, Any]:
        # stop_sequence: which one matched is not in the pieces (serve/pieces.py maps a stop sequence's end to "stop"
        # as it does the end of the turn), so it is never named
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": stop_reason, "stop_sequence": None, "usage": usage}

    async def stream(self, pieces: AsyncIterator[Piece], include_usage: bool) -> AsyncIterator[bytes]:
        """Anthropic's events: message_start; for each block content_block_start, its deltas (text_delta, or a
        tool_use's input_json_delta pieces), content_block_stop; message_delta (stop reason, usage); message_stop.
        The prompt's size is known only at the end: message_start says 0 input tokens, message_delta the count
        (Anthropic's SDK takes message_delta's usage over message_start's)."""
        yield event("message_start", {"message": self.message([], None, {"input_tokens": 0, "output_tokens": 0})})
        blocks = _Blocks()
        async for piece in pieces:
            if isinstance(piece, TextPiece):
                if piece.text:
                    for out in blocks.text(piece.text):
                        yield out
            elif isinstance(piece, CallPiece):
                for out in blocks.call(piece):
                    yield out
            elif isinstance(piece, Ended):
                for out in blocks.close():
                    yield out
                yield event("message_delta", {"delta": {"stop_reason": STOP_REASONS.get(piece.reason, "end_turn"),
                                                        "stop_sequence": None}, "usage": usage(piece),
                                              "timings": timings(piece.stats, piece.reused, piece.drafters)})
                yield event("message_stop", {})
            elif isinstance(piece, FailedPiece):
                yield self.failed(failure(piece))
                return

    def failed(self, error: ApiError) -> bytes:
        """An error after the stream began: Anthropic's error event, the stream's last."""
        return event("error", error_body(error))


@dataclass
class _Blocks:
    """The stream's content blocks: which is open, and each call's block (its arguments' pieces go there)."""

    count: int = 0
    open: str | None = None  # "text" or "tool_use"
    calls: dict[int, int] = field(default_factory=dict)  # a call's index → its block's

    def text(self, text: str) -> list[bytes]:
        out = [] if self.open == "text" else self.start({"type": "text", "text": ""})
        return out + [self.delta(self.count - 1, {"type": "text_delta", "text": text})]

    def call(self, piece: CallPiece) -> list[bytes]:
        out: list[bytes] = []
        if piece.name is not None:  # a call's first piece: its block opens with its id and name
            out += self.start({"type": "tool_use", "id": piece.id, "name": piece.name, "input": {}})
            self.calls[piece.index] = self.count - 1
        if piece.arguments:
            out.append(self.delta(self.calls[piece.index], {"type": "input_json_delta",
                                                            "partial_json": piece.arguments}))
        return out

    def start(self, block: dict[str, Any]) -> list[bytes]:
        out = self.close()
        self.open = block["type"]
        self.count += 1
        return out + [event("content_block_start", {"index": self.count - 1, "content_block": block})]

    def delta(self, index: int, delta: dict[str, Any]) -> bytes:
        return event("content_block_delta", {"index": index, "delta": delta})

    def close(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [event("content_block_stop", {"index": self.count - 1})]


def usage(ended: Ended) -> dict[str, int]:
    """Anthropic's counts: ``input_tokens`` are the prompt's tokens computed, ``cache_read_input_tokens`` those the
    prompt cache held (their sum is the prompt, as Anthropic adds them up); nothing is written to a cache at a cost."""
    return {"input_tokens": ended.stats.prompt_tokens - ended.reused, "output_tokens": ended.stats.generated_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": ended.reused}


def event(name: str, data: dict[str, Any]) -> bytes:
    """One server-sent event as Anthropic sends it: its name, and its data with the same ``type``."""
    return f"event: {name}\ndata: {json.dumps({'type': name, **data}, ensure_ascii=False)}\n\n".encode()
