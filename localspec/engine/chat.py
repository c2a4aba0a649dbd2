"""Chat templates through llama.cpp's own formatter, with a per-architecture fallback.

A GGUF without a template makes ``llama_chat_apply_template(None, …)`` silently format ChatML, which is wrong
for most models; so we pick llama.cpp's built-in template for the architecture and say that we did.
"""

from __future__ import annotations

import ctypes
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import llama_cpp

from localspec.engine.model import Model
from localspec.engine.vocab import Vocab
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

    def tokenize(self, vocab: Vocab, messages: Sequence[Message], *, add_assistant: bool = True) -> list[int]:
        """The conversation as tokens: the template's own markers are special tokens, the messages' text is text.

        Tokenizing the rendered string with special tokens parsed would let a message containing
        "<end_of_turn>" close its turn and forge the next. So the template is rendered once more with a
        placeholder for each message, and the pieces around the placeholders are tokenized with special tokens
        parsed, each message's text without. llama.cpp already tokenizes the text between special tokens piece
        by piece, so for ordinary text the tokens are the same as the whole string's.
        """
        nonce = secrets.token_hex(6)
        while any(nonce in m.content for m in messages):
            nonce = secrets.token_hex(6)
        marks = [f"LOCALSPEC{nonce}MESSAGE{i}END" for i in range(len(messages))]  # no spaces: survives a trim
        skeleton = self.apply([Message(m.role, mark) for m, mark in zip(messages, marks, strict=True)],
                              add_assistant=add_assistant)
        found = re.compile("|".join(map(re.escape, marks))) if marks else None
        pieces = found.split(skeleton) if found else [skeleton]
        order = [marks.index(m) for m in found.findall(skeleton)] if found else []
        # Templates may transform the text they wrap (llama.cpp's gemma template trims it): the variant that
        # renders exactly as the template does is the text the model would have seen.
        rendered = self.apply(messages, add_assistant=add_assistant)
        texts = [messages[i].content for i in order]
        for variant in (texts, [t.strip() for t in texts]):
            if "".join(p + t for p, t in zip(pieces, [*variant, ""], strict=True)) == rendered:
                texts = variant
                break
        tokens = vocab.tokenize(pieces[0], add_special=True, parse_special=True)
        for text, piece in zip(texts, pieces[1:], strict=True):
            tokens += vocab.tokenize(text, add_special=False, parse_special=False)
            tokens += vocab.tokenize(piece, add_special=False, parse_special=True)
        return tokens
