"""A least-recently-used cache bounded by count and by bytes, safe across threads: what a server keeps of
compiled grammars must not grow with what its clients send (a 64 KiB schema a request, for days)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class BoundedCache(Generic[K, V]):
    """At most ``max_items`` entries and ``max_bytes`` of them as ``size(key, value)`` counts; the least recently
    used go first. An entry larger than ``max_bytes`` alone is not kept."""

    def __init__(self, max_items: int, max_bytes: int | None = None,
                 size: Callable[[K, V], int] = lambda key, value: 0) -> None:
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._size = size
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: K, value: V) -> None:
        n = self._size(key, value)
        if self.max_bytes is not None and n > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._entries[key] = (value, n)
            self._bytes += n
            while len(self._entries) > self.max_items or (self.max_bytes is not None and self._bytes > self.max_bytes):
                _, (_, dropped) = self._entries.popitem(last=False)
                self._bytes -= dropped

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        return self._bytes
