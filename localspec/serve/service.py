"""Between the HTTP handlers (asyncio) and the scheduler (the worker thread): a queue of requests, and each
request's events carried back to its handler.

Every request is a job of one Scheduler.run that never ends while the server is up: the queue hands it jobs as lanes
free up and "none yet" otherwise (the scheduler then waits in ``JobQueue.wait``). A request that waits longer than
the queue timeout is taken back out (503); a client that goes away sets its ticket's ``gone``, and the scheduler
ends that sequence before its next pass.

Events go to the handlers a pass at a time: the worker gathers a pass's events and wakes each handler's event loop
once for all of them (``Service._flush``), not once per event of every request.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from localspec.errors import STOPPING
from localspec.events import Event, Finished, Prefill, Step
from localspec.opening import save_history
from localspec.runtime import BatchRuntime
from localspec.serve.metrics import Metrics
from localspec.speculative.jobs import Failed, Job, PassStats
from localspec.speculative.scheduler import Scheduler
from localspec.worker import Worker

log = logging.getLogger("localspec.serve")


@dataclass(eq=False)
class Ticket:
    """One request on its way through the scheduler. The worker thread delivers; the handler's loop receives."""

    job: Job
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[Event | Failed] = field(default_factory=asyncio.Queue)
    admitted: asyncio.Event = field(default_factory=asyncio.Event)
    gone: threading.Event = field(default_factory=threading.Event)
    drafters: Counter[str] = field(default_factory=Counter)  # draft tokens by drafter, for the response's timings
    deadline: float | None = None  # time.monotonic() past which it stops (the server's --request-timeout)

    def stopped(self) -> bool:
        """Whether nobody wants the rest: its client went away, or its time is up."""
        return self.gone.is_set() or self.expired()

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline


    def deliver(self, event: Event | Failed) -> None:
        """One event at once (a failure outside the passes); a pass's events go together (``Service._flush``)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the handler's loop has closed: nobody is listening any more
            self.gone.set()

    def admit(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self.admitted.set)
        except RuntimeError:
            self.gone.set()


def _put_all(batch: list[tuple[Ticket, Event | Failed]]) -> None:
    """On a handler's event loop: a pass's events into their requests' queues, in order."""
    for ticket, event in batch:
        ticket.events.put_nowait(event)


class JobQueue:
    """Requests waiting for a lane, in arrival order. ``jobs()`` is the scheduler's endless job source."""

    def __init__(self) -> None:
        self._waiting: deque[Ticket] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self.running: set[Ticket] = set()  # taken by the scheduler, not finished

    def __len__(self) -> int:
        return len(self._waiting)

    def put(self, ticket: Ticket) -> None:
        with self._cond:
            self._waiting.append(ticket)
            self._cond.notify()

    def withdraw(self, ticket: Ticket) -> bool:
        """Take a waiting request back out (it timed out, or its client left); False if a lane already took it."""
        with self._cond:
            try:
                self._waiting.remove(ticket)
            except ValueError:
                return False
            return True

    def jobs(self) -> Iterator[Job | None]:
        while True:
            with self._cond:
                if self._closed:
                    return
                ticket = self._waiting.popleft() if self._waiting else None
                if ticket is not None:
                    self.running.add(ticket)
            if ticket is None:
                yield None
            else:
                ticket.admit()
                yield ticket.job

    def wait(self, timeout: float = 0.5) -> None:
        """The scheduler has nothing to run: block until a request comes (or a while, to notice a close)."""
        with self._cond:
            if not self._waiting and not self._closed:
                self._cond.wait(timeout)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class Service:
    """The runtime, its worker thread and the queue; ``start`` runs the scheduler until ``close``."""

    def __init__(self, rt: BatchRuntime, worker: Worker, metrics: Metrics | None = None) -> None:
        self.rt = rt
        self.worker = worker
        self.metrics = metrics or Metrics()
        self.queue = JobQueue()
        self.passes = PassStats()
        self.dead: str | None = None  # why the worker's loop ended while the server was up (/health says it)
        self._logged: Failed | None = None  # the last failure logged
        # the events gathered since the last flush, in the order the scheduler gave them (the worker thread's only)
        self._outbox: list[tuple[Ticket, Event | Failed]] = []

    def start(self) -> None:
        self.worker.submit(self._serve)

    def submit(self, job: Job, deadline: float | None = None) -> Ticket:
        """Queue ``job`` (its ``key`` and ``stop`` are set here); call from the handler's event loop."""
        ticket = Ticket(job, asyncio.get_running_loop(), deadline=deadline)
        job.key = ticket
        job.stop = ticket.stopped
        self.queue.put(ticket)
        return ticket

    def busy(self) -> int:
        return len(self.queue.running)

    def _serve(self) -> None:
        """The worker thread's loop: one scheduler run for the server's life; restarted after an error."""
        try:
            self._schedule()
        except BaseException as e:  # not even a restart could go on: /health says so from now on
            self.dead = f"the worker stopped: {type(e).__name__}: {' '.join(str(e).split())[:300]}"
            log.error("%s", self.dead)
            raise
        if not self.worker.stop_requested.is_set():
            self.dead = "the worker stopped"

    def _schedule(self) -> None:
        while not self.worker.stop_requested.is_set():
            scheduler = Scheduler(self.rt.lanes, self.rt.make_generator, self.rt.costs, parallel=self.rt.parallel,
                                  stats=self.passes, shapes=self.rt.shapes, drafts=self.rt.drafts)
            try:
                for job, event in scheduler.run(self.queue.jobs(), self.worker.stop_requested.is_set,
                                                idle=self._idle, flush=self._flush):
                    self._deliver(job, event)
                return
            except STOPPING:
                raise
            except BaseException as e:
                # the scheduler's own failure, outside any request's steps and the shared pass (those it ends
                # itself, and goes on): each running request gets that error, and the server starts a new one
                failed = Failed.of(e, shared=True)
                log.error("%s", failed.message)
                log.debug("the scheduler failed", exc_info=True)
                self._flush()  # what came before the failure, before it
                for ticket in list(self.queue.running):
                    ticket.deliver(failed)
                self.queue.running.clear()
                scheduler.empty_lanes()
            finally:
                self._flush()  # the last pass's events (the scheduler's end, or a stop)

    def _idle(self) -> None:
        self._flush()
        self.queue.wait()
        self._save_if_due()

    def _flush(self) -> None:
        """Hand the gathered events to their handlers: one call per event loop (a server has one) for all of them,
        each request's in order. A loop that has closed has nobody listening: its requests are gone."""
        outbox, self._outbox = self._outbox, []
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Ticket, Event | Failed]]] = {}
        for ticket, event in outbox:
            by_loop.setdefault(ticket.loop, []).append((ticket, event))
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, batch)
            except RuntimeError:
                for ticket, _ in batch:
                    ticket.gone.set()

    def _save_if_due(self) -> None:
        """With --keep-history, save as the server goes (every few dozen requests, or a minute after one), not only
        at the end: a crash or a kill loses no more than that. On the worker thread, between passes: the drafters
        read the history there, never while a save replaces it."""
        history = self.rt.history
        if history is not None and history.due():
            self._flush()  # a save takes a while: the events so far do not wait for it
            save_history(history, self.rt.say)

    def _deliver(self, job: Job, event: Event | Failed) -> None:
        ticket = job.key
        assert isinstance(ticket, Ticket)
        metrics = self.metrics
        if isinstance(event, Step):
            metrics.step(event)
            if event.k:
                ticket.drafters[event.drafter] += event.k
            metrics.passes = self.passes.passes
        elif isinstance(event, Prefill):
            metrics.prefill(event.prompt_tokens, event.prompt_tokens - event.new_tokens)
        elif isinstance(event, Finished | Failed):
            if isinstance(event, Finished) and event.reason == "interrupted" and ticket.expired():
                event = replace(event, reason="length")  # stopped by its deadline: cut short, as by a token limit
            self.queue.running.discard(ticket)
            metrics.end(event.reason if isinstance(event, Finished) else "error")
            # the server's own failures, one line each (a shared pass's one Failed reaches all its requests)
            if isinstance(event, Failed) and event.status >= 500 and event is not self._logged:
                self._logged = event
                log.error("%s", event.message)
        self._outbox.append((ticket, event))  # handed on with the rest of its pass's (_flush)
        if isinstance(event, Finished):
            self._save_if_due()

    def close(self, timeout: float = 30) -> None:
        """Stop the scheduler (running requests end "interrupted"), then close the model on the worker thread."""
        self.worker.stop_requested.set()
        self.queue.close()
        try:
            self.worker.submit(self.rt.close).result(timeout)
        except Exception as e:  # closing is best effort: the process is ending
            log.error("closing the model failed: %s: %s", type(e).__name__, e)
        self.worker.shutdown(wait=False)
