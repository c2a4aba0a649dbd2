"""Tool calls (OpenAI's ``tools``, ``tool_choice``, ``parallel_tool_calls``): what the answer may hold, the
constraint that holds it there, and the calls read back out of it.

Two ways a model calls a tool:
- ``hermes``: its own chat template renders the tools and asks for ``<tool_call>{"name": …, "arguments": …}
  </tool_call>`` (Qwen2.5's); the template shows the tools, engine/chat.py renders it.
- ``json``: a model without such a template (the embedded Gemma): the tools are described in a system message and
  a call is a JSON object ``{"name": …, "arguments": …}`` (a list of them for parallel calls).

``tool_choice`` "required" or a named function constrains the whole answer to calls. "auto" leaves the text free
until a call starts, in the model's own habit (structured/call_shapes.py: the template's marker anywhere, or a call's
JSON naming an offered tool at the answer's start, bare, doubled or fenced); from there the grammar holds the call,
fed from where it began (structured/constraint.py), so it is valid and the answer ends after it. A JSON example in a
fence among other text (a config the user asked for), or JSON naming no tool, is never forced into a call, nor read
as one. Every call returned has arguments that parse and match its tool's parameters; anything else stays text.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from localspec.bounded_json import loads_or_none
from localspec.schema.defaults import with_defaults
from localspec.schema.json_style import DEFAULT, Separators, json_options
from localspec.schema.numbers import bounded_root
from localspec.schema.spec import TOOL_CALLS, ConstraintError, ConstraintSpec, capped_json
from localspec.structured.call_shapes import ANCHORED, heads, lark_forms, marked_blocks, whole_answer_json

CHOICES = ("none", "auto", "required")
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
TOOLS_MAX = 128  # OpenAI's own limit: each tool's parameters are a schema to compile
# a tools list's JSON: a coding agent's dozens of tools with long descriptions pass 64 KiB; what is compiled is each
# tool's parameters, each bounded by the schema cap (schema.spec.TEXT_MAX), and the descriptions are only prompt
TOOLS_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class ToolUse:
    """What a request allows: its tools (OpenAI tool dicts, as JSON), the choice ("auto", "required", or a
    function's name) and whether several calls may come at once."""

    tools_json: str
    choice: str = "auto"
    parallel: bool = True

    @property
    def tools(self) -> list[dict[str, Any]]:
        return json.loads(self.tools_json)

    def functions(self) -> dict[str, dict[str, Any]]:
        return {t["function"]["name"]: t["function"] for t in self.tools}

    def names(self) -> list[str]:
        """The tools a call may name: all, or the one ``tool_choice`` names."""
        return [name for name in self.functions() if self.choice in ("auto", "required", name)]

    def call_schema(self) -> dict[str, Any]:
        """One call: {"name": a tool's name, "arguments": that tool's parameters}."""
        functions = self.functions()
        variants = [{"type": "object", "properties": {"name": {"const": name}, "arguments": with_defaults(
                         functions[name].get("parameters") or {"type": "object"})},
                     "required": ["name", "arguments"], "additionalProperties": False} for name in self.names()]
        return variants[0] if len(variants) == 1 else {"anyOf": variants}

    def constraint(self, style: str, open_token: int | None, close_token: int | None,
                   separators: Separators = DEFAULT) -> ConstraintSpec:
        """The grammar of the answer, its JSON spaced with ``separators`` (the prompt's, schema/json_style.py), its
        numbers bounded: calls only ("required", a name), or ("auto") free text until a call starts
        (structured/call_shapes.py: the template's marker anywhere, a call's JSON at the answer's start), from
        where the call began on. Either way the answer ends when its calls are complete: after the last, only the
        end of the turn or one more call (where ``parallel``)."""
        # inside a Lark grammar the schema carries its JSON options itself
        schema = json.dumps({"x-guidance": json_options(separators), **bounded_root(self.call_schema())})
        call = f"call: %json {schema}"
        item, key = separators
        starts = tuple(ANCHORED + head for head in heads(self.names(), key, self.parallel))
        forms = lark_forms("call", item, self.parallel)
        if style == "hermes":
            opening = f"<[{open_token}]>" if open_token is not None else '"<tool_call>"'
            closing = f"<[{close_token}]>" if close_token is not None else '"</tool_call>"'
            block = f'"\\n"? call "\\n"? {closing}'  # an opener closes with its own closer
            # one newline between calls and after the last, never free whitespace: a model that wants text after its
            # calls ends there (Constraint: a forbidden token where the grammar may end is the end)
            more = f' ("\\n"? {opening} {block})*' if self.parallel else ""
            marked = f'marked: {opening} {block}{more} "\\n"?'
            if self.choice != "auto":
                return ConstraintSpec("grammar", f"start: marked\n{marked}\n{call}", TOOL_CALLS)
            marker = f"<[{open_token}]>" if open_token is not None else HERMES_OPEN
            return ConstraintSpec("grammar", f"start: lead? (marked | anchored)\n{marked}\n{forms}\n{call}",
                                  TOOL_CALLS, (marker, *starts))
        if self.choice == "auto":  # no marker: only a call's JSON at the answer's start starts the grammar
            return ConstraintSpec("grammar", f"start: lead? anchored\n{forms}\n{call}", TOOL_CALLS, starts)
        one = self.call_schema()
        whole = {"anyOf": [one, {"type": "array", "items": one, "minItems": 1}]} if self.parallel else one
        whole_json = json.dumps({"x-guidance": json_options(separators), **bounded_root(whole)})
        return ConstraintSpec("grammar", f"start: %json {whole_json}", TOOL_CALLS)

    def system_text(self, separators: Separators = DEFAULT) -> str:
        """For a template that cannot show tools: the tools and how to call them, in words the model can follow;
        its JSON spaced as the grammar will space the call."""
        item, key = separators
        lines = ["You can call these tools (functions):"]
        for f in self.functions().values():
            lines.append(json.dumps({"name": f["name"], "description": f.get("description", ""),
                                     "parameters": f.get("parameters") or {}}, separators=separators))
        lines.append(f'To call one, answer with only a JSON object: {{"name"{key}<the tool\'s name>{item}"arguments"'
                     f"{key}<its arguments>}}" + (", or a JSON list of such objects for several calls."
                                                  if self.parallel else "."))
        if self.choice == "required":
            lines.append("You must call a tool.")
        elif self.choice not in CHOICES:
            lines.append(f"You must call {self.choice}.")
        return "\n".join(lines)


def read_tools(tools: Any, tool_choice: Any, parallel: Any) -> ToolUse | None:
    """OpenAI's fields → ToolUse (None: no tools, or tool_choice "none"); ConstraintError naming the field."""
    if tools in (None, []):
        if tool_choice not in (None, "none", "auto"):
            raise ConstraintError("tool_choice needs tools: give the tools it may call", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise ConstraintError("tools must be a list of {\"type\": \"function\", \"function\": {...}}", "tools")
    if len(tools) > TOOLS_MAX:
        raise ConstraintError(f"tools holds {len(tools)} tools, over the {TOOLS_MAX} a request may have", "tools")
    capped_json(tools, "tools list", "tools", ensure_ascii=False, cap=TOOLS_BYTES)
    names = []
    for i, tool in enumerate(tools):
        f = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(tool, Mapping) or tool.get("type") != "function" or not isinstance(f, Mapping) \
                or not isinstance(f.get("name"), str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", f["name"]):
            raise ConstraintError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": "
                                  "letters, digits, _ . - (at most 64), \"parameters\": a JSON schema}}", f"tools.{i}")
        params = f.get("parameters")
        if params is not None and not isinstance(params, Mapping):
            raise ConstraintError(f"tools[{i}].function.parameters must be a JSON schema object",
                                  f"tools.{i}.function.parameters")
        names.append(f["name"])
    if len(set(names)) != len(names):
        raise ConstraintError("tools: two tools have the same name", "tools")
    choice = "auto" if tool_choice is None else tool_choice
    if isinstance(choice, Mapping):
        f = choice.get("function")
        name = f.get("name") if isinstance(f, Mapping) else None
        if choice.get("type") != "function" or name not in names:
            raise ConstraintError(f"tool_choice names no tool of this request (tools: {', '.join(names)})",
                                  "tool_choice")
        choice = name
    elif choice not in CHOICES:
        raise ConstraintError("tool_choice must be none, auto, required or {\"type\": \"function\", \"function\": "
                              "{\"name\": …}}", "tool_choice")
    if choice == "none":
        return None
    if parallel is not None and not isinstance(parallel, bool):
        raise ConstraintError("parallel_tool_calls must be true or false", "parallel_tool_calls")
    use = ToolUse(json.dumps(list(tools)), choice, parallel is not False)
    for name, f in use.functions().items():  # each tool's parameters compile, or the error names the tool
        try:
            ConstraintSpec.json_schema(f.get("parameters") or {"type": "object"}, name).grammar()
        except ConstraintError as e:
            raise ConstraintError(f"tool {name!r}: {e}", "tools") from None
    return use


@dataclass(frozen=True, slots=True)
class Calls:
    """An answer read for calls: the text before them (None where the answer is only calls) and the calls."""

    content: str | None
    calls: tuple[dict[str, Any], ...]


def read_calls(text: str, use: ToolUse, valid: Any, ids: tuple[str, ...] = ()) -> Calls:
    """The calls in ``text`` (the answer, with ``<tool_call>`` markers written out), in the shapes
    structured/call_shapes.py lists, each checked by ``valid(name, arguments) -> bool`` against its tool; the answer
    as plain text where it holds no valid call. ``ids``: the calls' ids where a stream already gave them."""
    functions = use.functions()
    found = list(marked_blocks(text, HERMES_OPEN, HERMES_CLOSE))
    if not found:  # the whole answer as a call: bare JSON, doubled, or alone in one fence
        value = whole_answer_json(text)
        if value is not None:
            found.append((0, value))
    calls: list[dict[str, Any]] = []
    start = len(text)
    for at, value in found:
        for call in value if isinstance(value, list) else [value]:
            if not isinstance(call, Mapping) or call.get("name") not in functions:
                return Calls(text, ())
            arguments = call.get("arguments", {})
            if isinstance(arguments, str):
                arguments = _loads(arguments)
            if not isinstance(arguments, Mapping) or not valid(call["name"], arguments):
                return Calls(text, ())
            i = len(calls)
            calls.append({"id": ids[i] if i < len(ids) else new_call_id(), "type": "function",
                          "function": {"name": call["name"], "arguments": json.dumps(arguments, ensure_ascii=False)}})
        start = min(start, at)
    if not calls:
        return Calls(text, ())
    content = text[:start].strip()
    return Calls(content or None, tuple(calls))


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _loads(text: str) -> Any:
    return loads_or_none(text.strip())
