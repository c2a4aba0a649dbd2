"""Where a schema says nothing, it means what llama.cpp's grammar makes of it: an object that lists its properties
takes no others (schema/defaults.py), in the grammar an answer is held to and in the check of a call."""

from __future__ import annotations

from pathlib import Path

import pytest

from localspec.schema.defaults import with_defaults
from localspec.structured.grammars import Grammars
from tests.lossless import checking_model

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city"]}


def test_objects_that_list_properties_are_closed_unless_they_say_otherwise() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {}}},
                                               "list": {"type": "array", "items": {"properties": {"x": {}}}},
                                               "open": {"properties": {"y": {}}, "additionalProperties": True}},
              "$defs": {"d": {"properties": {"z": {}}}}, "allOf": [{"properties": {"w": {}}}]}
    out = with_defaults(schema)
    assert "additionalProperties" not in schema  # the argument is left as it was
    assert out["properties"]["a"]["additionalProperties"] is False
    assert out["properties"]["list"]["items"]["additionalProperties"] is False
    assert out["properties"]["open"]["additionalProperties"] is True
    assert out["$defs"]["d"]["additionalProperties"] is False
    # a branch of allOf is one part of the object: closing it would forbid the other parts' properties
    assert "additionalProperties" not in out["allOf"][0] and "additionalProperties" not in out
    assert with_defaults({"type": "object"}) == {"type": "object"}  # any JSON object stays any


@pytest.fixture(scope="module")
def grammars(model_path: Path) -> Grammars:
    return Grammars(checking_model(model_path).vocab)


def test_a_call_with_a_key_its_tool_does_not_list_is_no_call(grammars: Grammars) -> None:
    assert grammars.matches(WEATHER, {"city": "Paris", "unit": "celsius"})
    assert not grammars.matches(WEATHER, {"city": "Paris", "unit": "celsius", "type": "object"})
    assert grammars.matches({**WEATHER, "additionalProperties": True}, {"city": "Paris", "type": "object"})
    assert not grammars.matches(WEATHER, {"city": "\ud800"})  # a lone surrogate is no JSON text: no call, no error
