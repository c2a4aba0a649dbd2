"""Benchmark suites: JSONL files of prompts, one object a line, grouped in the report by their category.

A row is ``{"id": str, "category": str, "prompt": str, "max_tokens": int?, "schema": object?, "chat": bool?,
"prediction": str?}``; a row with a JSON schema is answered under it (structured output), by every drafter and by
target-only alike. ``chat``: the prompt is a user message, put through the model's own chat template (so one row
fits every model). ``prediction``: what the answer will mostly be (OpenAI's Predicted Outputs), and the row is run
with and without it (runner.py). Every problem is reported with the file and line it is on, so a hand-written suite
can be fixed without guessing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from localspec.errors import UserError
from localspec.schema import ConstraintSpec
from localspec.schema.json_style import separators_of

if TYPE_CHECKING:
    from localspec.opening import Checks

DEFAULT_SUITE = "default"
DEFAULT_MAX_TOKENS = 128  # for rows that do not say: long enough for speculation to settle, short enough to repeat
_REQUIRED = ("id", "category", "prompt")
_KNOWN = (*_REQUIRED, "max_tokens", "schema", "chat", "prediction")


@dataclass(frozen=True, slots=True)
class BenchPrompt:
    id: str
    category: str
    prompt: str
    max_tokens: int = DEFAULT_MAX_TOKENS
    constraint: ConstraintSpec | None = None  # the row's JSON schema, if it has one
    chat: bool = False  # the prompt is a user message in the model's chat template
    prediction: str | None = None  # what the answer will mostly be: the row runs with it and without it


@dataclass(frozen=True, slots=True)
class Suite:
    name: str  # the file it came from, or "default"
    prompts: tuple[BenchPrompt, ...]

    @property
    def categories(self) -> list[str]:
        """Categories in order of first appearance (the report's row order)."""
        return list(dict.fromkeys(p.category for p in self.prompts))

    def check(self, checks: Checks) -> None:
        """Every row's prompt fits the context and its prediction its bound, checked with the model's tokens before
        anything is measured; UserError naming the row."""
        for p in self.prompts:
            try:
                checks.fits(checks.prompt_tokens(p.prompt, chat=p.chat))
                checks.prediction_tokens(p.prediction)
            except UserError as e:
                raise UserError(f"{self.name}: row {p.id!r}: {e}") from None

    def with_max_tokens(self, max_tokens: int | None) -> Suite:
        """The same suite with every row's token budget replaced (``--max-tokens``); None keeps the rows'."""
        if max_tokens is None:
            return self
        return Suite(self.name, tuple(replace(p, max_tokens=max_tokens) for p in self.prompts))


def parse_suite(text: str, source: str) -> Suite:
    """Parse JSONL text; blank lines are skipped. Raises a UserError naming ``source:line`` and the problem."""
    prompts: list[BenchPrompt] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        prompt = _parse_row(line, f"{source}:{lineno}")
        if prompt.id in seen:
            raise UserError(f"{source}:{lineno}: duplicate id {prompt.id!r} (first on line {seen[prompt.id]})")
        seen[prompt.id] = lineno
        prompts.append(prompt)
    if not prompts:
        raise UserError(f"{source}: the suite is empty: add JSONL rows like "
                        '{"id": "q1", "category": "chat", "prompt": "…", "max_tokens": 64}')
    return Suite(source, tuple(prompts))


def _parse_row(line: str, where: str) -> BenchPrompt:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise UserError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(row, dict):
        raise UserError(f"{where}: expected a JSON object, got {type(row).__name__}")
    unknown = sorted(set(row) - set(_KNOWN))
    if unknown:
        # strict, so that a typo such as "max_token" does not silently fall back to the default budget
        raise UserError(f"{where}: unknown key {unknown[0]!r} (a row has {', '.join(_KNOWN)})")
    for key in _REQUIRED:
        if key not in row:
            raise UserError(f"{where}: missing {key!r}")
        value = row[key]
        if not isinstance(value, str) or not value.strip():
            raise UserError(f"{where}: {key!r} must be a non-empty string")
    max_tokens = row.get("max_tokens", DEFAULT_MAX_TOKENS)
    # bool is an int in Python: refuse `true` explicitly
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise UserError(f"{where}: 'max_tokens' must be a positive integer, got {json.dumps(max_tokens)}")
    constraint = None
    if "schema" in row:
        try:
            # spaced as the prompt's own JSON, as every face does (schema/json_style.py)
            constraint = ConstraintSpec.json_schema(row["schema"], row["id"], separators_of([row["prompt"]]))
            constraint.grammar()
        except UserError as e:
            raise UserError(f"{where}: {e}") from None
    chat = row.get("chat", False)
    if not isinstance(chat, bool):
        raise UserError(f"{where}: 'chat' must be true or false, got {json.dumps(chat)}")
    prediction = row.get("prediction")
    if prediction is not None and (not isinstance(prediction, str) or not prediction.strip()):
        raise UserError(f"{where}: 'prediction' must be a non-empty string (what the answer will mostly be)")
    return BenchPrompt(row["id"], row["category"], row["prompt"], max_tokens, constraint, chat, prediction)


# the shipped suites, by name (--suite NAME): the default one, jobs whose text repeats across requests (one
# template over many items, tool calls, code with shared boilerplate, a conversation), for `bench --job`, and edits
# with their predictions: plain prompts for a base model (the embedded one), chat ones for an instruct model
# (tools/make_edits_suite.py made them)
SHIPPED_SUITES = ("default", "template-emails", "tool-calls", "code-boilerplate", "multi-turn", "extract-json",
                  "edits", "edits-chat")


def load_suite(path: Path | None) -> Suite:
    """The suite in ``path``, or the built-in default suite shipped with the package when None."""
    if path is None:
        path = Path(DEFAULT_SUITE)
    shipped = resources.files("localspec").joinpath("bench_suites", f"{path.name}.jsonl")
    if path.name in SHIPPED_SUITES and not path.exists() and shipped.is_file():  # a shipped suite, by its name
        return parse_suite(shipped.read_text("utf-8"), path.name)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"suite file not found: {path} (a JSONL file of {{id, category, prompt}} rows)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read suite file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    return parse_suite(text, str(path))
