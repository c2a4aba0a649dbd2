"""`localspec batch` files: JSONL requests in, one JSON line per request out, and resuming a job half done.

Input lines are ``{"id", "prompt"}`` or ``{"id", "messages"}`` with the settings of an OpenAI body (max_tokens,
temperature, top_p, seed, stop, ...: localspec/openai_body.py reads them, as serve does); or OpenAI Batch API lines
(``custom_id``, ``method: POST``, ``url`` /v1/chat/completions or /v1/completions, ``body``), which get OpenAI Batch
output lines back. A line without an id (or with ``"id": null``) is named by its line number ("line-7").

A bad line is not fatal: it becomes an error record and the job goes on; only ids used twice stop the job before
any work, since their results could not be told apart. Each output line is written with one write, flushed and
synced: a killed job leaves whole lines. Resuming skips the ids that succeeded and runs the failed ones again (their
old error records are dropped first, so a file never holds two lines for one id).
"""

from __future__ import annotations

import io
import json
import os
import stat
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localspec.batch.result import Result
from localspec.errors import UserError
from localspec.finish_reasons import openai_reason
from localspec.openai_body import BodyError, loads, lone_surrogate, parse_body
from localspec.request import Request

ENDPOINTS = {"/v1/chat/completions": "openai-chat", "/v1/completions": "openai-completions"}


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
    """One input line: a plain line is an OpenAI body beside its ``id``, an OpenAI Batch line wraps one; both are
    read by the one reader serve uses (localspec/openai_body.py)."""
    try:
        data = loads(line)
    except ValueError as e:
        return LineError(f"line-{n}", n, f"line {n} is not JSON ({getattr(e, 'msg', e)})")
    if not isinstance(data, dict):
        return LineError(f"line-{n}", n, f"line {n} is not a JSON object")
    openai = "custom_id" in data or "body" in data
    style = ENDPOINTS.get(str(data.get("url")), "openai-chat") if openai else "plain"
    name = line_name(data.get("custom_id" if openai else "id"), n)
    if lone_surrogate(name) is not None:  # its error record could not be written under it
        return LineError(f"line-{n}", n, f"line {n}: its id holds a lone surrogate: not valid Unicode", style)
    try:
        if openai:
            return _openai(data, name, n)
        return parse_body(data, None, name, line=n).request
    except BodyError as e:
        return LineError(name, n, f"line {n}: {e}", style)


def line_name(raw: Any, n: int) -> str:
    """What a line's results are filed under: its id (a number as written), or "line-N" where it has none."""
    if raw is None:
        return f"line-{n}"
    return raw if isinstance(raw, str) else json.dumps(raw)


def _openai(data: Mapping[str, Any], name: str, n: int) -> Request:
    if not isinstance(data.get("custom_id"), str) or not data["custom_id"]:
        raise BodyError("custom_id", "an OpenAI Batch line needs a custom_id string")
    if data.get("method", "POST") != "POST":
        raise BodyError("method", f"method must be POST, got {data.get('method')!r}")
    style = ENDPOINTS.get(str(data.get("url")))
    if style is None:
        raise BodyError("url", f"url must be one of {', '.join(ENDPOINTS)}, got {data.get('url')!r}")
    body = data.get("body")
    if not isinstance(body, dict):
        raise BodyError("body", "body must be a JSON object")
    return parse_body(body, "chat" if style == "openai-chat" else "completion", name, style=style, line=n).request


# -- output --


def record(result: Result, request: Request | LineError, model: str) -> dict[str, Any]:
    """The output line of one request: OpenAI Batch output for an OpenAI line, else localspec's own."""
    if request.style == "plain":
        if result.error is not None:
            return {"id": result.id, "error": result.error, "line": request.line}
        stats = result.stats.to_dict()
        stats.pop("accepted_by_position", None)  # per-position detail: run --json has it; here it bloats every line
        return {"id": result.id, "text": result.text, "tokens": len(result.tokens),
                "finish_reason": result.finish_reason, "stats": stats,
                **({"tool_calls": result.tool_calls} if result.tool_calls else {})}
    line_id = f"batch_req_{result.id}"
    if result.error is not None:
        return {"id": line_id, "custom_id": result.id, "response": None,
                "error": {"code": "invalid_request", "message": result.error}}
    created = int(time.time())
    finish = openai_reason(result.finish_reason)
    usage = {"prompt_tokens": result.stats.prompt_tokens, "completion_tokens": len(result.tokens),
             "total_tokens": result.stats.prompt_tokens + len(result.tokens),
             "completion_tokens_details": {"reasoning_tokens": 0, **result.stats.prediction_usage()}}
    if request.style == "openai-chat":
        body: dict[str, Any] = {"id": f"chatcmpl-{result.id}", "object": "chat.completion", "created": created,
                                "model": model, "choices": [{"index": 0, "finish_reason": finish, "message": {
                                    "role": "assistant", "content": result.text or None if result.tool_calls
                                    else result.text, **({"tool_calls": result.tool_calls} if result.tool_calls
                                                         else {})}}], "usage": usage}
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
            doc = loads(line)
        except ValueError:
            continue  # a torn line: that request runs again
        if not line.endswith("\n") or not isinstance(doc, dict) or _id(doc) is None or _failed(doc):
            continue
        keep.append(line)
        done.add(str(_id(doc)))
    if len(keep) != len(lines):
        _replace(path, "".join(keep))
    return done


def done_texts(path: Path) -> dict[str, str]:
    """The text of each successful result ``path`` holds (after ``done_ids`` tidied it): what a resumed job's
    history learns from before it goes on. Lines it cannot read give nothing (they were never drafts' business)."""
    out: dict[str, str] = {}
    try:
        lines = jsonl_lines(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return out
    for line in lines:
        try:
            doc = loads(line)
            ident = _id(doc)
            text = doc.get("text")
            if text is None:  # an OpenAI Batch output line
                choice = doc["response"]["body"]["choices"][0]
                text = choice["message"]["content"] if "message" in choice else choice["text"]
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            continue
        if ident is not None and isinstance(text, str):
            out[ident] = text
    return out


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
    """``text`` as the whole of ``path``, swapped in at once; the file keeps its mode (a temporary file is 600),
    and a symbolic link keeps pointing at it."""
    path = path.resolve()
    mode = stat.S_IMODE(path.stat().st_mode)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def is_stream(path: Path) -> bool:
    """``-`` (stdout), or an output that is not a regular file: a pipe (``-o /dev/stdout | cat``), a terminal, a
    FIFO. A stream is written and never read back (reading the pipe we write would wait forever), so a job written
    to one cannot be resumed."""
    if str(path) == "-":
        return True
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return False
    except OSError as e:
        raise UserError(f"cannot use {path} for the results: {e.strerror}") from None
    if stat.S_ISDIR(mode):
        raise UserError(f"{path} is a folder: give -o the name of a file for the results")
    return not stat.S_ISREG(mode)


class ResultWriter:
    """Appends one whole line per result: one write, flushed, and synced where it is a file. ``-``: stdout."""

    def __init__(self, path: Path, model: str) -> None:
        self.model = model
        self._owned = str(path) != "-"
        try:
            self._file = path.open("a", encoding="utf-8") if self._owned else sys.stdout
        except OSError as e:
            raise UserError(f"cannot write {path}: {e.strerror}") from None
        try:
            self._sync = stat.S_ISREG(os.fstat(self._file.fileno()).st_mode)  # fsync on a pipe is EINVAL
        except (OSError, ValueError, io.UnsupportedOperation):  # a stdout that is no file at all
            self._sync = False

    def write(self, result: Result, request: Request | LineError) -> None:
        line = json.dumps(record(result, request, self.model), ensure_ascii=False).translate(_LINE_BREAKS)
        self._file.write(line + "\n")
        self._file.flush()
        if self._sync:
            os.fsync(self._file.fileno())

    def write_error(self, error: LineError) -> None:
        self.write(Result(error.id, finish_reason="error", error=error.message), error)

    def close(self) -> None:
        if self._owned:
            self._file.close()

    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
