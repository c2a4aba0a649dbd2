"""The one thread that makes every llama.cpp call of a face (the chat's engine, the server's scheduler).

A second calling thread would start a second OpenMP team in the process, and the two slow each other down (and a
context must be decoded from the thread that made it: engine.Context checks). So each face hands its llama.cpp work
to a Worker and hears back through its own callbacks; the worker knows nothing of Textual or HTTP.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class Worker:
    """A single long-lived thread running what is submitted to it, in order; ``stop_requested`` is the stop flag
    the work it runs checks between passes."""

    def __init__(self, name: str = "localspec-engine") -> None:
        # a thread pool of one, not a bare Thread: futures carry results and exceptions back to the caller
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self.stop_requested = threading.Event()

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``fn`` on the worker thread; returns at once."""
        return self._executor.submit(fn, *args)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn`` on the worker thread and wait for its result (or its exception)."""
        return self.submit(fn, *args).result()

    def shutdown(self, wait: bool = False) -> None:
        self.stop_requested.set()
        self._executor.shutdown(wait=wait)
