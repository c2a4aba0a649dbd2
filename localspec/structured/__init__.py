"""Structured output: answers held to a JSON schema, a grammar or a regex, and verified drafts that the grammar
forces. ``spec`` is what a request asks (plain data, no model); ``constraint`` is one generation's live state,
consulted by the speculation loop; ``grammars`` builds those per model."""

from localspec.structured.spec import ConstraintError, ConstraintSpec

__all__ = ["ConstraintError", "ConstraintSpec"]
