"""Numbers a model cannot run on forever: a JSON schema rewritten so that every number has a bounded integer part
and fraction, as llama.cpp's json-schema-to-grammar bounds them.

Without a bound a small model under a schema may write ``1000000000000…`` or ``0.3333…`` up to max_tokens (a
tool call that never closes). llguidance (1.9) has no option for digits, but it compiles ``minimum``/``maximum``
and ``multipleOf`` into the number's regex, so each number leaf gets what its schema leaves open:

- ``minimum``/``maximum`` of ±``INTEGER_BOUND``, each only where the schema gives no bound on that side: at most
  16 integer digits (llama.cpp's ``[1-9][0-9]{0,15}``). 9999999999999998, not …9: bounds are read as doubles
  there, and 9999999999999999 would be 1e16, which lets a 17th digit in.
- ``multipleOf`` ``FRACTION_STEP`` (1e-10) on a ``number`` without its own ``multipleOf``: at most 10 fraction
  digits, trailing zeros included. llama.cpp allows 16; llguidance reads ``multipleOf`` as a double and refuses
  every step finer than 1e-10 ("too many digits"), so 10 is the bound it can hold.

Open leaves are bounded too (``bounded_root``, at a schema's root): ``{}``, an object that takes any properties (a
tool with no parameters), an array of anything. llguidance's own "any" leaves their numbers open, so each points to
``ANY_JSON`` kept in the root's ``$defs``.

Exponents (``1e5``) are no longer written where a leaf is bounded (llguidance's bounded numbers are plain
decimals). Sub-schemas under ``not`` and ``if`` are left alone (a bound there would change what they select), and
so are values (``const``, ``enum``, ``default``, ``examples``). ``ANY_JSON`` is "any JSON value" with the same
bounds, for ``json_object``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from localspec.schema.defaults import map_subschemas

INTEGER_BOUND = 9_999_999_999_999_998
FRACTION_STEP = 1e-10

# sub-schemas left as they are: a bound under not or if changes what they select; a property name is a string
_UNBOUNDED = ("not", "if", "propertyNames")


def _types(schema: Mapping[str, Any]) -> set[str]:
    """The type names a schema's ``type`` gives (a name or a list of them); anything else there names none (the
    grammar engine then says what is wrong with it)."""
    raw = schema.get("type")
    return {t for t in (raw if isinstance(raw, list) else [raw]) if isinstance(t, str)}


def bounded(schema: Any) -> Any:
    """``schema`` with every number leaf bounded as above (a new object; ``schema`` is not changed)."""
    if not isinstance(schema, Mapping):
        return schema
    out = map_subschemas(schema, lambda sub, key: bounded(sub), skip=_UNBOUNDED)
    types = _types(out)
    if types & {"number", "integer"}:
        low = _bound(out, "minimum", "exclusiveMinimum")
        high = _bound(out, "maximum", "exclusiveMaximum")
        if low is None and (high is None or high > -INTEGER_BOUND):  # never an empty range
            out["minimum"] = -INTEGER_BOUND
        if high is None and (low is None or low < INTEGER_BOUND):
            out["maximum"] = INTEGER_BOUND
        if "number" in types and "multipleOf" not in out:
            out["multipleOf"] = FRACTION_STEP
    return out


def _bound(schema: Mapping[str, Any], inclusive: str, exclusive: str) -> float | None:
    """The schema's own bound on one side, or None (draft 4's boolean exclusiveMinimum is no bound)."""
    for key in (inclusive, exclusive):
        value = schema.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
    return None


# any JSON value, its numbers bounded: json_object's values (llguidance's own "any" leaves numbers open)
ANY_JSON: dict[str, Any] = {"anyOf": [
    {"type": "null"}, {"type": "boolean"}, bounded({"type": "number"}), {"type": "string"},
    {"type": "array", "items": {"$ref": "#/$defs/any"}},
    {"type": "object", "additionalProperties": {"$ref": "#/$defs/any"}},
]}
ANY_OBJECT: dict[str, Any] = {"$defs": {"any": ANY_JSON}, "type": "object",
                              "additionalProperties": {"$ref": "#/$defs/any"}}


# where a schema's open leaves point: any JSON value with bounded numbers, kept in the root's $defs
ANY_DEF = "localspec_any"
_ANY_REF = {"$ref": f"#/$defs/{ANY_DEF}"}
# keywords that say nothing of a value: a schema with only these takes any value
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment", "deprecated", "readOnly",
                          "writeOnly", "x-guidance"})


def bounded_root(schema: Any) -> Any:
    """A whole schema with every number bounded: each number leaf as ``bounded`` bounds it, and each open leaf too
    (``{}``, an object that takes any properties, an array of anything: a tool with no parameters is one), through
    ``ANY_JSON`` kept in the root's ``$defs``. llguidance's own "any" leaves numbers open, where a small model may
    write digits to the end of its tokens."""
    if not isinstance(schema, Mapping):
        return schema
    numbers = bounded(schema)
    out = _close_open_leaves(numbers)
    if out == numbers:  # no open leaf: the schema as ``bounded`` writes it
        return numbers
    defs = dict(out.get("$defs") or {}) if isinstance(out.get("$defs"), Mapping) else {}
    defs[ANY_DEF] = {"anyOf": [{"type": "null"}, {"type": "boolean"}, bounded({"type": "number"}),
                               {"type": "string"}, {"type": "array", "items": _ANY_REF},
                               {"type": "object", "additionalProperties": _ANY_REF}]}
    return {**out, "$defs": defs}


def _close_open_leaves(schema: Any) -> Any:
    if isinstance(schema, bool):
        return _ANY_REF if schema else schema
    if not isinstance(schema, Mapping):
        return schema
    if not set(schema) - _ANNOTATIONS:  # {}: any value
        return {**schema, **_ANY_REF}
    out = map_subschemas(schema, lambda sub, key: _close_open_leaves(sub), skip=_UNBOUNDED)
    types = _types(out)
    if "object" in types and "properties" not in out and "patternProperties" not in out \
            and out.get("additionalProperties", True) is True:
        out["additionalProperties"] = _ANY_REF
    if "array" in types and "prefixItems" not in out and out.get("items", True) is True:
        out["items"] = _ANY_REF
    return out

