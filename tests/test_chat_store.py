"""The chat's saved conversations: a real SQLite file, written turn by turn and read back by a new connection."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from localspec.errors import UserError
from localspec.events import Stats
from localspec.tui.session import Session
from localspec.tui.store import ChatStore
from tests.conftest import assert_one_line_error, localspec


def test_turns_are_saved_as_they_happen_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"
    store = ChatStore(path)
    session = Session(store, system="Be brief.")
    session.model = "gemma3-270m"
    assert session.id is None and store.list() == []  # nothing is saved before the first turn
    session.add_user("def f(x):\n    return x + 1\n\nRename f to g.")
    assert session.id is not None
    stats = Stats(generated_tokens=12, decode_seconds=0.5, target_passes=6, drafted=8, accepted=6,
                  accepted_by_position=[[4, 5], [2, 3]], stop_reason="eog")  # fmt: skip
    session.add_assistant("def g(x):\n    return x + 1", stats, "ngram", "eog")
    first = session.id

    # a second connection (another process, later) sees every turn: each was committed when it was added
    other = ChatStore(path)
    (saved,) = other.list()
    # a turn is a question with its answer, not a message
    assert (saved.id, saved.turns, saved.model, saved.title) == (first, 1, "gemma3-270m", "def f(x):")
    assert " 1 turn " in saved.describe() and "turns" not in saved.describe()
    conversation = other.load(first)
    assert conversation.system == "Be brief."
    assert [(t.role, t.text) for t in conversation.turns] == [
        ("user", "def f(x):\n    return x + 1\n\nRename f to g."),
        ("assistant", "def g(x):\n    return x + 1"),
    ]
    assert conversation.turns[1].stats == stats and conversation.turns[1].drafter == "ngram"

    # regenerate / edit take turns back, in the file too
    session.add_user("And in Rust?")
    session.add_assistant("fn g(x: i32) -> i32 { x + 1 }", None, "none", "length")
    session.take_back(session.turns[2])
    assert [t.text for t in other.load(first).turns][-1] == "def g(x):\n    return x + 1"

    # a new conversation gets its own id; the list puts the latest change first
    session.new()
    session.add_user("Hello")
    assert session.id != first
    assert [c.id for c in other.list()] == [session.id, first]
    assert other.latest() == session.id

    # resume continues the old one: new turns go to it
    session.resume(first)
    session.add_user("Thanks")
    assert other.load(first).turns[-1].text == "Thanks"
    assert other.latest() == first

    # delete removes it with its turns; ids are not reused
    assert other.delete(first) and not other.delete(first)
    with pytest.raises(UserError, match="no saved conversation"):
        other.load(first)
    assert other._db.execute("SELECT COUNT(*) FROM turns WHERE conversation = ?", (first,)).fetchone()[0] == 0
    session.new()
    session.add_user("Again")
    assert session.id is not None and session.id > first
    store.close()
    other.close()


def test_an_answer_is_rewritten_in_place_as_it_streams(tmp_path: Path) -> None:
    """The chat saves an answer as it streams (marked interrupted), then its end replaces it: one row, each write
    committed, as a second connection sees after every call."""
    path = tmp_path / "chats.sqlite3"
    session = Session(ChatStore(path), system=None)
    session.add_user("Count to five.")
    other = ChatStore(path)

    def saved() -> list[tuple[str, str, str, Stats | None]]:
        assert session.id is not None
        return [(t.role, t.text, t.stop_reason, t.stats) for t in other.load(session.id).turns]

    turn = session.save_answer(None, "one, two", None, "ngram", "interrupted")
    assert saved()[-1] == ("assistant", "one, two", "interrupted", None)
    assert session.save_answer(turn, "one, two, three", None, "ngram", "interrupted") is turn
    assert saved()[-1] == ("assistant", "one, two, three", "interrupted", None)
    stats = Stats(generated_tokens=9, decode_seconds=0.2, target_passes=5, stop_reason="eog")
    final = "one, two, three, four, five."
    session.save_answer(turn, final, stats, "ngram", "eog")
    assert saved() == [("user", "Count to five.", "", None), ("assistant", final, "eog", stats)]
    assert other.list()[0].turns == 1 and session.turns[-1] is turn
    other.close()


def test_a_file_from_a_newer_version_or_an_unusable_place_is_one_line(tmp_path: Path) -> None:
    newer = tmp_path / "newer.sqlite3"
    with sqlite3.connect(newer) as db:
        db.execute("PRAGMA user_version = 99")
    with pytest.raises(UserError, match="newer localspec.*--no-history"):
        ChatStore(newer)
    not_a_db = tmp_path / "garbage.sqlite3"
    not_a_db.write_bytes(b"this is not a database" * 100)
    with pytest.raises(UserError, match="cannot use the chat history") as raised:
        ChatStore(not_a_db)
    assert "--no-history" in str(raised.value)  # the way to chat anyway, without touching the file
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(UserError, match="cannot use the chat history"):
        ChatStore(blocked / "sub" / "chats.sqlite3")


def test_a_store_that_fails_mid_chat_is_reported_once_and_the_chat_goes_on(tmp_path: Path) -> None:
    store = ChatStore(tmp_path / "chats.sqlite3")
    errors: list[str] = []
    session = Session(store, system=None, on_error=errors.append)
    session.add_user("one")
    store.close()  # as if the disk went away: every write now fails
    session.add_user("two")
    session.add_user("three")
    assert len(errors) == 1 and "no longer saved" in errors[0]
    assert [t.text for t in session.turns] == ["one", "two", "three"] and session.store is None


def test_list_delete_and_resume_from_the_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("LOCALSPEC_HOME", str(home))
    empty = localspec(["chat", "--list"])
    assert empty.code == 0 and "No saved conversations yet" in empty.stdout
    nothing = localspec(["chat", "--resume"])
    assert_one_line_error(nothing.code, nothing.stderr, "no saved conversation to resume")

    store = ChatStore(home / "data" / "chats.sqlite3")  # where the command keeps them (paths.data_dir)
    session = Session(store, system=None)
    session.model = "m"
    session.add_user("First question\nwith a second line")
    kept = session.id
    session.new()
    session.add_user("Second question")
    gone = session.id
    store.close()

    listed = localspec(["chat", "--list"])
    assert listed.code == 0
    lines = listed.stdout.splitlines()
    assert [line.split()[0] for line in lines] == [str(gone), str(kept)]
    assert "First question" in lines[1] and "second line" not in listed.stdout
    assert all(" 1 turn " in line and "turns" not in line for line in lines), lines  # not "1 turns"

    deleted = localspec(["chat", "--delete", str(gone)])
    assert deleted.code == 0 and f"Deleted conversation {gone}" in deleted.stdout
    again = localspec(["chat", "--delete", str(gone)])
    assert_one_line_error(again.code, again.stderr, f"no saved conversation {gone}", "--list")
    missing = localspec(["chat", "--resume", str(gone)])
    assert_one_line_error(missing.code, missing.stderr, f"no saved conversation {gone}")
    without = localspec(["chat", str(kept)])
    assert_one_line_error(without.code, without.stderr, f"localspec chat --resume {kept}")
    # a conversation that exists: everything checks out up to the terminal, which a test does not have
    found = localspec(["chat", "--resume", str(kept)])
    assert_one_line_error(found.code, found.stderr, "needs a terminal")


def test_a_corrupt_history_names_the_way_to_chat_anyway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("LOCALSPEC_HOME", str(home))
    (home / "data").mkdir(parents=True)
    (home / "data" / "chats.sqlite3").write_bytes(b"not a database" * 200)
    for args in (["chat"], ["chat", "--list"]):
        result = localspec(args)
        assert_one_line_error(result.code, result.stderr, "cannot use the chat history", "--no-history")
    assert (home / "data" / "chats.sqlite3").read_bytes() == b"not a database" * 200  # untouched
