#!/usr/bin/env python3
"""Regenerate the edit-prediction-only rows of the edits suites: each row's prediction is the model's own greedy
answer to a sibling prompt that differs from the row's prompt in one detail, as when a document is written again
after its spec changed. The sibling prompts below are the record of how the predictions were made. The
edit-in-prompt rows are kept as they are in the file (their prediction is the file in the prompt, unchanged).
`--check` also answers every row's own prompt target-only and prints its agreement with the prediction (difflib
ratio) to stderr.

Two suites, one per kind of model (--suite):

* ``edits`` (localspec/bench_suites/edits.jsonl), for the embedded default model, gemma3-270m: a base model, so
  every prompt is plain text to continue (no chat template). A base model does not stop where the file ends, so
  the sibling's answer is cut after the line that holds the row's ``last`` text, and the row's max_tokens covers
  about 1.1 times that.
* ``edits-chat`` (localspec/bench_suites/edits-chat.jsonl), for instruct models: every prompt is a chat message.
  The default model is the Qwen2.5 Coder 1.5B instruct (the qwen2.5-coder-1.5b profile's target): gemma3-270m
  repeats a chat prompt instead of answering it. The prediction is the sibling's whole answer.

    LOCALSPEC_HOME=... .venv/bin/python tools/make_edits_suite.py [--suite edits|edits-chat] [--model NAME]
        [--check] [--write]
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SUITES_DIR = Path(__file__).resolve().parent.parent / "localspec" / "bench_suites"
CATEGORY = "edit-prediction-only"


@dataclass(frozen=True)
class Row:
    sibling: str  # the prompt whose answer is the prediction
    prompt: str  # the row's prompt: the sibling's, one detail changed
    max_tokens: int  # the row's budget
    last: str | None = None  # the prediction ends with the sibling answer's line that holds this text (None: all)


@dataclass(frozen=True)
class SuiteSpec:
    path: Path
    model: str  # the default --model
    chat: bool  # the prompts are chat messages
    sibling_max_tokens: int  # the sibling's answer: the whole answer (chat), or enough to reach `last`
    rows: dict[str, Row]


# plain prompts for the embedded base model: each continues a structured pattern (a list, a class, a config, a form)
EDITS_ROWS: dict[str, Row] = {
    "hours-7am": Row(
        "Rosie's Bakery is open from 8 am to 6 pm, Monday to Saturday.\n\nOpening hours:\nMonday:",
        "Rosie's Bakery is open from 7 am to 6 pm, Monday to Saturday.\n\nOpening hours:\nMonday:", 64,
        "Saturday:"),
    "pool-thursday": Row(
        "NOTICE: The swimming pool is closed from Monday 12 May to Wednesday 14 May for repairs.\n\n"
        "Opening times this week:\nMonday:",
        "NOTICE: The swimming pool is closed from Monday 12 May to Thursday 15 May for repairs.\n\n"
        "Opening times this week:\nMonday:", 105,
        "for repairs."),
    "py-user-phone": Row(
        '```python\nclass User:\n    """A user of the shop: name, email and age."""\n\n'
        "    def __init__(self, name, email, age):\n",
        '```python\nclass User:\n    """A user of the shop: name, email and phone."""\n\n'
        "    def __init__(self, name, email, phone):\n", 129,
        "return self.name == other.name"),
    "js-user-city": Row(
        "```javascript\n// A user of the shop: name, email and age.\nclass User {\n"
        "  constructor(name, email, age) {\n",
        "```javascript\n// A user of the shop: name, email and city.\nclass User {\n"
        "  constructor(name, email, city) {\n", 91,
        "```"),
    "ini-backup-3am": Row(
        "# settings.ini for the nightly backup (keys: source, destination, time = 02:00, keep_days = 7)\n"
        "[backup]\nsource =",
        "# settings.ini for the nightly backup (keys: source, destination, time = 03:00, keep_days = 7)\n"
        "[backup]\nsource =", 56,
        "keep_days"),
    "email-friday": Row(
        "Email to Sam confirming the meeting on Thursday at 3 pm.\n\nHi Sam,\n\nThis is to confirm our meeting:\n\n"
        "Date:",
        "Email to Sam confirming the meeting on Friday at 3 pm.\n\nHi Sam,\n\nThis is to confirm our meeting:\n\n"
        "Date:", 76,
        "invitation to the meeting."),
}

# chat messages for instruct models
EDITS_CHAT_ROWS: dict[str, Row] = {
    "email-tuesday": Row(
        "Write a short email to Sam confirming our meeting on Monday at 3 pm in room 4B.",
        "Write a short email to Sam confirming our meeting on Tuesday at 3 pm in room 4B.", 96),
    "notice-friday": Row(
        "Write a short notice for the office kitchen: the dishwasher will be repaired on Thursday morning, so please "
        "wash your own cups until then.",
        "Write a short notice for the office kitchen: the dishwasher will be repaired on Friday morning, so please "
        "wash your own cups until then.", 64),
    "readme-quickcsv": Row(
        "Write a short README section explaining how to install the Python package `fastcsv` with pip.",
        "Write a short README section explaining how to install the Python package `quickcsv` with pip.", 112),
    "js-fetch-5": Row(
        "Write a JavaScript function `fetchJson(url)` that fetches JSON with fetch and retries up to 3 times on "
        "failure. Reply with the code only.",
        "Write a JavaScript function `fetchJson(url)` that fetches JSON with fetch and retries up to 5 times on "
        "failure. Reply with the code only.", 160),
    "py-book-pages": Row(
        "Write a Python dataclass `Book` with the fields title, author, year and isbn, a method `describe()` that "
        "returns a one-line description, and a classmethod `from_dict(data)`. Reply with the code only.",
        "Write a Python dataclass `Book` with the fields title, author, pages and isbn, a method `describe()` that "
        "returns a one-line description, and a classmethod `from_dict(data)`. Reply with the code only.", 112),
    "compose-pg16": Row(
        "Write a docker-compose.yml with two services: a web app built from the current directory on port 8000, and "
        "a PostgreSQL 15 database with a named volume. Reply with the file only.",
        "Write a docker-compose.yml with two services: a web app built from the current directory on port 8000, and "
        "a PostgreSQL 16 database with a named volume. Reply with the file only.", 160),
}

SUITES: dict[str, SuiteSpec] = {
    "edits": SuiteSpec(SUITES_DIR / "edits.jsonl", "gemma3-270m", False, 256, EDITS_ROWS),
    "edits-chat": SuiteSpec(SUITES_DIR / "edits-chat.jsonl", "qwen2.5-coder-1.5b-instruct-q4_k_m", True, 384,
                            EDITS_CHAT_ROWS),
}


def answer(prompt: str, max_tokens: int, model: str, chat: bool) -> str:
    """The model's greedy, target-only answer to ``prompt``, as a chat message or as plain text to continue (history
    off: nothing carries over)."""
    cmd = [sys.executable, "-m", "localspec", "run", *(["--chat"] if chat else []), "--drafter", "none",
           "--max-tokens", str(max_tokens), "--model", model, "-", "--json"]
    env = {**os.environ, "LOCALSPEC_HISTORY": "off"}
    done = subprocess.run(cmd, input=prompt, capture_output=True, text=True, check=True, env=env)
    return json.loads(done.stdout)["text"]


def cut(text: str, last: str | None, id_: str) -> str:
    """``text`` up to the end of the line that holds ``last`` (where the file ends), or all of it when None."""
    if last is None:
        return text
    at = text.find(last)
    if at < 0:
        sys.exit(f"{id_}: the sibling's answer no longer holds {last!r} (another model or build?): {text[:200]!r}")
    end = text.find("\n", at + len(last))
    return text if end < 0 else text[: end + 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", choices=sorted(SUITES), default="edits")
    ap.add_argument("--model", default=None, help="default: the suite's (edits: gemma3-270m, edits-chat: the "
                    "Qwen2.5 Coder 1.5B instruct)")
    ap.add_argument("--check", action="store_true", help="print each row's target-only agreement with its prediction")
    ap.add_argument("--write", action="store_true", help="write the suite's file instead of printing the JSONL")
    ap.add_argument("--wrong", action="store_true", help="print the shipped suite with each row given the next row's "
                    "prediction (another file): what a wrong prediction costs")
    args = ap.parse_args()
    spec = SUITES[args.suite]
    if args.wrong:
        shipped = [json.loads(line) for line in spec.path.read_text("utf-8").splitlines() if line.strip()]
        for row, other in zip(shipped, shipped[1:] + shipped[:1], strict=True):
            sys.stdout.write(json.dumps({**row, "prediction": other["prediction"]}, ensure_ascii=False) + "\n")
        return
    model = args.model or spec.model

    lines = spec.path.read_text("utf-8").splitlines() if spec.path.exists() else []
    rows = [row for row in map(json.loads, filter(str.strip, lines)) if row["category"] != CATEGORY]
    for id_, r in spec.rows.items():
        prediction = cut(answer(r.sibling, spec.sibling_max_tokens, model, spec.chat), r.last, id_)
        row = {"id": id_, "category": CATEGORY, "prompt": r.prompt, "max_tokens": r.max_tokens}
        if spec.chat:
            row["chat"] = True
        rows.append({**row, "prediction": prediction})
    if args.check:
        for row in rows:
            text = answer(row["prompt"], row["max_tokens"], model, row.get("chat", False))
            ratio = difflib.SequenceMatcher(None, row["prediction"], text, autojunk=False).ratio()
            print(f"{row['id']:<16} {row['category']:<22} agreement {ratio:.3f}", file=sys.stderr)
    jsonl = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    if args.write:
        spec.path.write_text(jsonl, "utf-8")
    else:
        sys.stdout.write(jsonl)


if __name__ == "__main__":
    main()
