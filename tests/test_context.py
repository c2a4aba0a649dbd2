"""The engine's context on the real model: what it enforces beyond llama.cpp's own checks."""

from __future__ import annotations

import threading
import warnings
from pathlib import Path

import pytest

from localspec.engine import Context, Model


def test_decoding_from_a_second_thread_is_warned_about(model_path: Path) -> None:
    with Model(model_path) as model, Context(model, n_ctx=256) as ctx:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the same thread, again and again: no warning
            ctx.decode([2, 818])
            ctx.decode([5279])
        caught: list[warnings.WarningMessage] = []

        def elsewhere() -> None:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                ctx.decode([563])
            caught.extend(seen)

        worker = threading.Thread(target=elsewhere)
        worker.start()
        worker.join()
        assert [w.category for w in caught] == [RuntimeWarning]
        assert "one thread" in str(caught[0].message)
        assert ctx.tokens == [2, 818, 5279, 563]  # a warning, not a refusal: the decode happened



def test_truncating_an_empty_cache_clears_nothing(model_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a draft model that has not drafted yet is truncated to nothing after every step: a clear zeroes the whole KV
    # buffer each time (2.7 ms a step for a 0.5B model, 3% of its target's pass on a 2-core CPU)
    import llama_cpp

    clears: list[object] = []
    real = llama_cpp.llama_memory_clear
    monkeypatch.setattr(llama_cpp, "llama_memory_clear", lambda *a: (clears.append(a), real(*a))[1])
    with Model(model_path) as model, Context(model, n_ctx=256) as ctx:
        ctx.truncate(0)
        ctx.truncate(3)
        assert clears == []
        first = ctx.decode([2, 818, 5279])[-1]
        ctx.truncate(0)  # something cached: it goes, and the same tokens decode to the same row again
        assert len(clears) == 1 and ctx.tokens == []
        assert (ctx.decode([2, 818, 5279])[-1] == first).all()
