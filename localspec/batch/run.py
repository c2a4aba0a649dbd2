"""Requests through the scheduler: each becomes a job (its prompt tokenized, its settings over the job's), and each
job's events become one Result. What `localspec batch` and ``generate_many`` share."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from localspec.batch.result import Result
from localspec.errors import UserError
from localspec.events import Event, Finished, Step
from localspec.faults import ARMED, mark
from localspec.finish_reasons import calls_reason, result_reason
from localspec.openai_body import BodyError
from localspec.opening import Checks, Prompts
from localspec.request import Request
from localspec.runtime import Admitted, BatchRuntime, seeded_job
from localspec.schema.spec import follow_prompt
from localspec.settings import GenerationSettings, SamplingSettings, Settings
from localspec.speculative.jobs import Failed, Job, PassStats
from localspec.speculative.scheduler import Scheduler


@dataclass(slots=True)
class _Pending:
    index: int
    request: Request
    tokens: list[int] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)


def run_requests(
    rt: BatchRuntime, requests: Iterable[Request], *, chat: bool = False,
    cancelled: Callable[[], bool] = lambda: False, on_event: Callable[[Request, Event], None] | None = None,
    stats: PassStats | None = None, prepared: Sequence[Prepared] | None = None,
) -> Iterator[Result]:
    """Every request's Result, in the order they finish; a request that cannot run (a bad setting, a prompt too
    long) gets a Result with its error and the rest go on. ``chat``: a plain prompt goes through the chat template
    too. ``on_event``: every event of every request as it happens (a progress display). ``stats``: what the passes
    held, added up over the job. ``prepared``: each request's, as a ``Screen`` made it."""
    failed: deque[Result] = deque()

    def jobs() -> Iterator[Job]:
        for index, request in enumerate(requests):
            try:
                yield make_job(rt, request, index, chat, prepared[index] if prepared is not None else None)
            except UserError as e:
                failed.append(Result(request.id, finish_reason="error", error=str(e), index=index))

    scheduler = Scheduler(rt.lanes, rt.make_generator, rt.costs, parallel=rt.parallel, stats=stats, shapes=rt.shapes,
                          drafts=rt.drafts)
    for job, event in scheduler.run(jobs(), cancelled):
        while failed:
            yield failed.popleft()
        pending = job.key
        assert isinstance(pending, _Pending)
        if on_event is not None:
            on_event(pending.request, event)
        if isinstance(event, Step):
            for token in event.emitted:
                pending.tokens.append(token.id)
                pending.pieces.append(token.text)
        elif isinstance(event, Finished):
            pending.pieces.append(event.tail)
            result = Result(pending.request.id, "".join(pending.pieces), pending.tokens,
                            result_reason(event.reason), event.stats, index=pending.index)
            if pending.request.tools is not None:
                calls = rt.tool_calls(result.text, pending.request.tools)
                if calls.calls:
                    result.text, result.tool_calls = calls.content or "", list(calls.calls)
                    result.finish_reason = calls_reason(event.reason)
            yield result
        elif isinstance(event, Failed):
            yield Result(pending.request.id, finish_reason="error", error=event.message, index=pending.index)
    yield from failed


def make_job(rt: BatchRuntime, request: Request, index: int, chat: bool, prepared: Prepared | None = None) -> Job:
    """The request's tokens and settings (its own where it has them, else the job's; ``prepared``: as its screen
    made them), and its grammar's matcher."""
    tokens, generation, sampling = prepared or prepare(rt, rt.settings, request, chat)
    # the grammar's matcher now, with the model's tokenizer: a grammar that cannot be used fails this request here,
    # never a pass that other requests share (structured/grammars.py)
    constraint = generation.constraint
    matcher = rt.grammars.compile(constraint) if constraint is not None and rt.grammars is not None else None
    speculation = None  # a request's drafter and k were checked where it was read (openai_body)
    if request.drafter is not None or request.k is not None:
        speculation = replace(rt.settings.speculation, **{name: value for name in ("drafter", "k")
                                                          if (value := getattr(request, name)) is not None})
    if ARMED:  # tests only
        mark(tokens, request.prompt or "".join(m.content or "" for m in request.messages or ()))
    return Job(tokens, generation, sampling, key=_Pending(index, request), speculation=speculation, matcher=matcher)


Prepared = tuple[list[int], GenerationSettings, SamplingSettings]  # a request's tokens and its settings


def prepare(prompts: Prompts, settings: Settings, request: Request, chat: bool) -> Prepared:
    """Everything about a request that can be checked without compiling its grammar: its settings over the job's,
    its prompt's tokens and its prediction's. UserError (a BodyError naming the field where there is one)."""
    sampling = replace(settings.sampling, **{name: value for name in ("temperature", "top_p", "top_k", "min_p", "seed")
                                             if (value := getattr(request, name)) is not None})
    generation = GenerationSettings(
        max_tokens=request.max_tokens if request.max_tokens is not None else settings.generation.max_tokens,
        stop=request.stop if request.stop is not None else settings.generation.stop,
        # JSON spaced as the prompt's own (schema/json_style.py)
        constraint=follow_prompt(request.constraint or settings.generation.constraint,
                                 [m.content for m in request.messages or ()] or [request.prompt or ""]),
    )
    cap = settings.generation.max_tokens_cap
    if cap is not None and request.max_tokens is not None and request.max_tokens > cap:
        raise BodyError("max_tokens", f"max_tokens must be at most {cap}, the cap this runs with "
                                      f"(--max-tokens-cap), got {request.max_tokens}")
    sampling.validate()
    generation.validate()
    # a template that refuses the messages raises TemplateError, a UserError (engine/template.py): this request's
    if request.tools is not None:  # the tools shown to the model (its template's way, or a system message)
        tokens, tool_constraint = prompts.tool_prompt(list(request.messages or ()), request.tools)
        generation = replace(generation, constraint=tool_constraint)
    elif request.messages is not None:
        tokens = prompts.chat_tokens(list(request.messages))
    else:
        tokens = prompts.prompt_tokens(request.prompt or "", chat=chat)
    try:  # a prediction too long costs a tokenization, a grammar a compile
        generation = replace(generation, prediction=prompts.prediction_tokens(request.prediction))
    except UserError as e:
        raise BodyError("prediction.content", str(e)) from None
    return tokens, generation, sampling


class NothingToRun(Exception):
    """Every request of a job failed its checks (``Screen``): nothing is measured or run."""


@dataclass
class Screen:
    """A job's requests checked with the model's tokens before anything is measured (``BatchRuntime.open``'s
    check): each that can run kept with what ``prepare`` made of it (its job uses it: nothing is rendered twice),
    an error Result for each that cannot (``index``: its place in ``requests``). The prompt is held to the most a
    sequence of the job may hold. None left: NothingToRun."""

    settings: Settings
    requests: Sequence[Request]
    chat: bool
    kept: list[int] = field(default_factory=list)  # the places in ``requests`` of those that run
    prepared: list[Prepared] = field(default_factory=list)  # theirs, in that order
    failed: list[Result] = field(default_factory=list)

    def __call__(self, checks: Checks) -> Admitted:
        for i, request in enumerate(self.requests):
            try:
                prepared = prepare(checks, self.settings, request, self.chat)
                checks.fits(prepared[0])
            except UserError as e:
                self.failed.append(Result(request.id, finish_reason="error", error=str(e), index=i))
            else:
                self.kept.append(i)
                self.prepared.append(prepared)
        if not self.kept:
            raise NothingToRun
        # what runs decides the lanes and the seed's promise: a refused line is no neighbour
        return Admitted(len(self.kept), seeded_job(self.runs, self.settings.sampling))

    @property
    def runs(self) -> list[Request]:
        return [self.requests[i] for i in self.kept]
