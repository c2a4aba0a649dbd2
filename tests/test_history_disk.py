"""The history's promises on disk, without a model: a clear stays a clear while other processes run, nothing a
face was told not to keep is kept, memory stays bounded, and every failure to read or write is one line, never a
traceback or silence. Every file lives in tmp_path."""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from typer.testing import CliRunner

from localspec.cli import app
from localspec.history import History, disk
from localspec.history import history as history_module
from localspec.history.disk import history_path, write
from localspec.history.store import Shelf
from localspec.opening import save_history
from localspec.settings import HistorySettings

MODEL = "a" * 64


def seq(tag: int, n: int = 40) -> list[int]:
    """A sequence of its own tokens (``tag`` sets them apart), ``n`` long."""
    return [tag * 1000 + j for j in range(n)]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    return history_path(MODEL)


def kept(path: Path) -> set[int]:
    """The tags of the sequences the file holds."""
    shelves, _ = disk.read(path, MODEL)
    return {int(t) // 1000 for s in shelves.values() for t in s.tokens[s.starts]}


def test_a_clear_stays_cleared_though_a_process_that_loaded_before_it_saves_after(home: Path) -> None:
    first = History.open(MODEL, home)
    first.feed(seq(1))
    assert first.save()
    server = History.open(MODEL, home)  # a long-running process: it loaded request 1
    server.feed(seq(2))  # fed before the clear, not saved yet: cleared too
    assert CliRunner().invoke(app, ["cache", "--clear"]).exit_code == 0
    server.feed(seq(3))  # after the clear: kept
    assert server.save()
    assert kept(home) == {3}
    assert server.n_requests == 1 and server.view().lookup(seq(1)[:6], 4) is None  # nor drafted from any more
    # and a process that had loaded nothing, and saved nothing since the clear, writes back nothing from before it
    other = History.open(MODEL, home)
    other.feed(seq(4))
    assert other.save() and kept(home) == {3, 4}


def test_clear_leaves_the_lock_files_and_shows_what_was_set_aside(home: Path) -> None:
    history = History.open(MODEL, home)
    history.feed(seq(1))
    history.save()
    lock = home.with_name(home.name + ".lock")
    assert lock.exists()
    (home.parent / f"{home.name}.bad-20261128-000000").write_bytes(b"x" * 10)
    (home.parent / f".{home.name}.abc123.tmp").write_bytes(b"y" * 20)
    runner = CliRunner()
    shown = runner.invoke(app, ["cache"])
    assert shown.exit_code == 0 and "set aside" in shown.output and "unfinished write" in shown.output, shown.output
    leftovers = json.loads(runner.invoke(app, ["cache", "--json"]).output)["leftovers"]
    assert sorted(x["kind"] for x in leftovers) == ["set aside", "unfinished write"]
    cleared = runner.invoke(app, ["cache", "--clear"])
    assert cleared.exit_code == 0, cleared.output
    assert lock.exists()  # a writer holding it keeps excluding the next one
    assert sorted(p.name for p in home.parent.iterdir() if not p.name.startswith(".cleared")) == [lock.name]


def test_the_newest_sequence_stays_however_long() -> None:
    history = History(MODEL, max_tokens=100)
    history.feed(seq(1, 20))
    history.feed(seq(2, 95))  # over 90% of the bound by itself
    assert history.n_requests == 1 and history.view().lookup(seq(2)[:6], 4) is not None


def test_a_conversation_whose_start_was_dropped_is_kept_whole_when_it_comes_back() -> None:
    history = History(MODEL, max_tokens=200)
    turn = seq(1, 60)
    history.feed(turn)
    history.feed(seq(2, 100))
    history.feed(seq(3, 100))  # the bound drops the turn (and seq 2)
    assert history.view().lookup(turn[:6], 4) is None
    history.feed([*turn, *seq(4, 40)])  # the conversation comes back: its start is nowhere now
    assert history.view().lookup(turn[:6], 4) is not None


def test_a_scope_dropped_whole_comes_back_at_a_later_epoch() -> None:
    history = History(MODEL, max_tokens=100)
    history.feed(seq(1, 50), "key:a")
    before = history.shelves["key:a"].epoch
    history.feed(seq(2, 90), "key:b")  # key:a's only sequence goes: its shelf with it
    assert "key:a" not in history.shelves
    history.feed(seq(3, 8), "key:a")
    assert history.shelves["key:a"].epoch > before  # a place followed in the old shelf is never read in the new


def test_token_ids_past_the_vocabulary_set_the_file_aside(home: Path) -> None:
    history = History(MODEL)
    history.feed(seq(1))
    history.save()  # in memory: nothing
    home.parent.mkdir(parents=True)
    write(home, MODEL, history.shelves, history.serial)
    again = History.open(MODEL, home, n_vocab=1000)  # seq(1)'s ids are 1000..1039
    assert len(again.notices) == 1 and "set aside" in again.notices[0] and again.n_requests == 0
    assert History.open(MODEL, home, n_vocab=1000).notices == []  # and the next one starts afresh


def test_a_file_that_cannot_be_read_is_said_and_left_where_it_is(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    history = History.open(MODEL, home)
    history.feed(seq(1))
    history.save()

    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(home))

    monkeypatch.setattr(disk, "open", denied, raising=False)
    again = History.open(MODEL, home)
    assert len(again.notices) == 1 and "Permission denied" in again.notices[0] and "set aside" not in again.notices[0]
    assert again.path is None  # kept in memory only: never written over a file it could not read
    monkeypatch.undo()
    assert home.exists() and not list(home.parent.glob("*.bad-*")) and kept(home) == {1}


def test_an_unusable_folder_or_lock_is_one_notice_and_the_history_in_memory(tmp_path: Path) -> None:
    path = tmp_path / "h.npz"
    history = History.open(MODEL, path)
    history.feed(seq(1))
    history.save()
    path.with_name("h.npz.lock").unlink()
    path.with_name("h.npz.lock").mkdir()  # a lock that cannot be opened (as a root-made one for another user)
    again = History.open(MODEL, path)
    assert len(again.notices) == 1 and "cannot be used" in again.notices[0] and again.path is None
    again.feed(seq(2))
    assert again.n_requests == 1 and not again.save()
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("")
    assert "cannot be used" in History.open(MODEL, blocked / "h.npz").notices[0]  # a folder that cannot be made


def test_a_failed_save_is_said_in_one_line(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    history = History.open(MODEL, home)
    history.feed(seq(1))

    def full(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(disk, "write", full)
    said: list[str] = []
    assert not save_history(history, said.append)
    assert len(said) == 1 and "No space left on device" in said[0] and "not kept" in said[0]


def test_the_file_is_synced_before_it_is_renamed(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])

    def replace(src: str, dst: str) -> None:
        assert synced, "renamed before its data reached the disk"
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    history = History.open(MODEL, home)
    history.feed(seq(1))
    assert history.save()


def test_what_waits_to_be_saved_is_bounded_and_merged_at_once(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    history = History.open(MODEL, home, max_tokens=2000)
    for i in range(200):
        history.feed(seq(i + 1, 50))
    assert history.pending <= 2000 and all(isinstance(a.tokens, np.ndarray) for a in history.added)
    for i in range(100):
        history.feed(seq(i, 50), f"key:{i}")
    assert len(history._fed) <= history_module._FED_SCOPES
    other = History.open(MODEL, home)
    other.feed(seq(999))
    other.save()  # the file changed under ``history``: its save merges
    merges: list[int] = []
    real = Shelf.extend
    monkeypatch.setattr(Shelf, "extend", lambda self, s, *a: (merges.append(len(s)), real(self, s, *a))[1])
    assert history.save()
    assert len(merges) <= 100 + 1  # one merge per scope, not one per sequence
    assert History.open(MODEL, home, max_tokens=2000).n_tokens <= 2000


def test_a_long_running_process_saves_as_it_goes(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    history = History.open(MODEL, home)
    assert not history.due()
    monkeypatch.setattr(history_module, "SAVE_REQUESTS", 3)
    for i in range(3):
        assert not history.due()
        history.feed(seq(i + 1))
    assert history.due()
    assert history.save() and not history.due() and kept(home) == {1, 2, 3}


def test_the_variable_lowers_a_faces_default_and_never_raises_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALSPEC_HISTORY", "disk")
    assert HistorySettings().resolved("memory") == "memory"  # serve: other people's text stays off the disk
    assert HistorySettings("disk").resolved("memory") == "disk"  # unless its operator says (--keep-history)
    monkeypatch.setenv("LOCALSPEC_HISTORY", "memory")
    assert HistorySettings().resolved("disk") == "memory"
    monkeypatch.setenv("LOCALSPEC_HISTORY", "off")
    assert HistorySettings().resolved("memory") == "off"


def test_tests_run_with_the_history_off_unless_they_ask() -> None:
    # a lossless test that first ran target-only would otherwise draft that very answer from the history
    assert os.environ["LOCALSPEC_HISTORY"] == "off"
    assert HistorySettings().resolved("disk") == "off"


def test_measurement_tools_never_let_a_prompt_draft_from_its_own_earlier_runs(history_on: None) -> None:
    # a tool that asks the same prompts round after round, with the history on, measures the history: `run
    # --drafter auto` after `--drafter none` on the same prompts read 3.86x with it, 2.10x without
    from tests.script_modules import ROOT, load_script

    assert load_script("chat_vs_run").options("none", 8).history.resolved("disk") == "off"
    for tool in sorted((ROOT / "tools").glob("*.py")):
        source = tool.read_text(encoding="utf-8")
        if re.search(r"Runtime\.open\(|\"-m\", \"localspec\"", source) is None or "\"bench\"" in source:
            continue  # nothing generates (a bench never uses the history)
        assert re.search(r"LOCALSPEC_HISTORY|HistorySettings\(", source), f"{tool.name} runs with the user's history"
        assert "setdefault(\"LOCALSPEC_HISTORY\"" not in source, f"{tool.name} takes the shell's history setting"


def test_a_deleted_conversation_leaves_the_history_too(home: Path, history_on: None) -> None:
    from localspec.runtime import Runtime
    from localspec.tui.store import ChatStore, default_path

    store = ChatStore(default_path())
    conversation = store.create("m", None)
    store.close()
    history = History.open(MODEL, home)
    view = history.view()
    Runtime.tag_history(SimpleNamespace(generator=SimpleNamespace(on_end=view.feed)), conversation)  # type: ignore[arg-type]
    view.feed(seq(1))  # the conversation's turn, fed as a chat's generator feeds it
    history.feed(seq(2))  # a run's
    assert history.save() and kept(home) == {1, 2}
    result = CliRunner().invoke(app, ["chat", "--delete", str(conversation)])
    assert result.exit_code == 0, result.output
    assert kept(home) == {2}
    # a chat that deletes while it runs forgets what it holds and has not saved yet, too
    history.feed(seq(3), tag=conversation + 1)
    history.forget(conversation + 1)
    history.feed(seq(4))
    assert history.save() and kept(home) == {2, 4} and history.view().lookup(seq(3)[:6], 4) is None


def test_a_running_process_stops_drafting_from_what_a_clear_removed(home: Path) -> None:
    first = History.open(MODEL, home)
    first.feed(seq(1))
    first.save()
    server = History.open(MODEL, home)
    assert not server.due() and server.view().lookup(seq(1)[:6], 4) is not None
    assert CliRunner().invoke(app, ["cache", "--clear"]).exit_code == 0
    assert server.due()  # nothing of its own to save, but what it holds was cleared
    server.save()
    assert server.n_requests == 0 and not home.exists() and not server.due()
