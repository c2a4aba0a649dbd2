"""What a JSON schema means where it says nothing, as llama.cpp's json-schema-to-grammar reads it: the defaults
that keep a small model's answer from running on, applied before llguidance compiles the schema.

- An object that lists its ``properties`` and says nothing of ``additionalProperties`` takes no others. JSON Schema
  allows any by default; llama.cpp's grammar does not, and a 270M model given the choice writes the tool's own
  schema into its arguments (``"type": "object", "properties": {…}``) until its tokens run out.

The answer stays valid under the schema as written: these only narrow what the grammar admits.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

# the keywords whose values are sub-schemas: a mapping of names to them, a list of them, or one (or a list: draft
# 4's tuple "items")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONES = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
                "unevaluatedProperties", "unevaluatedItems", "additionalItems")


def map_subschemas(schema: Mapping[str, Any], visit: Callable[[Any, str], Any],
                   skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """A copy of ``schema`` with ``visit(sub, keyword)`` in place of each of its direct sub-schemas; the keywords
    in ``skip`` are kept as they are. The one walk over a schema's structure (numbers.py rewrites with it too)."""
    out = dict(schema)
    for key, value in schema.items():
        if key in skip:
            continue
        if key in _SCHEMA_MAPS and isinstance(value, Mapping):
            out[key] = {name: visit(sub, key) for name, sub in value.items()}
        elif (key in _SCHEMA_LISTS or key in _SCHEMA_ONES) and isinstance(value, list):
            out[key] = [visit(sub, key) for sub in value]
        elif key in _SCHEMA_ONES:
            out[key] = visit(value, key)
    return out


def with_defaults(schema: Any, close: bool = True) -> Any:
    """``schema`` with llama.cpp's defaults where it says nothing (a new object; the argument is left as it is).
    ``close`` False: a branch of an ``allOf``, whose properties the other branches add to."""
    if not isinstance(schema, Mapping):
        return schema
    out = map_subschemas(schema, lambda sub, key: with_defaults(sub, key != "allOf"))
    if close and isinstance(out.get("properties"), Mapping) and "additionalProperties" not in out \
            and "unevaluatedProperties" not in out and not isinstance(out.get("allOf"), list):
        out["additionalProperties"] = False
    return out
