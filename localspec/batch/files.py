"""`localspec batch` files: JSONL requests in, one JSON line per request out, and resuming a job half done.

Input lines are ``{"id", "prompt"}`` or ``{"id", "messages"}`` with optional max_tokens, temperature, top_p, seed,
stop; or OpenAI Batch API lines (``custom_id``, ``method: POST``, ``url`` /v1/chat/completions or /v1/completions,
``body``), which get OpenAI Batch output lines back. A line without an id is named by its line number ("line-7").

A bad line is not fatal: it becomes an error record and the job goes on; only ids used twice stop the job before
any work, since their results could not be told apart. Each output line is written with one write, flushed and
synced: a killed job leaves whole lines. Resuming skips the ids that succeeded and runs the failed ones again (their
old error records are dropped first, so a file never holds two lines for one id).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localspec.batch.request import Request
from localspec.batch.result import Result
from localspec.engine.chat import Message
from localspec.errors import UserError

ENDPOINTS = {"/v1/chat/completions": "openai-chat", "/v1/completions": "openai-completions"}
ROLES = ("system", "user", "assistant")
# OpenAI's finish reasons are stop and length: a full context is a length, an interrupted answer is not written
OPENAI_FINISH = {"stop": "stop", "length": "length", "context_full": "length"}


@dataclass(frozen=True, slots=True)
class LineError:
    """A line that cannot run, reported under its id (or "line-N")."""

    id: str
    line: int
    message: str
    style: str = "plain"


def read_requests(path: Path) -> tuple[list[Request], list[LineError]]:
    """Every line of ``path`` as a Request or a LineError, in file order; UserError for an unreadable file or an id
    used twice."""
    try:
        # utf-8-sig: Windows editors start a file with a byte-order mark, which is not part of line 1
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise UserError(f"no input file {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    requests: list[Request] = []
    errors: list[LineError] = []
    seen: dict[str, int] = {}
    for n, line in enumerate(jsonl_lines(text), 1):
        if not line.strip():
            continue
        got = parse_line(line, n)
        if got.id in seen:
            raise UserError(f"{path}: id {got.id!r} is on line {seen[got.id]} and line {n}: ids must be unique")
        seen[got.id] = n
        (requests if isinstance(got, Request) else errors).append(got)
    return requests, errors


def parse_line(line: str, n: int) -> Request | LineError:
    try:
        data = json.loads(line)
    except ValueError as e:
        return LineError(f"line-{n}", n, f"line {n} is not JSON ({e.msg})")
    if not isinstance(data, dict):
        return LineError(f"line-{n}", n, f"line {n} is not a JSON object")
    openai = "custom_id" in data or "body" in data
    key = "custom_id" if openai else "id"
    raw_id = data.get(key, f"line-{n}")
    name = raw_id if isinstance(raw_id, str) else json.dumps(raw_id)
    style = "plain"
    try:
        if openai:
            style = ENDPOINTS.get(str(data.get("url")), "openai-chat")
            return _openai(data, name, n)
        return _request(data, name, n, "plain")
    except (ValueError, TypeError, KeyError) as e:
        return LineError(name, n, f"line {n}: {e}", style)


def parse_mapping(data: Mapping[str, Any], name: str, n: int) -> Request:
    """A plain request given as a mapping (``generate_many``'s dicts): UserError where a line would get an error
    record."""
    try:
        return _request(data, name, n, "plain")
    except (ValueError, TypeError, KeyError) as e:
        raise UserError(f"prompt {name!r}: {e}") from None


def _openai(data: Mapping[str, Any], name: str, n: int) -> Request:
    if not isinstance(data.get("custom_id"), str) or not data["custom_id"]:
        raise ValueError("an OpenAI Batch line needs a custom_id string")
    if data.get("method", "POST") != "POST":
        raise ValueError(f"method must be POST, got {data.get('method')!r}")
    style = ENDPOINTS.get(str(data.get("url")))
    if style is None:
        raise ValueError(f"url must be one of {', '.join(ENDPOINTS)}, got {data.get('url')!r}")
    body = data.get("body")
    if not isinstance(body, dict):
        raise ValueError("body must be a JSON object")
    if style == "openai-chat" and "messages" not in body:
        raise ValueError("a /v1/chat/completions body needs messages")
    if style == "openai-completions" and "prompt" not in body:
        raise ValueError("a /v1/completions body needs a prompt")
    return _request(body, name, n, style)


def _request(data: Mapping[str, Any], name: str, n: int, style: str) -> Request:
    prompt, messages = data.get("prompt"), data.get("messages")
    if (prompt is None) == (messages is None):
        raise ValueError("give either a prompt or messages")
    if prompt is not None and not isinstance(prompt, str):
        raise ValueError("prompt must be a string")
    return Request(
        name, prompt=prompt, messages=None if messages is None else _messages(messages),
        max_tokens=_number(data, "max_tokens", int, lambda v: v >= 1, "at least 1"),
        temperature=_number(data, "temperature", float, lambda v: 0 <= v <= 5, "between 0 and 5"),
        top_p=_number(data, "top_p", float, lambda v: 0 < v <= 1, "in (0, 1]"),
        seed=_number(data, "seed", int, lambda v: v >= 0, "0 or more"),
        stop=_stop(data.get("stop")), style=style, line=n,
    )


def _messages(raw: Any) -> tuple[Message, ...]:
    if not isinstance(raw, list) or not raw:
        raise ValueError("messages must be a non-empty list")
    out = []
    for m in raw:
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ValueError(f"each message needs a role ({', '.join(ROLES)}) and content")
        content = m.get("content")
        if isinstance(content, list):  # OpenAI's content parts: the text ones, joined
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        if not isinstance(content, str):
            raise ValueError("a message's content must be a string")
        out.append(Message(m["role"], content))
    return tuple(out)


def _number(data: Mapping[str, Any], key: str, kind: type, ok: Any, rule: str) -> Any:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise ValueError(f"{key} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    if not ok(value):
        raise ValueError(f"{key} must be {rule}, got {value!r}")
    return kind(value)


def _stop(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise ValueError("stop must be a non-empty string or a list of them")
    return tuple(stops)


# -- output --


def record(result: Result, request: Request | LineError, model: str) -> dict[str, Any]:
    """The output line of one request: OpenAI Batch output for an OpenAI line, else localspec's own."""
    if request.style == "plain":
        if result.error is not None:
            return {"id": result.id, "error": result.error, "line": request.line}
        stats = result.stats.to_dict()
        stats.pop("accepted_by_position", None)  # per-position detail: run --json has it; here it bloats every line
        return {"id": result.id, "text": result.text, "tokens": len(result.tokens),
                "finish_reason": result.finish_reason, "stats": stats}
    line_id = f"batch_req_{result.id}"
    if result.error is not None:
        return {"id": line_id, "custom_id": result.id, "response": None,
                "error": {"code": "invalid_request", "message": result.error}}
    created = int(time.time())
    finish = OPENAI_FINISH.get(result.finish_reason, result.finish_reason)
    usage = {"prompt_tokens": result.stats.prompt_tokens, "completion_tokens": len(result.tokens),
             "total_tokens": result.stats.prompt_tokens + len(result.tokens)}
    if request.style == "openai-chat":
        body: dict[str, Any] = {"id": f"chatcmpl-{result.id}", "object": "chat.completion", "created": created,
                                "model": model, "choices": [{"index": 0, "finish_reason": finish, "message": {
                                    "role": "assistant", "content": result.text}}], "usage": usage}
    else:
        body = {"id": f"cmpl-{result.id}", "object": "text_completion", "created": created, "model": model,
                "choices": [{"index": 0, "text": result.text, "finish_reason": finish}], "usage": usage}
    return {"id": line_id, "custom_id": result.id,
            "response": {"status_code": 200, "request_id": line_id, "body": body}, "error": None}


def _failed(doc: Mapping[str, Any]) -> bool:
    return doc.get("error") is not None


def _id(doc: Mapping[str, Any]) -> str | None:
    value = doc.get("custom_id", doc.get("id"))
    return value if isinstance(value, str) else None


def done_ids(path: Path) -> set[str]:
    """The ids ``path`` holds successful results for. Before a resumed job appends, the file is rewritten without
    its error records (they run again) and without a torn last line, so it stays valid JSONL."""
    try:
        lines = jsonl_lines(path.read_text(encoding="utf-8"), keepends=True)
    except FileNotFoundError:
        return set()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {path} to resume it: {e}") from None
    keep: list[str] = []
    done: set[str] = set()
    for line in lines:
        try:
            doc = json.loads(line)
        except ValueError:
            continue  # a torn line: that request runs again
        if not line.endswith("\n") or not isinstance(doc, dict) or _id(doc) is None or _failed(doc):
            continue
        keep.append(line)
        done.add(str(_id(doc)))
    if len(keep) != len(lines):
        _replace(path, "".join(keep))
    return done


def jsonl_lines(text: str, keepends: bool = False) -> list[str]:
    r"""JSONL's lines: split at "\n" only (a CRLF line loses its "\r"). str.splitlines would also split at U+2028,
    U+2029 and U+0085, which JSON allows unescaped inside a string."""
    lines = text.split("\n")
    if keepends:
        return [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
    if lines and not lines[-1]:
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


# Written escaped all the same: tools that split lines as Python's splitlines does would read our output wrong
_LINE_BREAKS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})


def _replace(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class ResultWriter:
    """Appends one whole line per result: one write, flushed and synced."""

    def __init__(self, path: Path, model: str) -> None:
        self.model = model
        try:
            self._file = path.open("a", encoding="utf-8")
        except OSError as e:
            raise UserError(f"cannot write {path}: {e.strerror}") from None

    def write(self, result: Result, request: Request | LineError) -> None:
        line = json.dumps(record(result, request, self.model), ensure_ascii=False).translate(_LINE_BREAKS)
        self._file.write(line + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def write_error(self, error: LineError) -> None:
        self.write(Result(error.id, finish_reason="error", error=error.message), error)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
