"""`run`'s structured-output options: --json-schema FILE|-, --grammar FILE, --regex PATTERN → a ConstraintSpec."""

from __future__ import annotations

import sys
from pathlib import Path

from localspec.errors import UserError
from localspec.schema import ConstraintSpec


def constraint_from_options(
    json_schema: str | None, grammar: Path | None, regex: str | None, *, stdin_taken: bool
) -> ConstraintSpec | None:
    """The one constraint the options ask for (None: free text); UserError for two at once or an unreadable file.
    ``stdin_taken``: the prompt is read from stdin, so the schema cannot be."""
    given = [name for name, value in (("--json-schema", json_schema), ("--grammar", grammar), ("--regex", regex))
             if value is not None]
    if len(given) > 1:
        raise UserError(f"give one of --json-schema, --grammar and --regex, not {' and '.join(given)}")
    if json_schema is not None:
        if json_schema == "-" and stdin_taken:
            raise UserError("the prompt is read from stdin already: give --json-schema a file")
        text = sys.stdin.read() if json_schema == "-" else _read(Path(json_schema), "--json-schema")
        return ConstraintSpec.json_schema(text, name=Path(json_schema).stem if json_schema != "-" else "")
    if grammar is not None:
        return ConstraintSpec("grammar", _read(grammar, "--grammar"))
    if regex is not None:
        return ConstraintSpec("regex", regex)
    return None


def _read(path: Path, option: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) else "it is not UTF-8 text"
        raise UserError(f"cannot read {option} {path}: {why}") from None
