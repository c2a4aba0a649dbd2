"""The Python face of the batch scheduler: ``localspec.generate_many`` and ``localspec.generate``.

    import localspec
    for r in localspec.generate_many(["Summarise: ...", "Translate: ..."], max_tokens=128):
        print(r.id, r.text, r.stats.tokens_per_second)

Every prompt's text is what `localspec run` gives it alone (greedy up to numerical near-ties; sampled with a seed
exactly), while the prompts share the target's passes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from localspec.batch.request import Request
from localspec.batch.result import Result
from localspec.errors import UserError
from localspec.runtime import BatchRuntime
from localspec.settings import (
    GenerationSettings,
    RuntimeSettings,
    SamplingSettings,
    Settings,
    SpeculationSettings,
)


def generate_many(
    prompts: Iterable[str | Request | Mapping[str, Any]],
    *,
    model: str | None = None,
    drafter: str = "auto",
    parallel: int | None = None,
    max_tokens: int = 256,
    temperature: float = 0.0,
    top_p: float = 0.95,
    top_k: int = 40,
    min_p: float = 0.05,
    seed: int | None = None,
    stop: Iterable[str] = (),
    chat: bool = False,
    ctx: int = 4096,
    threads: int | None = None,
    gpu_layers: int | None = None,
    k: int | None = None,
    ordered: bool = False,
    cancelled: Callable[[], bool] = lambda: False,
) -> Iterator[Result]:
    """Generate from every prompt, ``parallel`` at a time (None: as many as pay on this device), each speculating.

    A prompt is a string (its id is its position), a :class:`Request`, or a mapping with ``prompt`` or ``messages``
    and its own ``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop`` (``id`` optional). ``chat``: plain
    prompts go through the model's chat template. Results come as each finishes (``ordered``: in the prompts'
    order); a prompt that cannot run gets a Result with ``error`` set, and the rest go on. Bad settings raise
    ``localspec.errors.UserError`` before the model loads."""
    from localspec.batch.run import run_requests

    settings = Settings(
        model,
        RuntimeSettings(n_ctx=ctx, n_threads=threads, n_gpu_layers=gpu_layers),
        SpeculationSettings(drafter=drafter, k=k),
        SamplingSettings(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed),
        GenerationSettings(max_tokens=max_tokens, stop=tuple(stop)),
    )
    settings.validate()
    if parallel is not None and parallel < 1:
        raise UserError(f"parallel must be at least 1 (or None: as many as pay), got {parallel}")
    requests = [as_request(p, i) for i, p in enumerate(prompts)]
    with BatchRuntime.open(settings, parallel, jobs=len(requests)) as rt:
        results = run_requests(rt, requests, chat=chat, cancelled=cancelled)
        if not ordered:
            yield from results
            return
        done: dict[int, Result] = {}
        following = 0
        for result in results:
            done[result.index] = result
            while following in done:
                yield done.pop(following)
                following += 1


def generate(prompt: str | Request | Mapping[str, Any], **options: Any) -> Result:
    """One prompt through the same path (``generate_many``'s options)."""
    return next(iter(generate_many([prompt], **options)))


def as_request(prompt: str | Request | Mapping[str, Any], index: int) -> Request:
    """A prompt as a Request: a string is its own prompt, a mapping is read as a `localspec batch` line."""
    from localspec.batch.files import parse_mapping

    if isinstance(prompt, Request):
        return prompt
    if isinstance(prompt, str):
        return Request(str(index), prompt=prompt)
    if not isinstance(prompt, Mapping):
        raise UserError(f"prompt {index} is a {type(prompt).__name__}: pass a string, a Request or a mapping")
    return parse_mapping(prompt, str(prompt.get("id", index)), index + 1)
