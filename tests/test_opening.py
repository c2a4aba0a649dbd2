"""Runtime (one sequence) and BatchRuntime (lanes) open their target through one opening (opening.py): the same
model name, device and notices from the same settings, and each says where its context holds other than asked."""

from __future__ import annotations

from pathlib import Path

from localspec.runtime import BatchRuntime, Runtime
from localspec.settings import HistorySettings, RuntimeSettings, Settings, SpeculationSettings


def _settings(model_path: Path, n_ctx: int) -> Settings:
    return Settings(str(model_path), RuntimeSettings(n_ctx=n_ctx), SpeculationSettings(drafter="none"),
                    history=HistorySettings("off"))


def test_both_runtimes_open_the_same_target_and_say_where_the_context_is_not_as_asked(model_path: Path) -> None:
    said: list[str] = []
    with Runtime.open(_settings(model_path, 300), say=said.append) as one:
        # llama.cpp sizes a context in steps of 256: asked 300, it holds 512
        assert one.n_ctx == 512
        assert one.notices == ["--ctx 300 is 512 tokens here (llama.cpp sizes contexts in steps of 256)"]
        opened = (one.model_name, one.device)
    with BatchRuntime.open(_settings(model_path, 300), 2, say=said.append) as lanes:
        # each lane holds at least what was asked: nothing to say
        assert lanes.lanes.n_ctx >= 300 and lanes.notices == []
        assert (lanes.model_name, lanes.device) == opened

