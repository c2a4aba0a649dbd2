"""What the server has done, as Prometheus text (``GET /metrics``): counters the worker and the handlers add to."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from localspec.events import Step


@dataclass
class Metrics:
    """Counters since the server started; ``queued`` and ``busy`` are read live when rendered."""

    requests: Counter[tuple[str, int]] = field(default_factory=Counter)  # (endpoint, status)
    prompt_tokens: int = 0
    prompt_tokens_reused: int = 0  # found in the KV cache (a conversation's earlier turns), not computed again
    completion_tokens: int = 0
    drafted: Counter[str] = field(default_factory=Counter)  # by drafter
    accepted: Counter[str] = field(default_factory=Counter)
    passes: int = 0  # shared target passes (the scheduler's count, set by the worker)
    finished: Counter[str] = field(default_factory=Counter)  # by finish reason
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def request(self, endpoint: str, status: int) -> None:
        with self._lock:
            self.requests[(endpoint, status)] += 1

    def step(self, step: Step) -> None:
        with self._lock:
            self.completion_tokens += len(step.emitted)
            drafted = len(step.accepted) + len(step.rejected) + sum(map(len, step.rejected_branches))
            if drafted:
                self.drafted[step.drafter] += drafted
                self.accepted[step.drafter] += len(step.accepted)

    def prefill(self, prompt_tokens: int, reused: int) -> None:
        with self._lock:
            self.prompt_tokens += prompt_tokens
            self.prompt_tokens_reused += reused

    def end(self, reason: str) -> None:
        with self._lock:
            self.finished[reason] += 1

    def render(self, queued: Callable[[], int], busy: Callable[[], int], lag: float = 0.0) -> str:
        with self._lock:
            out: list[str] = []

            def metric(name: str, kind: str, help: str, samples: list[tuple[str, float]]) -> None:
                out.append(f"# HELP localspec_{name} {help}")
                out.append(f"# TYPE localspec_{name} {kind}")
                out.extend(f"localspec_{name}{labels} {value:g}" for labels, value in samples)

            metric("requests_total", "counter", "HTTP requests answered, by endpoint and status code.",
                   [(f'{{endpoint="{e}",status="{s}"}}', n) for (e, s), n in sorted(self.requests.items())])
            metric("prompt_tokens_total", "counter", "Prompt tokens of the requests that ran.",
                   [("", self.prompt_tokens)])
            metric("prompt_tokens_reused_total", "counter",
                   "Prompt tokens found in the KV cache (earlier turns of a conversation) instead of computed.",
                   [("", self.prompt_tokens_reused)])
            metric("completion_tokens_total", "counter", "Tokens generated.", [("", self.completion_tokens)])
            metric("draft_tokens_total", "counter", "Draft tokens verified, by drafter.",
                   [(f'{{drafter="{d}"}}', n) for d, n in sorted(self.drafted.items())])
            metric("draft_tokens_accepted_total", "counter", "Draft tokens the target accepted, by drafter.",
                   [(f'{{drafter="{d}"}}', self.accepted[d]) for d in sorted(self.drafted)])
            metric("target_passes_total", "counter", "Target passes, each shared by every running sequence.",
                   [("", self.passes)])
            metric("tokens_per_pass", "gauge", "Tokens a target pass emitted on average, over all sequences.",
                   [("", self.completion_tokens / self.passes if self.passes else 0.0)])
            metric("finished_total", "counter", "Generations ended, by reason.",
                   [(f'{{reason="{r}"}}', n) for r, n in sorted(self.finished.items())])
            metric("queue_length", "gauge", "Requests waiting for a free sequence.", [("", queued())])
            metric("busy_sequences", "gauge", "Sequences generating now.", [("", busy())])
            metric("event_loop_lag_seconds_max", "gauge", "The longest the server's event loop was late to wake "
                   "since it started (a probe every 50 ms): how long one request's work held up the others'.",
                   [("", lag)])
            return "\n".join(out) + "\n"


class LagProbe:
    """How late the event loop wakes: a sleep of ``period`` that takes longer was held up by work on the loop."""

    def __init__(self, period: float = 0.05) -> None:
        self.period = period
        self.worst = 0.0

    async def run(self) -> None:
        import anyio

        while True:
            t0 = time.perf_counter()
            await anyio.sleep(self.period)
            self.worst = max(self.worst, time.perf_counter() - t0 - self.period)
