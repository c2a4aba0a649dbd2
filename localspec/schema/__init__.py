"""What a request asks of its answer's form: a JSON schema, a regex, a grammar, tool calls (``spec``), and how the
JSON is written (``json_style``, ``numbers``, ``defaults``). Plain data, compiled and checked by llguidance without a
model, so a bad schema is an error before anything loads; structured/ holds a generation's live grammar."""

from localspec.schema.spec import ConstraintError, ConstraintSpec

__all__ = ["ConstraintError", "ConstraintSpec"]
