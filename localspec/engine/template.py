"""The model's own chat template (the GGUF's ``tokenizer.chat_template``), rendered with Jinja as Hugging Face does.

llama.cpp's ``llama_chat_apply_template`` does not run a template: it recognises one by its markers and renders a
built-in format, so Qwen's default system message and its tool section never appear. This renders the template
itself, in the sandbox and with the helpers HF's ``apply_chat_template`` gives it (``raise_exception``,
``strftime_now``, ``tojson``, loop controls, a no-op ``{% generation %}``), and with what templates read:
``messages`` (dicts: role, content, and where given tool_calls, tool_call_id, name), ``tools`` (OpenAI tool dicts,
or None), ``add_generation_prompt``, ``bos_token`` and ``eos_token``, plus any extra variables.

It renders text only; engine/chat.py turns that into tokens without letting message text forge control tokens.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from localspec.bounded_json import loads_or_none
from localspec.errors import UserError


class TemplateError(UserError):
    """A chat template that cannot be compiled or that refused the conversation (its ``raise_exception``)."""


class _Generation(Extension):
    """``{% generation %}…{% endgeneration %}``: HF marks assistant text for training masks with it; rendering
    keeps the body unchanged."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str) -> None:
    raise TemplateError(f"the model's chat template refused the conversation: {message}")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # HF's own filter: jinja2's built-in tojson escapes <, >, & and ' for HTML, which the model never saw in training
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class JinjaTemplate:
    """One compiled chat template; ``render`` is cheap after the first compile."""

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "") -> None:
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"the model's chat template does not compile: {exc}") from None
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render(self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None = None,
               add_generation_prompt: bool = True, **extra: Any) -> str:
        """The conversation as the template writes it. ``messages`` are dicts as HF takes them (``message_dicts``
        makes them from Messages); ``tools`` is passed as given (None or empty: no tools)."""
        try:
            return self._template.render(
                messages=list(messages), tools=list(tools) if tools else None,
                add_generation_prompt=add_generation_prompt, bos_token=self.bos_token, eos_token=self.eos_token,
                **extra,
            )
        except TemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise TemplateError(f"the model's chat template failed on this conversation: {exc}") from None
        except (TypeError, KeyError, IndexError, AttributeError, ValueError) as exc:
            # a template that indexes what this conversation lacks (messages[0] of none, a missing key)
            raise TemplateError(f"the model's chat template failed on this conversation: {exc}") from None


def message_dict(role: str, content: str | None, *, tool_calls: Sequence[Mapping[str, Any]] | None = None,
                 tool_call_id: str | None = None, name: str | None = None) -> dict[str, Any]:
    """A message as HF templates read it: only the fields that are set, tool calls' arguments as objects."""
    out: dict[str, Any] = {"role": role, "content": content}
    if tool_calls:
        out["tool_calls"] = [with_object_arguments(c) for c in tool_calls]
    if tool_call_id is not None:
        out["tool_call_id"] = tool_call_id
    if name is not None:
        out["name"] = name
    return out


def with_object_arguments(call: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI sends a call's arguments as a JSON string; HF templates (Qwen's: ``arguments | tojson``) expect the
    object, as llama.cpp's server gives them. A string that is not JSON stays a string."""
    call = dict(call)
    function = call.get("function")
    if isinstance(function, Mapping) and isinstance(function.get("arguments"), str):
        value = loads_or_none(function["arguments"])
        if value is not None:
            call["function"] = {**function, "arguments": value}
    return call
