"""Admissions at once: a request's body read, its template rendered and its grammar compiled in a worker thread,
``n`` at a time, each given up after ``timeout`` seconds (docs/architecture.md, "Requests that cannot hurt each
other").

A compile that admission gives up on goes on in its thread (a thread cannot be stopped), and anyio frees its limiter
slot when it abandons it. So each admission is also counted by a semaphore held inside its thread until it really
ends: slow compiles cannot pile up past ``n``, and while abandoned ones still run, a new one waits for a slot (up to
its own timeout) instead of compiling beside them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.to_thread

T = TypeVar("T")


class Busy(Exception):
    """No admission could run within the timeout."""


class Admissions:
    def __init__(self, n: int, timeout: float) -> None:
        self.timeout = timeout
        self._limiter = anyio.CapacityLimiter(n)
        self._slots = threading.BoundedSemaphore(n)
        self._lock = threading.Lock()
        self.running = 0  # admissions whose threads have not ended, abandoned ones included

    async def run(self, admit: Callable[[], T]) -> T:
        """``admit()`` in a worker thread; Busy where it did not end within the timeout."""
        given_up = threading.Event()
        with anyio.move_on_after(self.timeout):
            return await anyio.to_thread.run_sync(lambda: self._counted(admit, given_up), limiter=self._limiter,
                                                  abandon_on_cancel=True)
        given_up.set()  # its request has its 503: a thread still waiting for a slot must not admit it after all
        raise Busy

    def _counted(self, admit: Callable[[], T], given_up: threading.Event) -> T:
        if not self._slots.acquire(timeout=self.timeout):  # abandoned admissions still running hold every slot
            raise Busy
        if given_up.is_set():
            self._slots.release()
            raise Busy
        with self._lock:
            self.running += 1
        try:
            return admit()
        finally:
            with self._lock:
                self.running -= 1
            self._slots.release()
