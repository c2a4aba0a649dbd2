"""Generated tokens → displayable text: whole UTF-8 characters only, and never a piece of a stop string."""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Protocol


class Pieces(Protocol):
    def piece(self, token: int) -> bytes: ...


class TextStream:
    """Releases text token by token, holding back what might still turn out to be the start of a stop string."""

    def __init__(self, vocab: Pieces, stops: Sequence[str] = ()) -> None:
        self._vocab = vocab
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = tuple(stops)
        self._held = ""

    def feed(self, token: int) -> tuple[str, bool]:
        """Text safe to show after ``token``, and whether a stop string was reached (text before it only)."""
        pending = self._held + self._decoder.decode(self._vocab.piece(token))
        if not self._stops:
            return pending, False
        hits = [i for i in (pending.find(s) for s in self._stops) if i >= 0]
        if hits:
            self._held = ""
            return pending[: min(hits)], True
        hold = self._longest_stop_prefix_suffix(pending)
        self._held = pending[len(pending) - hold :] if hold else ""
        return pending[: len(pending) - hold], False

    def _longest_stop_prefix_suffix(self, text: str) -> int:
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:n]):
                    best = n
                    break
        return best

    def flush(self) -> str:
        """What is still held back when generation ends without reaching a stop string."""
        rest, self._held = self._held + self._decoder.decode(b"", final=True), ""
        return rest
