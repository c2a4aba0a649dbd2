"""How an answer's JSON is spaced: as the prompt's own JSON is written.

A grammar that forbids the token a model is sure of (`` "`` after ``{"city":``, where the prompt wrote
``{"a": 1}``) leaves sampling to choose among tokens the model never meant, and cuts the drafts that would have
copied the prompt. So the separators follow the prompt: compact (``","``, ``":"``) where its JSON is compact,
``json.dumps``' (``", "``, ``": "``) where it is spaced, and ``json.dumps``' where it holds no JSON (what small
chat models write unconstrained). Only the separators' own spaces, never free whitespace: a small model can loop
in whitespace that nothing bounds.

Pure: texts in, separators out. Only JSON that parses counts (a comma in prose is no vote), and the work is bounded
(a prompt of megabytes costs at most ``_MAX_CHARS`` read and ``_MAX_TRIES`` parse attempts).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

Separators = tuple[str, str]  # (item, key), as json.dumps' ``separators``
COMPACT: Separators = (",", ":")
SPACED: Separators = (", ", ": ")  # json.dumps' own
DEFAULT = SPACED  # where the prompt holds no JSON

_OPENER = re.compile(r"[{\[]")
_MAX_CHARS = 64 * 1024  # the first and last 32 KiB of a longer prompt: where examples and instructions sit
_MAX_TRIES = 64  # raw_decode attempts: each may read to the end of the text before it fails
_ENOUGH = 32  # separators seen: the style is clear


def json_options(separators: Separators) -> dict[str, Any]:
    """llguidance's JSON options for these separators (its ``defaults``; a schema's ``x-guidance`` goes over
    them). The separators are regexes there; both styles' are literal text."""
    return {"whitespace_flexible": False, "item_separator": separators[0], "key_separator": separators[1]}


def separators_of(texts: Iterable[str]) -> Separators:
    """The separators of the JSON in ``texts`` (a prompt, or a conversation's messages): each of item and key by
    the majority of its occurrences; where only one kind occurs the other follows it; no JSON: ``DEFAULT``.
    Pretty-printed JSON (a newline after a comma) votes for its key separator only."""
    text = "\n".join(texts)
    if len(text) > _MAX_CHARS:
        text = text[:_MAX_CHARS // 2] + "\n" + text[-_MAX_CHARS // 2:]
    votes = {"item": [0, 0], "key": [0, 0]}  # [compact, spaced]
    for span in _json_spans(text):
        for kind, spaced in _separators_in(span):
            votes[kind][spaced] += 1
        if sum(map(sum, votes.values())) >= _ENOUGH:
            break
    item, key = _choice(votes["item"]), _choice(votes["key"])
    item = item if item is not None else key
    key = key if key is not None else item
    if item is None or key is None:
        return DEFAULT
    return (SPACED if item else COMPACT)[0], (SPACED if key else COMPACT)[1]


def _choice(counts: list[int]) -> bool | None:
    """True: spaced, False: compact, None: no vote (a tie goes to the default)."""
    compact, spaced = counts
    if compact == spaced:
        return None if compact == 0 else DEFAULT == SPACED
    return spaced > compact


def _json_spans(text: str) -> Iterator[str]:
    """The texts of the JSON objects and arrays in ``text`` that parse and hold something, left to right."""
    decoder = json.JSONDecoder()
    at = 0
    for _ in range(_MAX_TRIES):
        found = _OPENER.search(text, at)
        if found is None:
            return
        start = found.start()
        try:
            value, end = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):  # not JSON, or nested past Python's stack (a hostile prompt)
            at = start + 1
            continue
        if value:
            yield text[start:end]
        at = end


def _separators_in(span: str) -> Iterator[tuple[str, bool]]:
    """("item" or "key", spaced?) for each separator outside strings in one JSON text: spaced where exactly one
    space follows it, compact where none; other whitespace (a newline, two spaces) is no vote."""
    in_string = escaped = False
    for i, c in enumerate(span):
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in ",:":
            after = span[i + 1:i + 3]
            kind = "item" if c == "," else "key"
            if after[:1] not in " \n\r\t":
                yield kind, False
            elif after[:1] == " " and after[1:2] not in " \n\r\t":
                yield kind, True
