"""Conversations saved as they happen, in a SQLite file in the user's data folder (stdlib sqlite3).

Each turn is written when it is added: a question when it is sent, an answer as it streams (each repaint saves the
text on screen, marked ``interrupted`` until the answer ends and its final text, stats and stop reason replace it).
So quitting, a closed terminal or a crash loses nothing that was on screen. Only the UI thread uses a store:
sqlite3 connections stay on the thread that opened them, and every write here is a few rows.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from localspec.errors import UserError
from localspec.events import Stats
from localspec.paths import data_dir
from localspec.tui.conversation import Conversation, Turn

SCHEMA_VERSION = 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: an id once printed keeps meaning that conversation
    created REAL NOT NULL,
    updated REAL NOT NULL,
    model TEXT NOT NULL,
    system TEXT
);
CREATE TABLE IF NOT EXISTS turns (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    text TEXT NOT NULL,
    drafter TEXT NOT NULL DEFAULT '',
    stop_reason TEXT NOT NULL DEFAULT '',
    stats TEXT  -- JSON of localspec.events.Stats, for the line under a resumed answer
);
CREATE INDEX IF NOT EXISTS turns_in_order ON turns(conversation, id);
"""
TITLE_CHARS = 60


@dataclass(frozen=True)
class SavedConversation:
    """One line of the list of saved conversations."""

    id: int
    title: str  # the first line of the first question
    model: str
    updated: datetime
    turns: int  # questions asked, each with its answer (a turn is a question and its answer, not a message)

    def describe(self) -> str:
        turns = "turn " if self.turns == 1 else "turns"
        return f"{self.updated:%Y-%m-%d %H:%M}  {self.turns:>3} {turns}  {self.title}"


def default_path() -> Path:
    return data_dir() / "chats.sqlite3"


class ChatStore:
    """The saved conversations. Raises UserError (one line, with what to do) when the file cannot be used."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path)
            self._db.execute("PRAGMA foreign_keys = ON")
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                self._db.close()
                raise UserError(
                    f"the chat history {path} was written by a newer localspec: upgrade localspec, or chat with"
                    " --no-history"
                )
            # An answer is saved as it streams, several times a second, from the UI thread. With a write-ahead log a
            # commit is an append (~30 µs here, against ~0.7 ms of CPU and fsyncs with the default rollback journal)
            # and it still survives the process being killed; only a power cut may lose the last commits.
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = NORMAL")
            with self._db:
                self._db.executescript(SCHEMA)
                self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except (OSError, sqlite3.Error) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise UserError(
                f"cannot use the chat history {path}: {reason} (move or delete the file, set LOCALSPEC_HOME, or chat"
                " with --no-history)"
            ) from None

    def close(self) -> None:
        self._db.close()

    # ---- writing ---------------------------------------------------------------------------------------------

    def create(self, model: str, system: str | None) -> int:
        now = time.time()
        with self._db:
            cursor = self._db.execute(
                "INSERT INTO conversations (created, updated, model, system) VALUES (?, ?, ?, ?)",
                (now, now, model, system),
            )
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    def add_turn(self, conversation_id: int, turn: Turn) -> None:
        """Save ``turn`` at the end of the conversation; ``turn.saved_id`` is set to its row."""
        with self._db:
            cursor = self._db.execute(
                "INSERT INTO turns (conversation, role, text, drafter, stop_reason, stats) VALUES (?, ?, ?, ?, ?, ?)",
                (conversation_id, turn.role, turn.text, turn.drafter, turn.stop_reason, _stats_json(turn.stats)),
            )
            self._touch(conversation_id)
        turn.saved_id = cursor.lastrowid

    def update_turn(self, conversation_id: int, turn: Turn) -> None:
        """Write ``turn``'s text, drafter, stop reason and stats over its saved row (an answer as it streams)."""
        assert turn.saved_id is not None
        with self._db:
            self._db.execute(
                "UPDATE turns SET text = ?, drafter = ?, stop_reason = ?, stats = ? WHERE id = ?",
                (turn.text, turn.drafter, turn.stop_reason, _stats_json(turn.stats), turn.saved_id),
            )
            self._touch(conversation_id)

    def remove_turns(self, conversation_id: int, turns: list[Turn]) -> None:
        """Forget ``turns`` (an answer being regenerated, a question taken back for editing)."""
        ids = [(t.saved_id,) for t in turns if t.saved_id is not None]
        with self._db:
            self._db.executemany("DELETE FROM turns WHERE id = ?", ids)
            self._touch(conversation_id)
        for turn in turns:
            turn.saved_id = None

    def delete(self, conversation_id: int) -> bool:
        """Delete a conversation and its turns; False if there was none with that id."""
        with self._db:
            cursor = self._db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
        return cursor.rowcount > 0

    def _touch(self, conversation_id: int) -> None:
        self._db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (time.time(), conversation_id))

    # ---- reading ---------------------------------------------------------------------------------------------

    def list(self) -> list[SavedConversation]:
        """Conversations with at least one turn, the most recently changed first."""
        rows = self._db.execute(
            """SELECT c.id, c.model, c.updated, SUM(t.role = 'user'),
                      (SELECT text FROM turns WHERE conversation = c.id AND role = 'user' ORDER BY id LIMIT 1)
               FROM conversations c JOIN turns t ON t.conversation = c.id
               GROUP BY c.id ORDER BY c.updated DESC, c.id DESC"""
        ).fetchall()
        return [
            SavedConversation(cid, _title(first or ""), model, datetime.fromtimestamp(updated), n)
            for cid, model, updated, n, first in rows
        ]

    def latest(self) -> int | None:
        listed = self.list()
        return listed[0].id if listed else None

    def load(self, conversation_id: int) -> Conversation:
        row = self._db.execute("SELECT system FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        if row is None:
            raise UserError(f"no saved conversation {conversation_id}: `localspec chat --list` shows them")
        conversation = Conversation(system=row[0])
        for turn_id, role, text, drafter, stop_reason, stats in self._db.execute(
            "SELECT id, role, text, drafter, stop_reason, stats FROM turns WHERE conversation = ? ORDER BY id",
            (conversation_id,),
        ):
            conversation.turns.append(Turn(role, text, _stats(stats), drafter, stop_reason, saved_id=turn_id))
        return conversation


def _title(text: str) -> str:
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1] + "…"


def _stats_json(stats: Stats | None) -> str | None:
    return json.dumps(dataclasses.asdict(stats)) if stats is not None else None


def _stats(column: str | None) -> Stats | None:
    if not column:
        return None
    known = {f.name for f in dataclasses.fields(Stats)}
    try:
        values = json.loads(column)
        return Stats(**{k: v for k, v in values.items() if k in known})
    except (ValueError, TypeError, AttributeError):
        return None  # a damaged stats line costs only the summary under one answer
