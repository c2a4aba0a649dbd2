"""Chat templates through llama.cpp's own formatter, with a per-architecture fallback.

A GGUF without a template makes ``llama_chat_apply_template(None, …)`` silently format ChatML, which is wrong
for most models; so we pick llama.cpp's built-in template for the architecture and say that we did.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

import llama_cpp

from localspec.engine.model import Model
from localspec.errors import UserError

# architecture (general.architecture) → llama.cpp built-in template name
_BUILTIN_BY_ARCH = {
    "gemma": "gemma",
    "gemma2": "gemma",
    "gemma3": "gemma",
    "gemma3n": "gemma",
    "llama": "llama3",
    "qwen2": "chatml",
    "qwen3": "chatml",
    "phi3": "phi3",
    "mistral": "mistral-v7",
}


@dataclass(frozen=True, slots=True)
class Message:
    role: str  # system | user | assistant
    content: str


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    """A template llama.cpp can apply; ``source`` says where it came from, for the user to see."""

    template: bytes
    source: str  # "model" or "built-in <name> (the model file has no template)"

    @classmethod
    def for_model(cls, model: Model) -> ChatTemplate:
        own = model.chat_template()
        if own:
            return cls(own.encode(), "model")
        name = _BUILTIN_BY_ARCH.get(model.architecture, "chatml")
        return cls(name.encode(), f"built-in '{name}' (the model file has no chat template)")

    def apply(self, messages: Sequence[Message], *, add_assistant: bool = True) -> str:
        keep = [(m.role.encode(), m.content.encode()) for m in messages]  # keep bytes alive during the call
        array = (llama_cpp.llama_chat_message * len(keep))()
        for i, (role, content) in enumerate(keep):
            array[i].role = role
            array[i].content = content
        size = 1024 + sum(len(c) + len(r) for r, c in keep) * 2
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_chat_apply_template(self.template, array, len(keep), add_assistant, buf, size)
            if n < 0:
                raise UserError("llama.cpp does not support this model's chat template: run without --chat")
            if n <= size:
                return buf.raw[:n].decode("utf-8", "replace")
            size = n + 1
        raise RuntimeError("chat template output kept growing")
