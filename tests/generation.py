"""A runtime's generation as a test reads it: the emitted token ids and the Finished event."""

from __future__ import annotations

from localspec.events import Finished, Step
from localspec.runtime import Runtime
from localspec.settings import GenerationSettings


def generated(rt: Runtime, prompt: list[int], max_tokens: int) -> tuple[list[int], Finished]:
    tokens: list[int] = []
    finished = None
    for event in rt.generate(prompt, GenerationSettings(max_tokens=max_tokens)):
        if isinstance(event, Step):
            tokens += [t.id for t in event.emitted]
        elif isinstance(event, Finished):
            finished = event
    assert finished is not None
    return tokens, finished
