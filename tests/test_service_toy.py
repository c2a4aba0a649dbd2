"""The server's Service on the toy model, without HTTP: every request gets all its events, in order, while the worker
wakes the handlers' event loop once a pass for all of them (not once per event)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from localspec.drafters.ngram import NgramDrafter
from localspec.events import Event, Finished, Prefill, Step
from localspec.serve.service import Service, Ticket, _put_all
from localspec.settings import GenerationSettings, SamplingSettings
from localspec.speculative.costs import PassCosts
from localspec.speculative.jobs import Failed, Job
from localspec.speculative.loop import Generator, Target
from localspec.speculative.policy import DraftPolicy
from localspec.worker import Worker
from tests.toy import ToyContext, ToyLanes, ToyModel

TARGET = ToyModel(seed=1)
PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7], [1, 2, 3, 4], [10, 11, 10, 11, 10, 11, 12], [42], [7, 7, 7, 7, 7, 7, 7],
           [3, 9, 27, 3, 9, 27, 3, 9]]
CURVE = {n: 1e-3 * (1 + 0.3 * (n - 1)) for n in range(1, 65)}  # drafts pay: steps of several tokens, and rejections
MAX_TOKENS = 40


def _generator(target: Target) -> Generator:
    return Generator(target, TARGET, [NgramDrafter()], SamplingSettings(),  # type: ignore[arg-type]
                     DraftPolicy(k_max=8, costs=PassCosts(dict(CURVE))))


def _alone(prompt: list[int]) -> list[int]:
    """The greedy text of ``prompt`` generated alone: on the toy model a batch's text is exactly this."""
    events = _generator(ToyContext(TARGET)).generate(prompt, GenerationSettings(max_tokens=MAX_TOKENS))
    return [t.id for e in events if isinstance(e, Step) for t in e.emitted]


def _service() -> Service:
    costs = PassCosts(dict(CURVE))
    rt = SimpleNamespace(lanes=ToyLanes(TARGET, 4), costs=costs, parallel=4, shapes=None, drafts=None, history=None,
                         say=lambda text: None, close=lambda: None,
                         make_generator=lambda target, job: _generator(target))
    return Service(rt, Worker("test-service"))  # type: ignore[arg-type]


def test_every_request_gets_all_its_events_in_order_and_a_pass_wakes_the_loop_once() -> None:
    service = _service()
    wakeups: list[Callable[..., Any]] = []

    async def main() -> list[list[Event | Failed]]:
        loop = asyncio.get_running_loop()
        call_soon_threadsafe = loop.call_soon_threadsafe

        def counted(callback: Callable[..., Any], *args: Any) -> asyncio.Handle:
            wakeups.append(callback)
            return call_soon_threadsafe(callback, *args)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
        # more requests than lanes: some wait, and join passes that others are halfway through
        tickets = [service.submit(Job(prompt, GenerationSettings(max_tokens=MAX_TOKENS))) for prompt in PROMPTS]
        service.start()

        async def events_of(ticket: Ticket) -> list[Event | Failed]:
            out: list[Event | Failed] = []
            while not out or not isinstance(out[-1], Finished | Failed):
                out.append(await asyncio.wait_for(ticket.events.get(), 30))
            return out

        return await asyncio.gather(*(events_of(t) for t in tickets))

    try:
        answers = asyncio.run(main())
    finally:
        service.close()
    for prompt, events in zip(PROMPTS, answers, strict=True):
        assert isinstance(events[0], Prefill), events[0]
        steps = events[1:-1]
        assert all(isinstance(e, Step) for e in steps)
        end = events[-1]
        assert isinstance(end, Finished), end
        # all of them: as many steps as its passes, as many tokens as it generated; in order: its text is its own
        assert len(steps) == end.stats.target_passes
        assert [t.id for s in steps for t in s.emitted] == _alone(prompt)  # type: ignore[union-attr]
        assert end.stats.generated_tokens == MAX_TOKENS
    delivered = sum(map(len, answers))
    batches = wakeups.count(_put_all)
    # one wake-up a pass at most (plus the last flush), not one an event: the events outnumber them many times
    assert 0 < batches <= service.passes.passes + 1 < delivered / 2, (batches, service.passes.passes, delivered)
    assert len(wakeups) == batches + len(PROMPTS)  # the rest: each request's admission


def test_events_for_a_loop_that_has_closed_mark_their_requests_gone() -> None:
    service = _service()
    closed = asyncio.new_event_loop()
    closed.close()
    ticket = Ticket(Job([1, 2]), closed)
    service._outbox.append((ticket, Prefill(2, 2, 0.0)))
    service._flush()
    assert ticket.gone.is_set() and not service._outbox
    service.worker.shutdown()


@pytest.mark.parametrize("n", [1, 3])
def test_a_batch_keeps_each_requests_order(n: int) -> None:
    """``_put_all`` on the loop: every event into its own request's queue, in the order gathered."""
    async def main() -> list[list[object]]:
        loop = asyncio.get_running_loop()
        tickets = [Ticket(Job([1]), loop) for _ in range(n)]
        batch = [(tickets[i % n], Prefill(i, i, 0.0)) for i in range(3 * n)]
        _put_all(batch)  # type: ignore[arg-type]
        return [[t.events.get_nowait() for _ in range(3)] for t in tickets]

    got = asyncio.run(main())
    for j, events in enumerate(got):
        assert [e.prompt_tokens for e in events] == [j, j + n, j + 2 * n]  # type: ignore[attr-defined]
