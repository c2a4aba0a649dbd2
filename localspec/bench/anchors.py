"""Anchors for `localspec bench --anchors`: what a Python user would otherwise pick, measured in the same run.

This module uses llama_cpp outside ``localspec.engine`` (docs/architecture.md, "Layers", lists each such place), and
by necessity: the point is
to time llama-cpp-python's own high-level ``Llama.create_completion``, plain and with its
``LlamaPromptLookupDecoding`` drafter, exactly as a user would call them, so it cannot go through our engine. It is
imported only when ``--anchors`` is given and nothing else in localspec touches it.

Timing matches the speculation loop's: from the first generated token to the last, i.e. tokens after the first
divided by the time they took (the first token's latency is prompt processing, reported by neither).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PLAIN = "anchor:create_completion"
LOOKUP = "anchor:prompt-lookup"
NAMES = (PLAIN, LOOKUP)
LOOKUP_DRAFT_TOKENS = 10  # llama-cpp-python's documented example value (num_pred_tokens=10)


@dataclass(frozen=True, slots=True)
class AnchorResult:
    text: str
    generated_tokens: int  # stream chunks with text: one per token, except where a multi-byte character spans two
    decode_seconds: float
    tokens_per_second: float
    stop_reason: str


class Anchors:
    """Two high-level ``Llama`` objects on the target model, loaded on first use and kept for the whole run."""

    def __init__(self, model_path: Path, *, n_ctx: int, n_threads: int, n_gpu_layers: int) -> None:
        self._args: dict[str, Any] = {
            "model_path": str(model_path), "n_ctx": n_ctx, "n_threads": n_threads, "n_threads_batch": n_threads,
            "n_gpu_layers": n_gpu_layers, "verbose": False,
        }
        self._llms: dict[str, Any] = {}

    def _llm(self, name: str) -> Any:
        if name not in self._llms:
            from llama_cpp import Llama
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            if name == PLAIN:
                self._llms[name] = Llama(**self._args)
            elif name == LOOKUP:
                draft = LlamaPromptLookupDecoding(num_pred_tokens=LOOKUP_DRAFT_TOKENS)
                self._llms[name] = Llama(**self._args, draft_model=draft)
            else:
                raise ValueError(f"unknown anchor {name!r}")
        return self._llms[name]

    def run(self, name: str, prompt: str, max_tokens: int) -> AnchorResult:
        llm = self._llm(name)
        llm.reset()  # no prefix reuse from the previous run: every run processes its prompt the same way
        pieces: list[str] = []
        first = last = 0.0
        reason = ""
        for chunk in llm.create_completion(prompt, max_tokens=max_tokens, temperature=0.0, stream=True):
            choice = chunk["choices"][0]
            if choice.get("text"):
                last = time.perf_counter()
                if not pieces:
                    first = last
                pieces.append(choice["text"])
            reason = choice.get("finish_reason") or reason
        n = len(pieces)
        seconds = last - first
        tps = (n - 1) / seconds if n > 1 and seconds > 0 else 0.0
        return AnchorResult("".join(pieces), n, seconds, tps, {"stop": "eog"}.get(reason, reason))

    def close(self) -> None:
        for llm in self._llms.values():
            llm.close()
        self._llms.clear()
