"""Where a value sits in a hand-written TOML file, for ``file:line:`` error messages (tomllib gives none)."""

from __future__ import annotations

import re
from pathlib import Path


def line_from_message(message: str, text: str) -> int | str:
    """The line a TOMLDecodeError names."""
    # Python < 3.14: the position is only in the message, "(at line L, column C)" or "(at end of document)".
    m = re.search(r"at line (\d+)", message)
    if m:
        return int(m.group(1))
    if "end of document" in message:
        return max(1, len(text.rstrip().splitlines()))
    return "?"


class Locator:
    """Finds the line of a table header (``[models.x]``, ``[models."x"]``) or of a key inside it.

    tomllib gives line numbers only for syntax errors; for "this value is wrong" we scan the text ourselves.
    Good enough for hand-written files: inline tables and dotted keys fall back to the table's header line.
    """

    _HEADER = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")

    def __init__(self, path: Path, lines: list[str]) -> None:
        self.path = path
        self.lines = lines

    def at(self, *table_then_key: str, key: str | None = None) -> str:
        parts = list(table_then_key)
        if key is None and len(parts) == 3:
            key = parts.pop()
        line = self._find(tuple(parts), key)
        return f"{self.path}:{line}" if line else str(self.path)

    def _find(self, table: tuple[str, ...], key: str | None) -> int | None:
        current: tuple[str, ...] = ()
        header_line = None
        for i, raw in enumerate(self.lines, start=1):
            m = self._HEADER.match(raw)
            if m:
                current = split_dotted(m.group(1))
                if current == table:
                    header_line = i
                    if key is None:
                        return i
                continue
            if key is not None and current == table:
                km = re.match(r"^\s*(\"[^\"]*\"|'[^']*'|[A-Za-z0-9_-]+)\s*=", raw)
                if km and km.group(1).strip("\"'") == key:
                    return i
        return header_line


def split_dotted(header: str) -> tuple[str, ...]:
    parts = re.findall(r'"([^"]*)"|\'([^\']*)\'|([^.\s"\']+)', header)
    return tuple(a or b or c for a, b, c in parts)
