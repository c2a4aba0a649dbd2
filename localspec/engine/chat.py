"""Chat templates: the model's own (Jinja, engine/template.py), else llama.cpp's built-in one for its architecture.

A GGUF without a template makes ``llama_chat_apply_template(None, …)`` silently format ChatML, which is wrong
for most models; so we pick llama.cpp's built-in template for the architecture and say that we did. A GGUF with a
template gets that template run by Jinja; llama.cpp's reading of it is the fallback only where Jinja cannot
compile it.
"""

from __future__ import annotations

import ctypes
import json
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import llama_cpp

from localspec.engine.model import Model
from localspec.engine.template import JinjaTemplate, TemplateError, message_dict, with_object_arguments
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

Tools = Sequence[Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class Message:
    role: str  # system | user | assistant | tool
    content: str
    # OpenAI's fields for tool use, passed to the template as HF does; None where a message has none
    tool_calls: tuple[Mapping[str, Any], ...] | None = None  # an assistant's calls: {"id", "type", "function"}
    tool_call_id: str | None = None  # a tool result: the call it answers
    name: str | None = None  # a tool result: the function's name

    def as_dict(self, content: str | None = None) -> dict[str, Any]:
        return message_dict(self.role, self.content if content is None else content, tool_calls=self.tool_calls,
                            tool_call_id=self.tool_call_id, name=self.name)


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    """A template to render conversations with; ``source`` says where it came from, for the user to see."""

    template: bytes  # what llama.cpp's formatter takes: the model's template text, or a built-in name
    source: str  # "model" or "built-in <name> (the model file has no template)"
    jinja: JinjaTemplate | None = None  # the model's own template, run as it is written

    @classmethod
    def for_model(cls, model: Model) -> ChatTemplate:
        own = model.chat_template()
        if own:
            vocab = model.vocab
            try:
                jinja = JinjaTemplate(own, bos_token=_token_text(vocab, vocab.bos),
                                      eos_token=_token_text(vocab, vocab.eos))
            except TemplateError as exc:  # llama.cpp's reading of it is better than none
                return cls(own.encode(), f"llama.cpp's reading of the model's template ({exc})")
            return cls(own.encode(), "model", jinja)
        name = _BUILTIN_BY_ARCH.get(model.architecture, "chatml")
        return cls(name.encode(), f"built-in '{name}' (the model file has no chat template)")

    def apply(self, messages: Sequence[Message], *, add_assistant: bool = True, tools: Tools | None = None) -> str:
        """The conversation as text, as the model reads it."""
        if self.jinja is not None:
            return self.jinja.render([m.as_dict() for m in messages], tools=tools, add_generation_prompt=add_assistant)
        if tools or any(m.tool_calls or m.role == "tool" for m in messages):
            raise UserError("this model's chat template cannot show tools (its file has no template of its own)")
        return self._builtin(messages, add_assistant)

    def _builtin(self, messages: Sequence[Message], add_assistant: bool) -> str:
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

    def tokenize(self, vocab: Vocab, messages: Sequence[Message], *, add_assistant: bool = True,
                 tools: Tools | None = None) -> list[int]:
        """The conversation as tokens: the template's own markers are special tokens, the messages' text is text.

        Tokenizing the rendered string with special tokens parsed would let a message containing "<|im_end|>"
        close its turn and forge the next. So the template is rendered once more with a placeholder for each
        message's text (and for each string of the tools and tool calls that holds control-token text); control
        tokens are looked for in the template's pieces around the placeholders only (see ``_tokens``).
        """
        nonce = secrets.token_hex(6)
        while any(nonce in m.content for m in messages):
            nonce = secrets.token_hex(6)
        guard = _Guard(nonce, vocab)
        # calls' arguments become objects before they are guarded, so that both renderings agree on them
        # and so are a tool result's call id and name, which templates print too (Mistral's prints the id)
        marked = [Message(m.role, guard.mark(m.content), guard.leaves(_object_calls(m.tool_calls)),
                          guard.leaves(m.tool_call_id), guard.leaves(m.name)) for m in messages]
        marked_tools = guard.leaves(tools)
        skeleton = self.apply(marked, add_assistant=add_assistant, tools=marked_tools)
        found = re.compile("|".join(map(re.escape, guard.texts))) if guard.texts else None
        pieces = found.split(skeleton) if found else [skeleton]
        texts = [guard.texts[m] for m in found.findall(skeleton)] if found else []
        # Templates may transform the text they wrap (trim it, write it as JSON): the variant that renders exactly
        # as the template does is the text the model would have seen.
        rendered = self.apply(messages, add_assistant=add_assistant, tools=tools)
        texts = _align(pieces, texts, rendered) or texts
        # a template that writes the BOS itself ({{ bos_token }}) must not get a second one from the tokenizer
        bos_text = self.jinja.bos_token if self.jinja is not None else ""
        wants_bos = vocab.add_bos and vocab.bos >= 0 and not (bos_text and pieces[0].startswith(bos_text))
        return ([vocab.bos] if wants_bos else []) + _tokens(vocab, pieces, texts)


def _tokens(vocab: Vocab, pieces: Sequence[str], texts: Sequence[str]) -> list[int]:
    """The template's pieces with the texts between them, tokenized as llama.cpp tokenizes a whole string (cut at
    control tokens, each run of text between them tokenized alone), except that control tokens are looked for in
    the template's pieces only: the texts are always tokenized as text. So ordinary text gets exactly the tokens
    of the whole rendered string, "}" and a template's "\n" after it merging as they do there."""
    tokens: list[int] = []
    run: list[str] = []  # text since the last control token

    def flush() -> None:
        if run:
            tokens.extend(vocab.tokenize("".join(run), add_special=False, parse_special=False))
            run.clear()

    for i, piece in enumerate(pieces):
        pos = 0
        for t in vocab.tokenize(piece, add_special=False, parse_special=True):
            at = piece.find(vocab.token_text(t), pos) if vocab.is_control(t) else -1
            if at < 0:
                continue
            run.append(piece[pos:at])
            flush()
            tokens.append(t)
            pos = at + len(vocab.token_text(t))
        run.append(piece[pos:])
        if i < len(texts):
            run.append(texts[i])
    flush()
    return tokens


def _object_calls(calls: Sequence[Mapping[str, Any]] | None) -> tuple[Mapping[str, Any], ...] | None:
    return tuple(with_object_arguments(c) for c in calls) if calls else None


def _token_text(vocab: Vocab, token: int) -> str:
    return vocab.token_text(token) if 0 <= token < vocab.n_tokens else ""


class _Guard:
    """Placeholders for text that must stay text: every message's content, and the strings of tools and tool
    calls that hold control-token text (the rest stay as they are, so the template's own logic, which may test
    ``type == "function"``, and the tokens of ordinary JSON are unchanged)."""

    def __init__(self, nonce: str, vocab: Vocab) -> None:
        self.nonce, self.vocab = nonce, vocab
        self.texts: dict[str, str] = {}  # placeholder → the text it stands for

    def mark(self, text: str) -> str:
        if not text:  # nothing to guard, and a template may test it (Qwen's `if message.content`)
            return text
        mark = f"LOCALSPEC{self.nonce}TEXT{len(self.texts)}END"  # no spaces or quotes: survives a trim and JSON
        self.texts[mark] = text
        return mark

    def leaves(self, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, str):
            forged = self.vocab.tokenize(value, add_special=False, parse_special=True) != \
                self.vocab.tokenize(value, add_special=False, parse_special=False)
            return self.mark(value) if forged else value
        if isinstance(value, Mapping):  # keys too: a tool's parameter names and a call's argument keys are printed
            return {self.leaves(k) if isinstance(k, str) else k: self.leaves(v) for k, v in value.items()}
        if isinstance(value, tuple):
            return tuple(self.leaves(v) for v in value)
        if isinstance(value, list):
            return [self.leaves(v) for v in value]
        return value


def _variants(text: str) -> list[str]:
    return [text, text.strip(), json.dumps(text, ensure_ascii=False)[1:-1], json.dumps(text)[1:-1]]


def _align(pieces: Sequence[str], texts: Sequence[str], rendered: str) -> list[str] | None:
    """How each placeholder's text appears in ``rendered`` (as it is, trimmed, or JSON-escaped), read left to
    right between the skeleton's pieces; None where the rendering is not the skeleton with texts filled in."""
    if not rendered.startswith(pieces[0]):
        return None
    pos, out = len(pieces[0]), []
    for text, after in zip(texts, pieces[1:], strict=True):
        for variant in _variants(text):
            if rendered.startswith(variant, pos) and rendered.startswith(after, pos + len(variant)):
                out.append(variant)
                pos += len(variant) + len(after)
                break
        else:
            return None
    return out if pos == len(rendered) else None
