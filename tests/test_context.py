"""The engine's context on the real model: what it enforces beyond llama.cpp's own checks."""

from __future__ import annotations

import threading
import warnings
from pathlib import Path

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

