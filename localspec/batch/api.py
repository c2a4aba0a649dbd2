"""The Python face of the batch scheduler: ``localspec.generate_many`` and ``localspec.generate``.

    import localspec
    for r in localspec.generate_many(["Summarise: ...", "Translate: ..."], max_tokens=128):
        print(r.id, r.text, r.stats.tokens_per_second)

Greedy, every prompt's text is what `localspec run` gives it alone (up to numerical near-ties), while the prompts
share the target's passes; sampled with ``seed=``, the same call gives the same texts again (not run's alone:
docs/speculation.md, "What a seed promises").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from localspec.batch.result import Result
from localspec.errors import UserError
from localspec.openai_body import lone_surrogate
from localspec.request import Request
from localspec.runtime import BatchRuntime, seeded_job
from localspec.schema import ConstraintSpec
from localspec.settings import (
    GenerationSettings,
    HistorySettings,
    RuntimeSettings,
    SamplingSettings,
    Settings,
    SpeculationSettings,
)


def generate_many(
    prompts: Iterable[str | Request | Mapping[str, Any]],
    *,
    model: str | None = None,
    profile: str | None = None,
    drafter: str | None = None,
    draft: str | None = None,
    parallel: int | None = None,
    max_tokens: int = 256,
    temperature: float = 0.0,
    top_p: float = 0.95,
    top_k: int = 40,
    min_p: float = 0.05,
    seed: int | None = None,
    stop: str | Iterable[str] = (),
    chat: bool = False,
    ctx: int = 4096,
    threads: int | None = None,
    gpu_layers: int | None = None,
    k: int | None = None,
    ordered: bool = False,
    cancelled: Callable[[], bool] = lambda: False,
    keep_history: bool | None = None,
    response_format: Any = None,
) -> Iterator[Result]:
    """Generate from every prompt, ``parallel`` at a time (None: as many as pay on this device), each speculating.
    ``profile``: a target/draft profile from models.toml, as ``--profile`` (it sets ``model``, ``drafter``,
    ``draft`` and ``k`` where they are not given, and the profile's exit layer and RPC servers); ``drafter``
    defaults to the profile's, else 'auto'.
    ``draft``: a draft model (a models.toml name or a GGUF path sharing the target's tokenizer) for ``drafter``
    'draft' or 'auto' (n-gram lookup first, then the draft model): every prompt's drafts come from it at once.

    A prompt is a string (its id is its position), a :class:`Request`, or a mapping read as a `localspec batch`
    line: ``prompt`` or ``messages``, an optional ``id``, and an OpenAI body's settings (``max_tokens``,
    ``temperature``, ``top_p``, ``seed``, ``stop``, ...). ``stop``: one string or several. ``chat``: plain
    prompts go through the model's chat template. Results come as each finishes (``ordered``: in the prompts'
    order); a prompt that cannot run (a bad mapping, a prompt too long) gets a Result with ``error`` set, and the
    rest go on. Bad settings, a single string where a list belongs and ids used twice raise
    ``localspec.errors.UserError`` before the model loads. Each prompt drafts from the earlier ones too (and from
    earlier calls'): ``keep_history`` False keeps them in memory for this call only, True (the default, unless
    LOCALSPEC_HISTORY says otherwise) on disk in the cache folder (`localspec cache` shows and clears it).
    ``response_format``: every answer held to it (a prompt's own mapping may give its own): OpenAI's
    ``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}`` or ``{"type": "json_object"}``,
    ``{"type": "grammar", "grammar": GBNF or Lark}``, ``{"type": "regex", "regex": ...}``, or a pydantic model
    class; lossless against --drafter none under it (docs/structured.md)."""
    from localspec.batch.run import NothingToRun, Screen, run_requests

    if isinstance(prompts, (str, bytes, Mapping, Request)):
        raise UserError(f"generate_many takes a list of prompts, not one {type(prompts).__name__}: put it in a "
                        "list, or call localspec.generate")
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    if profile is not None and not isinstance(profile, str):
        raise UserError(f"profile must be a string (or None), got {profile!r}")
    from localspec.models.registry import profile_options

    fills = profile_options(profile, model)
    model, draft, k = (fills["model"] if model is None else model, fills["draft"] if draft is None else draft,
                       fills["k"] if k is None else k)
    drafter = drafter if drafter is not None else fills["drafter"] or "auto"
    _check_types(model=model, drafter=drafter, draft=draft, parallel=parallel, max_tokens=max_tokens,
                 temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed, stop=stops, ctx=ctx,
                 threads=threads, gpu_layers=gpu_layers, k=k)
    settings = Settings(
        model,
        RuntimeSettings(n_ctx=ctx, n_threads=threads, n_gpu_layers=gpu_layers,
                        rpc=tuple(fills["rpc"].split(",")) if fills["rpc"] else ()),
        SpeculationSettings(drafter=drafter, k=k, draft_model=draft, exit_layer=fills["exit_layer"]),
        SamplingSettings(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed),
        GenerationSettings(max_tokens=max_tokens, stop=stops, constraint=ConstraintSpec.of(response_format)),
        HistorySettings(None if keep_history is None else ("disk" if keep_history else "memory")),
    )
    try:
        settings.validate()
    except UserError as e:  # the settings speak of command-line flags: name the argument instead
        raise UserError(re.sub(r"--([a-z][a-z-]*)", lambda m: m[1].replace("-", "_"), str(e))) from None
    if keep_history is not None and not isinstance(keep_history, bool):
        raise UserError(f"keep_history must be True, False or None, got {keep_history!r}")
    if parallel is not None and parallel < 1:
        raise UserError(f"parallel must be at least 1 (or None: as many as pay), got {parallel}")
    requests, failed, positions = _read(list(prompts))
    done: dict[int, Result] = {}
    following = 0

    def release(result: Result) -> Iterator[Result]:
        nonlocal following
        if not ordered:
            yield result
            return
        done[result.index] = result
        while following in done:
            yield done.pop(following)
            following += 1

    for result in failed:
        yield from release(result)
    if not requests:
        return
    screen = Screen(settings, requests, chat)  # each prompt checked with the model's tokens before any measuring

    def screened() -> Iterator[Result]:
        for result in screen.failed:
            result.index = positions[result.index]
            yield from release(result)

    try:
        with BatchRuntime.open(settings, parallel, jobs=len(requests), seeded=seeded_job(requests, settings.sampling),
                               check=screen) as rt:
            yield from screened()
            for result in run_requests(rt, screen.runs, chat=chat, cancelled=cancelled, prepared=screen.prepared):
                # its place among all the prompts, the failed ones included
                result.index = positions[screen.kept[result.index]]
                yield from release(result)
    except NothingToRun:  # not one could run: nothing was measured
        yield from screened()


def generate(prompt: str | Request | Mapping[str, Any], *, prediction: str | None = None, **options: Any) -> Result:
    """One prompt through the same path (``generate_many``'s options). A prompt that cannot be read raises
    ``localspec.errors.UserError``; one that cannot run (too long) gives a Result with ``error`` set.
    ``prediction``: what the answer will mostly be (OpenAI's Predicted Outputs: e.g. the file the prompt asks to
    change), drafted from and never imposed; many prompts each carry their own (a Request's ``prediction``, a
    mapping's OpenAI ``prediction`` field)."""
    request = as_request(prompt, 0)
    # read again as a line would be: check_request names a prediction that is not text
    return next(iter(generate_many([request if prediction is None else replace(request, prediction=prediction)],
                                   **options)))


def as_request(prompt: str | Request | Mapping[str, Any], index: int) -> Request:
    """A prompt as a Request: a string is its own prompt, a mapping is read as a `localspec batch` line (by the
    reader serve uses). UserError naming the prompt where it cannot be read."""
    from localspec.bounded_json import DEPTH_MAX, depth_over
    from localspec.openai_body import BodyError, check_request, parse_body

    if isinstance(prompt, Mapping):
        raw = prompt.get("id")
        name = str(index) if raw is None else str(raw)
        if depth_over(prompt, DEPTH_MAX):  # what a JSON line could not hold either (localspec/bounded_json.py)
            raise BodyError(None, f"prompt {name!r} nests deeper than {DEPTH_MAX} levels")
        try:
            return parse_body(prompt, None, name, line=index + 1).request
        except BodyError as e:
            raise BodyError(e.param, f"prompt {name!r}: {e}") from None
    if isinstance(prompt, str):
        request = Request(str(index), prompt=prompt)
    elif isinstance(prompt, Request):
        request = prompt
    else:
        raise UserError(f"prompt {index} is a {type(prompt).__name__}: pass a string, a Request or a mapping")
    try:
        return check_request(request)
    except BodyError as e:
        raise BodyError(e.param, f"prompt {request.id!r}: {e}") from None


def _read(prompts: list[Any]) -> tuple[list[Request], list[Result], list[int]]:
    """The prompts that can run, an error Result for each that cannot, and each runnable one's place; UserError
    for an id used twice (its results could not be told apart)."""
    requests: list[Request] = []
    failed: list[Result] = []
    positions: list[int] = []
    seen: dict[str, int] = {}
    for i, prompt in enumerate(prompts):
        request: Request | None = None
        try:
            request = as_request(prompt, i)
            rid = request.id
        except UserError as e:
            raw = prompt.get("id") if isinstance(prompt, Mapping) else getattr(prompt, "id", None)
            rid = str(i) if raw is None else str(raw)
            failed.append(Result(rid, finish_reason="error", error=str(e), index=i))
        if rid in seen:
            raise UserError(f"id {rid!r} is given to prompt {seen[rid]} and prompt {i}: ids must be unique")
        seen[rid] = i
        if request is not None:
            requests.append(request)
            positions.append(i)
    return requests, failed, positions


def _check_types(**values: Any) -> None:
    """Each option of the right type, so that a wrong one is a UserError naming it rather than a TypeError from
    deep inside (``temperature="hot"``)."""
    for name, value in values.items():
        if value is None and name in _OPTIONAL:
            continue
        if name in _INTS:
            ok = isinstance(value, int) and not isinstance(value, bool)
            what = "an integer"
        elif name in _FLOATS:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            what = "a number"
        elif name == "stop":
            ok = all(isinstance(s, str) for s in value)
            what = "a string or a list of strings"
        else:
            ok = isinstance(value, str)
            what = "a string"
        if not ok:
            raise UserError(f"{name} must be {what}{' (or None)' if name in _OPTIONAL else ''}, got {value!r}")
    for text in values["stop"]:
        if lone_surrogate(text) is not None:
            raise UserError(f"stop {text!r} holds a lone surrogate: it is not valid Unicode")


_INTS = {"parallel", "max_tokens", "top_k", "seed", "ctx", "threads", "gpu_layers", "k"}
_FLOATS = {"temperature", "top_p", "min_p"}
_OPTIONAL = {"model", "profile", "draft", "parallel", "seed", "threads", "gpu_layers", "k"}
