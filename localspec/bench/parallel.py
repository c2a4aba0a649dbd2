"""`localspec bench --parallel N`: the suite as one batch, beside the same prompts one at a time, live and replayed.

Live, each way's tokens per second is the wall time of the whole job (model loads excluded), the ways alternating
round by round. Replayed (``--replay-costs``), the batch's greedy outputs are drafted again through the same
scheduler and priced on that cost table (bench/replay.py ``replay_batch``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from localspec.batch.run import prepare, run_requests
from localspec.bench.replay import REPLAYABLE, CostTable, Known, replay_batch
from localspec.bench.report import Machine
from localspec.bench.runner import split_variant
from localspec.bench.suite import Suite
from localspec.engine.chat import Message
from localspec.events import Finished
from localspec.request import Request
from localspec.runtime import BatchRuntime, Runtime
from localspec.settings import GenerationSettings, HistorySettings, Settings


@dataclass(frozen=True, slots=True)
class Way:
    """One way of running the suite: its drafter, alone or batched, and its median tokens per second."""

    drafter: str
    batch: bool
    tokens_per_second: float

    @property
    def name(self) -> str:
        return f"{'batch' if self.batch else 'one at a time'}, {self.drafter}"


def one_at_a_time(rt: Runtime, suite: Suite) -> float:
    tokens, start = 0, time.perf_counter()
    for p in suite.prompts:
        rt.fresh()
        for e in rt.generate(rt.prompt_tokens(p.prompt, chat=p.chat), GenerationSettings(max_tokens=p.max_tokens)):
            if isinstance(e, Finished):
                tokens += e.stats.generated_tokens
    return tokens / (time.perf_counter() - start)


def as_batch(rt: BatchRuntime, suite: Suite, known: list[Known] | None = None) -> float:
    """The suite as one job; ``known`` collects its outputs (for a replay)."""
    requests = [Request(p.id, messages=(Message("user", p.prompt),), max_tokens=p.max_tokens) if p.chat
                else Request(p.id, prompt=p.prompt, max_tokens=p.max_tokens) for p in suite.prompts]
    start = time.perf_counter()
    results = sorted(run_requests(rt, requests), key=lambda r: r.index)
    rate = sum(len(r.tokens) for r in results) / (time.perf_counter() - start)
    if known is not None:
        known[:] = [Known(prepare(rt, rt.settings, requests[r.index], False)[0], r.tokens,
                          r.stats.stop_reason == "eog") for r in results if r.ok]
    return rate


@dataclass(frozen=True, slots=True)
class Live:
    """What ``live`` measured: each way's median, the lanes the batch ran, its outputs (for a replay), the model and
    where its passes ran (as the runtime says)."""

    ways: list[Way]
    lanes: int
    known: list[Known]
    model: str
    device: str


def live(settings: Settings, suite: Suite, drafters: list[str], parallel: int | None, rounds: int,
         say: Callable[[str], None]) -> Live:
    """Every drafter one at a time and as a batch, ``rounds`` times alternating.
    A pinned entry (NAME:kN) drafts that fixed length, alone and in every sequence of the batch."""
    opened: dict[tuple[str, bool], Runtime | BatchRuntime] = {}
    known: list[Known] = []
    try:
        for drafter in drafters:
            name, k, _ = split_variant(drafter)
            speculation = replace(settings.speculation, drafter=name, k=settings.speculation.k if k is None else k)
            # a bench never drafts from the history (a round would draft from its own earlier rounds' answers)
            s = replace(settings, speculation=speculation, history=HistorySettings("off"))
            opened[(drafter, False)] = Runtime.open(s)
            opened[(drafter, True)] = BatchRuntime.open(s, parallel, jobs=len(suite.prompts))
        rates: dict[tuple[str, bool], list[float]] = {key: [] for key in opened}
        for r in range(rounds):
            for key in list(opened) if r % 2 == 0 else list(reversed(opened)):
                rt = opened[key]
                rate = as_batch(rt, suite, known) if isinstance(rt, BatchRuntime) else one_at_a_time(rt, suite)
                rates[key].append(rate)
                say(f"round {r + 1}: {'batch' if key[1] else 'one at a time'}, {key[0]}: {rate:.1f} tok/s")
        batch = next(rt for rt in opened.values() if isinstance(rt, BatchRuntime))
        lanes, model, device = batch.parallel, batch.model_name, batch.device.description
    finally:
        for rt in opened.values():
            rt.close()
    return Live([Way(d, b, statistics.median(v)) for (d, b), v in rates.items()], lanes, known, model, device)


def replayed(known: list[Known], drafters: list[str], parallel: int, table: CostTable) -> list[Way]:
    """The same outputs priced on ``table``: each drafter that needs no model (REPLAYABLE), one at a time and
    batched."""
    return [Way(d, b, replay_batch(split_variant(d)[0], known, table, parallel if b else 1,
                                   k=split_variant(d)[1]).tokens_per_second)
            for d in drafters if split_variant(d)[0] in REPLAYABLE for b in (False, True)]


def _base(ways: list[Way]) -> float:
    """What the speedups are over: one at a time, target-only (or the first way)."""
    return next((w for w in ways if w.drafter == "none" and not w.batch), ways[0]).tokens_per_second


def table(title: str, ways: list[Way]) -> str:
    """A Markdown table: each way's tok/s and its speedup over one at a time, target-only (or the first way)."""
    base = _base(ways)
    rows = [f"| {w.name} | {w.tokens_per_second:.1f} | {w.tokens_per_second / base:.2f}x |" for w in ways]
    return "\n".join([f"### {title}", "", "| way | tok/s | × one at a time, none |", "|---|---|---|", *rows, ""])


@dataclass(frozen=True, slots=True)
class ParallelReport:
    """``bench --parallel``'s report: the live ways and, when asked, the same outputs replayed on one cost table.
    The terminal shows ``tables()``; --json and --out's bench.json carry ``to_json()``, bench.md ``to_markdown()``."""

    model: str
    machine: Machine
    suite: str
    command: str
    rounds: int
    lanes: int
    ways: list[Way]
    replayed_on: str = ""  # the table's device and source; "" when not replayed
    replayed: list[Way] | None = None

    def tables(self) -> str:
        out = table(f"Live on this machine, --parallel {self.lanes}, {self.rounds} round(s), medians", self.ways)
        if self.replayed:
            out += "\n" + table(f"Replayed on {self.replayed_on}", self.replayed)
        return out

    def to_json(self) -> dict[str, Any]:
        doc = {"model": self.model, "machine": asdict(self.machine), "suite": self.suite, "command": self.command,
               "repeat": self.rounds, "parallel": self.lanes, "ways": _ways_json(self.ways)}
        if self.replayed:
            doc["replay"] = {"replayed_on": self.replayed_on, "ways": _ways_json(self.replayed)}
        return doc

    def to_markdown(self) -> str:
        m = self.machine
        lines = [
            "# localspec performance: one batch beside one at a time", "",
            f"Produced by `{self.command}` (do not edit by hand: rerun it).", "",
            f"- model: **{self.model}** · suite: `{self.suite}` · {self.rounds} round(s), medians",
            f"- machine: {m.cpu} · {m.threads} threads · {m.device or f'GPU layers {m.gpu_layers}'} · "
            f"llama-cpp-python {m.llama_cpp_version}",
            "- tok/s is the wall time of the whole suite (model loads excluded); the ways alternate round by round",
        ]
        if self.replayed:
            lines.append(f"- **replayed on {self.replayed_on}**: the batch's outputs drafted again through the same "
                         "scheduler and priced on that device's cost table, not timed")
        return "\n".join(lines) + "\n\n" + self.tables()


def _ways_json(ways: list[Way]) -> list[dict[str, Any]]:
    base = _base(ways)
    return [{"way": w.name, "drafter": w.drafter, "batch": w.batch,
             "tokens_per_second": round(w.tokens_per_second, 2), "speedup": round(w.tokens_per_second / base, 3)}
            for w in ways]
