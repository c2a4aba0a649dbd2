"""Which answers are tool calls: one rule for the grammar that holds a call (structured/tools.py), the constraint
that starts it (structured/constraint.py), the reader that reads calls back (``read_calls``) and the stream that
holds back only what may still become one (structured/call_watch.py). docs/architecture.md, "Agents as the judge".

A model calls a tool in its own habit:
- its template's marker, ``<tool_call>`` (Qwen2.5's), anywhere in the answer;
- at the answer's start (after at most ``LEAD`` whitespace characters): a JSON object naming an offered tool, bare,
  in one more pair of braces (the doubled braces of the Qwen2.5-Coder GGUF's own template example), or a list of
  them (several calls), each alone or alone in one ``` fence.

A start counts once it names an offered tool whole: ``{"name": "get_weather"`` with its closing quote (a longer name
may share the prefix). JSON that names no tool is never a call, nor is JSON after prose: a fenced example the user
asked for stays text (docs/structured.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

from localspec.bounded_json import loads_or_none

LEAD = 16  # whitespace characters an answer may start with before its call
FENCES = ("```json\n", "```\n", "")
BARE, DOUBLED, LIST = "", "{", "["  # what wraps the call object: nothing, one more pair of braces, a list
CLOSERS = {BARE: "", DOUBLED: "}", LIST: "]"}
# anchored triggers in a ConstraintSpec: this prefix, then the literal text the answer starts with
ANCHORED = "^"
_LEAD_CHARS = " \t\r\n"


def heads(names: Iterable[str], key_separator: str, parallel: bool) -> tuple[str, ...]:
    """Every text that starts a call at the answer's start, up to the tool's name and its closing quote."""
    wraps = (BARE, DOUBLED, LIST) if parallel else (BARE, DOUBLED)
    return tuple(f'{fence}{wrap}{{"name"{key_separator}"{name}"' for fence in FENCES for wrap in wraps
                 for name in names)


def lark_forms(call: str, item_separator: str, parallel: bool) -> str:
    """Lark rules ``anchored`` (the forms above, from the answer's first byte) and ``lead``, over a rule ``call``
    (one call object): ``call`` is the name of that rule."""
    sep = json.dumps(item_separator)
    listed = f' | "[" {call} ({sep} {call})* "]"' if parallel else ""
    return (f'anchored: bare | "```" "json"? "\\n" bare "\\n"? "```"\n'
            f'bare: {call} | "{{" {call} "}}"{listed}\n'
            f"lead: /[ \\t\\r\\n]{{1,{LEAD}}}/")


def strip_lead(text: str) -> tuple[int, str] | None:
    """Where the answer's text begins after its lead whitespace, and that text; None past ``LEAD`` characters."""
    body = text.lstrip(_LEAD_CHARS)
    at = len(text) - len(body)
    return None if at > LEAD else (at, body)


def anchored_start(text: str, starts: tuple[str, ...]) -> bool | None:
    """True: ``text`` (an answer so far) starts with one of ``starts``; None: it may still (it is a prefix of
    one); False: it never will."""
    lead = strip_lead(text)
    if lead is None:
        return False
    body = lead[1]
    maybe = False
    for head in starts:
        if body.startswith(head):
            return True
        maybe = maybe or head.startswith(body)
    return None if maybe else False


def whole_answer_json(text: str) -> Any:
    """An answer that is only JSON, in the call forms: bare, doubled (its inner object), or alone in one fence;
    None if it is not (or does not parse)."""
    m = re.fullmatch(r"\s*```(?:json)?\s*(.*?)\s*(?:```\s*)?", text, re.S)
    inner = (m.group(1) if m else text).strip()
    if not inner.startswith(("{", "[")):
        return None
    value = _loads(inner)
    if value is None and inner.startswith("{{") and inner.endswith("}}"):  # doubled braces: the call inside
        value = _loads(inner[1:-1])
    return value


def marked_blocks(text: str, marker: str, closer: str) -> Iterator[tuple[int, Any]]:
    """(where, the JSON inside) of each marked call: ``marker`` … ``closer`` (or a fence, or the end: the reader
    takes either closer)."""
    pattern = re.escape(marker) + r"(.*?)(?:" + re.escape(closer) + r"|```|$)"
    for m in re.finditer(pattern, text, re.S):
        inner = m.group(1).strip()
        value = _loads(inner)
        if value is None and inner.startswith("{{") and inner.endswith("}}"):
            value = _loads(inner[1:-1])
        yield m.start(), value


def _loads(text: str) -> Any:
    return loads_or_none(text)
