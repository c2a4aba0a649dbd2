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


def bounded(schema: Any) -> Any:
    """``schema`` with every number leaf bounded as above (a new object; ``schema`` is not changed)."""
    if not isinstance(schema, Mapping):
        return schema
    out = map_subschemas(schema, lambda sub, key: bounded(sub), skip=_UNBOUNDED)
    types = out.get("type")
    types = set(types) if isinstance(types, list) else {types}
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
