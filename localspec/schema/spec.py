"""What a request asks its answer to match: a JSON schema, any JSON object, a grammar (GBNF or Lark) or a regex.

A ``ConstraintSpec`` is plain data (it rides in GenerationSettings, hashable); ``grammar()`` compiles it into
llguidance's grammar and checks it, without a model, so a bad schema or grammar is an error before anything loads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from localspec.bounded_json import loads
from localspec.errors import STOPPING, UserError
from localspec.schema.cache import BoundedCache
from localspec.schema.defaults import with_defaults
from localspec.schema.json_style import DEFAULT, Separators, json_options, separators_of
from localspec.schema.numbers import ANY_OBJECT, bounded_root

Kind = Literal["json_schema", "json_object", "grammar", "regex"]
KINDS: tuple[Kind, ...] = ("json_schema", "json_object", "grammar", "regex")
# llguidance's JSON options where no prompt decides the separators (schema/json_style.py)
JSON_OPTIONS = json_options(DEFAULT)
# the most bytes a schema, a grammar or a regex may have (a tools list: structured/tools.py): far above any real one,
# and what one request may make a server compile (docs/architecture.md, "Requests that cannot hurt each other")
TEXT_MAX = 64 * 1024
# the name of a tool call's grammar (structured/tools.py): its answer ends where the model leaves its calls
TOOL_CALLS = "tool_calls"
# compiled grammars kept, by their spec's text and grammar's bytes: a server's clients may send a new schema each time
_CACHE: BoundedCache[ConstraintSpec, str | ConstraintError] = BoundedCache(
    256, 16 * 1024 * 1024, lambda spec, grammar: len(spec.text) + (len(grammar) if isinstance(grammar, str) else 0))


class ConstraintError(UserError):
    """A schema, grammar or regex that cannot be used; ``param``: the request field it came from (serve's 400)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def too_big(what: str, param: str, cap: int = TEXT_MAX) -> ConstraintError:
    return ConstraintError(f"the {what} is over the {cap:,} bytes a request may have", param)


def capped_json(value: Any, what: str, param: str, ensure_ascii: bool = True, cap: int = TEXT_MAX) -> str:
    """``value`` as json.dumps writes it; ConstraintError (``what``, ``param``) once past ``cap`` bytes.

    Written a piece at a time by json's Python encoder, and given up at the cap: json.dumps is one C call that holds
    the GIL throughout (~40 ms for a 1 MB schema on a 2-core EPYC), and a server's event loop would wait as long.
    """
    pieces, n = [], 0
    for piece in json.JSONEncoder(ensure_ascii=ensure_ascii).iterencode(value):
        n += len(piece)  # characters, never more than its bytes
        if n > cap:
            raise too_big(what, param, cap)
        pieces.append(piece)
    text = "".join(pieces)
    if not ensure_ascii and len(text.encode("utf-8", "surrogatepass")) > cap:
        raise too_big(what, param, cap)
    return text


@dataclass(frozen=True, slots=True)
class ConstraintSpec:
    """``text``: the schema as JSON, the grammar or the regex; ``name``: the schema's name (OpenAI's)."""

    kind: Kind
    text: str = ""
    name: str = ""
    # the grammar holds only from the first of these in the answer on (text, or a token as "<[id]>"; "^text": the
    # answer's start, after a little whitespace): before it the text is free (a tool call after its trigger,
    # structured/tools.py), and from it the grammar is fed the text from where the trigger began; () holds the
    # whole answer
    triggers: tuple[str, ...] = ()
    # how a JSON kind's answer is spaced, (item, key): as the prompt's own JSON (follow_prompt); a
    # schema's own "x-guidance" goes over it
    separators: Separators = DEFAULT
    # a JSON schema's numbers as it writes them, not bounded (schema/numbers.py): for checking JSON the grammar did
    # not write (a call read back from free text), which the bounds would refuse where the schema takes it
    as_written: bool = False

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | str, name: str = "",
                    separators: Separators = DEFAULT, as_written: bool = False) -> ConstraintSpec:
        if isinstance(schema, str):
            try:
                schema = loads(schema)
            except ValueError as e:
                raise ConstraintError(f"the JSON schema is not valid JSON: {e}") from None
        if not isinstance(schema, Mapping):
            raise ConstraintError("a JSON schema must be a JSON object")
        # key order kept: the answer's properties come in the schema's order
        what = f"JSON schema {name!r}" if name else "JSON schema"
        return cls("json_schema", capped_json(schema, what, "response_format.json_schema"), name,
                   separators=separators, as_written=as_written)

    @classmethod
    def of(cls, value: Any) -> ConstraintSpec | None:
        """OpenAI's ``response_format`` (``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``,
        ``{"type": "json_object"}``, ``{"type": "text"}``), localspec's ``{"type": "grammar", "grammar": GBNF or
        Lark}`` and ``{"type": "regex", "regex": ...}``, a pydantic model class, or a ConstraintSpec. Checked."""
        if value is None or isinstance(value, ConstraintSpec):
            spec = value
        elif hasattr(value, "model_json_schema"):  # a pydantic model, as the openai client's parse() takes
            spec = cls.json_schema(value.model_json_schema(), getattr(value, "__name__", ""))
        elif not isinstance(value, Mapping):
            raise ConstraintError("response_format must be an object such as {\"type\": \"json_object\"}")
        else:
            spec = _from_mapping(value)
        if spec is not None:
            spec.check_size()
            spec.grammar()
        return spec

    def check_size(self) -> None:
        """ConstraintError past TEXT_MAX: what one request may make a server compile is bounded."""
        if len(self.text.encode("utf-8", "surrogatepass")) > TEXT_MAX:
            field = "response_format." + {"json_schema": "json_schema", "json_object": "type"}.get(self.kind, self.kind)
            raise too_big(self.describe(), field)

    def describe(self) -> str:
        return {"json_schema": f"JSON schema {self.name!r}" if self.name else "JSON schema",
                "json_object": "JSON object", "grammar": "grammar", "regex": "regex"}[self.kind]

    def grammar(self) -> str:
        """llguidance's grammar for this spec; ConstraintError (naming where) if it cannot compile."""
        return _compiled(self)


def follow_prompt(spec: ConstraintSpec | None, texts: Iterable[str]) -> ConstraintSpec | None:
    """``spec`` with the separators of the prompt's JSON, where it is a JSON kind (a grammar or a regex says its
    own spacing); None stays None."""
    if spec is None or spec.kind not in ("json_schema", "json_object"):
        return spec
    return replace(spec, separators=separators_of(texts))


def _from_mapping(value: Mapping[str, Any]) -> ConstraintSpec | None:
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return ConstraintSpec("json_object")
    if kind == "json_schema":
        inner = value.get("json_schema")
        if not isinstance(inner, Mapping) or not isinstance(inner.get("schema", {}), Mapping):
            raise ConstraintError("response_format.json_schema must be an object with a schema object in it",
                                  "response_format.json_schema")
        name = inner.get("name") if isinstance(inner.get("name"), str) else ""
        return ConstraintSpec.json_schema(inner.get("schema") or {"type": "object"}, name)
    if kind in ("grammar", "regex"):
        text = value.get(kind)
        if not isinstance(text, str) or not text.strip():
            raise ConstraintError(f"response_format.{kind} must be a non-empty string", f"response_format.{kind}")
        return ConstraintSpec(kind, text)
    raise ConstraintError("response_format.type must be text, json_object, json_schema, grammar or regex, got "
                          f"{kind!r}", "response_format.type")


def _compiled(spec: ConstraintSpec) -> str:
    """The spec's grammar, compiled once: failures are kept too (naming where one fails costs a compile a node).
    llguidance raises ValueError for what its parsers refuse (a schema nested past their depth), and the schema's
    rewrites (defaults, numbers) recurse once a level: either is a ConstraintError. So is a panic of llguidance's
    Rust code (pyo3's PanicException, a BaseException: 1.9.1 panics cutting its own message inside a character, on
    a long non-ASCII string where a number belongs), found by tests/test_fuzz.py."""
    known = _CACHE.get(spec)
    if known is None:
        try:
            known = _compile(spec)
        except ConstraintError as e:
            known = e
        except (ValueError, RecursionError) as e:
            known = ConstraintError(f"the {spec.describe()} cannot be used: {_one_line(str(e))}")
        except STOPPING:
            raise
        except BaseException as e:  # noqa: B036 (llguidance's panics are BaseExceptions: see above)
            known = ConstraintError(f"the {spec.describe()} cannot be used (the grammar engine failed on it: "
                                    f"{type(e).__name__}: {_one_line(str(e))[:200]})")
        _CACHE.put(spec, known)
    if isinstance(known, ConstraintError):
        raise ConstraintError(str(known), known.param)
    return known


def _compile(spec: ConstraintSpec) -> str:
    from llguidance import LLMatcher
    from llguidance.gbnf_to_lark import gbnf_to_lark

    if spec.kind == "json_object":
        grammar = _json_grammar(ANY_OBJECT, spec.separators)
    elif spec.kind == "json_schema":
        grammar = _json_grammar(with_defaults(json.loads(spec.text)), spec.separators, bound=not spec.as_written)
    elif spec.kind == "regex":
        try:
            re.compile(spec.text)
        except re.error as e:
            raise ConstraintError(f"the regex does not compile: {e.msg} at position {e.pos}") from None
        grammar = LLMatcher.grammar_from_regex(spec.text)
    elif spec.kind == "grammar":
        text = spec.text
        if "::=" in text:  # llama.cpp's GBNF; else Lark (llguidance's own syntax)
            try:
                text = gbnf_to_lark(text)
            except Exception as e:  # its parser raises plain exceptions with the line in the message
                raise ConstraintError(f"the GBNF grammar does not parse: {_one_line(str(e))}") from None
        grammar = LLMatcher.grammar_from_lark(text)
    else:
        raise ConstraintError(f"unknown constraint kind {spec.kind!r}: one of {', '.join(KINDS)}")
    error = _error(grammar)
    if error:
        where = _place(json.loads(spec.text), "") if spec.kind == "json_schema" else ""
        at = f" (at {where})" if where else ""
        raise ConstraintError(f"the {spec.describe()} cannot be used{at}: {_one_line(error)}")
    return grammar


def _json_grammar(schema: Any, separators: Separators, bound: bool = True) -> str:
    """The schema's grammar with its numbers bounded (schema/numbers.py; not where ``bound`` is False); where the
    bounds cannot compile beside the schema's own (a minimum above the bound), the schema as it is, so that its
    errors are its own."""
    from llguidance import LLMatcher

    options = json_options(separators)
    rewritten = bounded_root(schema) if bound else schema
    if rewritten != schema:
        try:
            grammar = LLMatcher.grammar_from_json_schema(json.dumps(rewritten), defaults=options)
            if not _error(grammar):
                return grammar
        except ValueError:
            pass
    return LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=options)


def _error(grammar: str) -> str:
    from llguidance import LLMatcher

    error = LLMatcher.validate_grammar(grammar)
    return "" if not error or error.startswith("WARNING") else error


def _place(schema: Any, path: str) -> str:
    """Where in a failing schema the failure is: the deepest sub-schema that fails on its own (a dotted path such
    as ``properties.items.items``); "" for the root. A sub-schema that needs its root ($ref) is not tried alone."""
    from llguidance import LLMatcher

    if not isinstance(schema, Mapping) or "$ref" in json.dumps(schema):
        return path
    children: list[tuple[str, Any]] = []
    for key in ("properties", "$defs", "definitions", "patternProperties"):
        if isinstance(schema.get(key), Mapping):
            children += [(f"{key}.{name}", sub) for name, sub in schema[key].items()]
    for key in ("items", "additionalProperties", "not"):
        if isinstance(schema.get(key), Mapping):
            children.append((key, schema[key]))
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        if isinstance(schema.get(key), list):
            children += [(f"{key}.{i}", sub) for i, sub in enumerate(schema[key])]
    for name, sub in children:
        if isinstance(sub, Mapping):
            try:
                failed = bool(_error(LLMatcher.grammar_from_json_schema(json.dumps(sub), defaults=JSON_OPTIONS)))
            except ValueError:
                failed = True
            if failed:
                return _place(sub, f"{path}.{name}" if path else name)
    return path


def _one_line(text: str) -> str:
    return " ".join(text.split())[:400]
