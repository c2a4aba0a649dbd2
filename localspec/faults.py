"""A fault a test injects, to hold the promises about failures to a real pass (tests/test_isolation.py).

Inert unless ``LOCALSPEC_FAULT`` is set when localspec is imported: then a pass that holds a request whose text
contains that marker raises, as a failing llama_decode would. Never set it in use.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

MARKER = os.environ.get("LOCALSPEC_FAULT") or None
ARMED = MARKER is not None
_marked: set[tuple[int, ...]] = set()


class InjectedFault(RuntimeError):
    """The pass a test asked to fail."""


def mark(prompt: Sequence[int], text: str) -> None:
    """Remember ``prompt`` (a job's tokens) if its request's ``text`` holds the marker."""
    if MARKER is not None and MARKER in text:
        _marked.add(tuple(prompt))


def before_pass(prompts: Iterable[Sequence[int]]) -> None:
    """Raise if one of the pass's sequences is a marked request (once: it fails one pass)."""
    for prompt in prompts:
        key = tuple(prompt)
        if key in _marked:
            _marked.discard(key)
            raise InjectedFault(f"a fault injected into the pass (LOCALSPEC_FAULT={MARKER!r})")
