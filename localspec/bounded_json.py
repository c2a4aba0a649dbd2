"""JSON read with one rule for every reader: a request body, a batch line, an earlier call's arguments, a schema
given as text, a model's own answer.

Python's parser and the recursive walkers behind it (a schema's defaults and number bounds, the calls' key order)
fail with RecursionError, which is no ValueError, on nesting a few thousand levels deep: one line of
``"[" * 5000`` ended a whole batch job with a traceback. So nesting past ``DEPTH_MAX`` is bad JSON like any other,
said where it is read, and nothing deeper ever reaches a walker. No real body comes near it: a chat body with tools
nests about 10 levels, a deep JSON schema 20.
"""

from __future__ import annotations

import json
from typing import Any

DEPTH_MAX = 64


def loads(text: str | bytes) -> Any:
    """``text`` as JSON; ValueError where it is not JSON or nests deeper than ``DEPTH_MAX``."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError("it is nested too deeply") from None
    if depth_over(value, DEPTH_MAX):
        raise ValueError(f"it nests deeper than {DEPTH_MAX} levels")
    return value


def loads_or_none(text: str) -> Any:
    """``text`` as JSON, or None where it is not (bad, or too deep): for text that may or may not be JSON."""
    try:
        return loads(text)
    except ValueError:  # UnicodeDecodeError among them
        return None


def depth_over(value: Any, limit: int) -> bool:
    """Whether ``value``'s lists and objects nest deeper than ``limit``; iterative, so any depth can be asked."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list | tuple))
    return False
