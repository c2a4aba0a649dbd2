"""The history store without a model: what a lookup proposes, the bound, scopes, and the file (mode 600, atomic,
set aside when unreadable, whole when two processes save at once). Every file lives in tmp_path."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from localspec.cli import app
from localspec.drafters.ngram import NgramDrafter
from localspec.history import History
from localspec.history.disk import FORMAT, history_path, read, write
from localspec.history.store import NS, Shelf, suffix_hashes
from tests.conftest import ROOT, assert_one_line_error

TEMPLATE = [100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111]


def item(i: int) -> list[int]:
    """A templated request: the same skeleton around one varying token."""
    return [1, 50 + i, *TEMPLATE, 200 + i, 300, 301, 302, 7]


def test_the_longest_match_leads_and_its_continuation_is_drafted() -> None:
    history = History("m")
    for i in range(3):
        history.feed(item(i))
    match = history.view().lookup([7, 51, 100, 101, 102], 16)
    assert match is not None and match.n == 4 and match.count == 1  # item 1's "51 100 101 102": the longest
    assert match.tokens[:10] == [*TEMPLATE[3:], 201]
    match = history.view().lookup([7, 99, 100, 101, 102], 16)
    assert match is not None and match.n == 3 and match.count == 3  # once in each item
    assert match.tokens == TEMPLATE[3:]  # up to the slot where they part (200, 201, 202)
    assert history.view().lookup([999, 998], 16) is None


def test_a_slot_where_earlier_answers_went_different_ways_is_not_drafted() -> None:
    history = History("m")
    for i in range(3):
        history.feed(item(i))
    match = history.view().lookup([*TEMPLATE[-6:]], 16)  # the template's end: then 200, 201 or 202
    assert match is not None and match.varied and match.tokens == []
    drafter = NgramDrafter(history=history.view())
    text = [2, 53, *TEMPLATE]
    drafter.begin(text)
    assert not drafter.propose(text, 8).kind.startswith("cache/")
    # two of four agree: no slot, the majority is drafted, as a kind of its own (not every earlier answer agreed)
    history.feed(item(2))
    match = history.view().lookup([*TEMPLATE[-6:]], 16)
    assert match is not None and not match.varied and match.split and match.tokens[0] == 202
    text = [2, 53, 999, *TEMPLATE[-6:]]
    drafter.begin(text)
    assert drafter.propose(text, 8).kind == "cache/4+~"


def keyed(i: int) -> list[int]:
    """An answer of three keys (10, 20, 30) after a header (1 2 3), each key followed by its value (a token of this
    answer's own) and 5."""
    return [1, 2, 3, 10, 60 + i, 5, 20, 70 + i, 5, 30, 80 + i, 5, 9]


def test_after_a_slot_the_template_goes_on_where_the_earlier_answer_was_followed_to() -> None:
    history = History("m")
    for i in range(3):
        history.feed(keyed(i))
    view = history.view()
    epoch = history.shelves["local"].epoch
    first_value = 4  # where keyed(0)'s first value is, in the shelf
    near = view.near([69, 5], first_value, 8, epoch)
    assert near is not None and near.tokens[:2] == [20, 70]  # keyed(0)'s next key, not another's
    assert view.near([69, 5], 6, 8, epoch).tokens[:1] == [30]  # the nearest after the place, never before it
    assert view.near([69, 5], 12, 8, epoch) is None  # only within the same answer
    assert view.near([69, 5], first_value, 8, epoch + 1) is None  # positions of another epoch
    # a step folds the suffix's hashes once for both searches, and ``near`` looks no longer than the lookup matched
    tail = [1, 2, 3, 10, 69, 5]
    hashes = suffix_hashes(tail, NS[-1])
    match = view.lookup(tail, 8, hashes=hashes)
    assert match == view.lookup(tail, 8) and match is not None and match.n == 1  # 69 is new: only "5" matched
    assert view.near(tail, first_value, 8, epoch, hashes=hashes, longest=match.n) == view.near(tail, first_value, 8,
                                                                                                epoch) == near
    # the drafter: the header matched, the value after it is a slot (drafted from nowhere), so the place is kept;
    # after the new value, the answer's next key is drafted from there, where the lookup alone would offer
    # whichever key followed 5 most often
    drafter = NgramDrafter(history=view)
    text = [1, 2, 3, 10]
    drafter.begin(text)
    assert not drafter.propose(text, 8).kind.startswith("cache/")
    text += [69]
    drafter.accept(text, 0)
    text += [5]
    drafter.accept(text, 0)
    assert history.view().lookup(text, 8).tokens[:1] != [20]
    draft = drafter.propose(text, 8)
    assert draft.kind == "cache/near1" and draft.tokens[:2] == [20, 72]


def test_ties_go_to_the_continuation_that_followed_most_often() -> None:
    history = History("m")
    for tail in ([5, 6, 7, 8, 9, 10, 11, 12], [5, 6, 7, 8, 9, 10, 11, 12], [5, 6, 7, 8, 20, 21, 22, 23]):
        history.feed(tail)
    match = history.view().lookup([3, 5, 6], 8)
    assert match is not None and match.tokens[:6] == [7, 8, 9, 10, 11, 12]  # 2 to 1, though the 20s came last
    history.feed([5, 6, 7, 8, 20, 21, 22, 23])
    history.feed([5, 6, 7, 8, 20, 21, 22, 23])
    match = history.view().lookup([3, 5, 6], 8)
    assert match is not None and match.tokens[2:4] == [20, 21]


def test_scopes_never_see_each_other() -> None:
    history = History("m")
    history.feed(item(0), "key:aaaa")
    assert history.view("key:aaaa").lookup(item(1)[:5], 8) is not None
    assert history.view("key:bbbb").lookup(item(1)[:5], 8) is None
    assert history.view().lookup(item(1)[:5], 8) is None


def test_where_earlier_continuations_forked_the_runner_up_is_a_branch() -> None:
    history = History("m")
    for tail in ([5, 6, 7, 8, 9, 10, 11, 12], [5, 6, 7, 8, 9, 10, 11, 12], [5, 6, 7, 8, 20, 21, 22, 23]):
        history.feed(tail)
    match = history.view().lookup([3, 5, 6], 8, width=2)
    assert match is not None and match.tokens == [7, 8, 9, 10, 11, 12] and match.others == [[7, 8, 20, 21, 22, 23]]
    assert not match.split  # every earlier occurrence went on with 7
    assert history.view().lookup([3, 5, 6], 8).others == []  # one chain unless asked
    drafter = NgramDrafter(history=history.view())
    text = [3, 5, 6]
    drafter.begin(text)
    draft = drafter.propose(text, 8, width=2)
    assert draft.kind == "cache/2" and draft.candidates == [[7, 8, 9, 10, 11, 12], [7, 8, 20, 21, 22, 23]]


def test_bounded_the_oldest_go_first_over_all_scopes() -> None:
    history = History("m", max_tokens=100)
    for i in range(12):
        history.feed([1000 * i + j for j in range(20)], "a" if i % 2 else "b")
    assert history.n_tokens <= 100
    kept = {int(t) // 1000 for shelf in history.shelves.values() for t in shelf.tokens if t >= 0}
    assert kept == set(range(12 - len(kept), 12))  # the newest, whichever their scope
    assert history.view("a").lookup([11000, 11001], 4) is not None
    assert history.view("b").lookup([0, 1], 4) is None


def test_the_drafter_proposes_from_history_as_its_own_kind_and_follows_it() -> None:
    history = History("m")
    history.feed(item(0))
    drafter = NgramDrafter(history=history.view())
    text = item(1)[:4]
    drafter.begin(text)
    draft = drafter.propose(text, 16)
    assert draft.kind.startswith("cache/") and draft.tokens[:5] == TEMPLATE[2:7]
    text += draft.tokens[:5] + [TEMPLATE[7]]  # all five accepted, and the target's own token
    drafter.accept(text, 5)
    follow = drafter.propose(text, 3)
    assert follow.kind == "cache/follow" and follow.tokens == TEMPLATE[8:11]
    # the sequence's own text, matched as long, wins a tie it holds as often
    own = NgramDrafter(history=History("m").view())
    own.begin([4, 5, 6, 7, 4, 5])
    assert own.propose([4, 5, 6, 7, 4, 5], 4).kind.startswith("ngram/")


def test_saved_as_it_is_mode_600_and_loaded_back(tmp_path: Path) -> None:
    path = tmp_path / "h.npz"
    history = History.open("m", path)
    for i in range(4):
        history.feed(item(i), "local" if i < 3 else "key:x")
    assert history.save()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = History.open("m", path)
    assert again.notices == [] and again.n_requests == 4 and again.n_tokens == history.n_tokens
    for n, keys in history.shelves["local"].keys.items():
        assert np.array_equal(again.shelves["local"].keys[n], keys)
    assert again.view("key:x").lookup(item(9)[:4], 8) is not None


@pytest.mark.parametrize("damage", ["garbage", "truncated", "foreign", "newer", "inconsistent"])
def test_an_unusable_file_is_set_aside_with_one_notice(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "h.npz"
    history = History.open("m", path)
    history.feed(item(0))
    history.save()
    if damage == "garbage":
        path.write_bytes(b"not a history at all")
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:200])
    elif damage in ("foreign", "newer"):
        other = History("other-model" if damage == "foreign" else "m")
        other.feed(item(1))
        write(path, other.model, other.shelves, other.serial)
        if damage == "newer":
            _rewrite_meta(path, format=FORMAT + 1)
    else:
        shelf = history.shelves["local"]
        shelf.positions[4] = shelf.positions[4] + 10_000  # past the tokens
        write(path, history.model, history.shelves, history.serial)
    again = History.open("m", path)
    assert len(again.notices) == 1 and "set aside" in again.notices[0], again.notices
    assert again.n_requests == 0 and not path.exists()
    assert len(list(tmp_path.glob("h.npz.bad-*"))) == 1
    again.feed(item(2))
    assert again.save() and History.open("m", path).n_requests == 1  # and the next run starts afresh


def _rewrite_meta(path: Path, **changes: object) -> None:
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(bytes(arrays["meta"]).decode())
    meta.update(changes)
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


_WRITER = """
import sys
from localspec.history import History
path, first = sys.argv[1], int(sys.argv[2])
history = History.open("m", __import__("pathlib").Path(path))
for i in range(first, first + 20):
    history.feed([1, 1000 + i, *range(100, 140)])
    if i % 5 == 4:
        assert history.save()
"""


def test_two_processes_saving_at_once_leave_it_whole_and_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "h.npz"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(first)], env=env)
             for first in (0, 100)]
    assert [p.wait(120) for p in procs] == [0, 0]
    shelves, _ = read(path, "m")  # whole: it reads
    shelf = shelves["local"]
    seen = sorted(int(t) for t in shelf.tokens[shelf.starts + 1])  # each sequence's varying token
    assert seen == [1000 + i for i in (*range(20), *range(100, 120))]


def test_the_cache_command_shows_and_clears(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    history = History.open("a" * 64, history_path("a" * 64))
    history.feed(item(0))
    history.feed(item(1), "key:abc")
    history.save()
    runner = CliRunner()
    shown = runner.invoke(app, ["cache"])
    assert shown.exit_code == 0, shown.output
    assert "2 requests" in shown.output and "scope key:abc: 1 requests" in shown.output
    as_json = json.loads(runner.invoke(app, ["cache", "--json"]).output)
    assert as_json["histories"][0]["scopes"]["local"]["requests"] == 1
    cleared = runner.invoke(app, ["cache", "--clear"])
    assert cleared.exit_code == 0 and "removed 1 history file" in cleared.output
    assert "nothing kept" in runner.invoke(app, ["cache"]).output


def test_a_bad_history_setting_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALSPEC_HISTORY", "sometimes")
    result = CliRunner().invoke(app, ["run", "hello"])
    assert_one_line_error(result.exit_code, result.stderr, "LOCALSPEC_HISTORY", "disk, memory, off")


def test_a_shelf_drops_its_oldest_and_keeps_positions_right() -> None:
    shelf = Shelf()
    for i in range(5):
        shelf.add([10 * i + j for j in range(10)], i)
    shelf.drop_oldest(2)
    assert shelf.n_requests == 3 and int(shelf.tokens[0]) == 20
    match = shelf.lookup([41, 42, 43], 4)
    assert match is not None and match.tokens == [44, 45, 46, 47]


def test_a_bench_job_runs_prompt_by_prompt_and_reports_halves() -> None:
    from localspec.bench.records import RunRecord
    from localspec.bench.runner import halves, schedule_job
    from localspec.bench.suite import load_suite

    jobs = schedule_job(3, ["none", "ngram"], 2)
    assert [j.prompt_index for j in jobs] == [0] * 4 + [1] * 4 + [2] * 4  # a prompt's runs all before the next's
    assert [(j.repeat, j.drafter) for j in jobs[:4]] == [(0, "none"), (0, "ngram"), (1, "ngram"), (1, "none")]
    records = [RunRecord(p, "t", d, 0, [], "", 10, s, 10 / s) for p, d, s in
               [("a", "none", 2.0), ("a", "ngram", 1.0), ("b", "none", 2.0), ("b", "ngram", 0.5)]]
    got = halves(records, ["a", "b"])
    assert got["ngram"]["first_speedup"] == pytest.approx(2.0) and got["ngram"]["second_speedup"] == pytest.approx(4.0)
    for name in ("template-emails", "tool-calls", "code-boilerplate", "multi-turn"):
        assert len(load_suite(Path(name)).prompts) >= 12


def test_bench_job_refuses_parallel_in_one_line() -> None:
    result = CliRunner().invoke(app, ["bench", "--job", "--parallel", "2"])
    assert_one_line_error(result.exit_code, result.stderr, "--job", "--parallel")


def test_a_conversation_that_comes_back_adds_only_its_new_part() -> None:
    history = History("m")
    turn = [1, *range(100, 160)]
    history.feed(turn)
    history.feed([*turn, *range(500, 540)])  # the next turn: the whole conversation again, and more
    assert history.n_tokens == len(turn) + 16 + 40  # the old part once, 16 tokens of it kept at the seam
    assert history.view().lookup([158, 159, 500], 4) is not None  # an n-gram across the seam


def test_a_resumed_batch_reads_back_the_answers_it_already_wrote(tmp_path: Path) -> None:
    from localspec.batch.files import done_texts

    out = tmp_path / "out.jsonl"
    chat = {"custom_id": "c", "response": {"status_code": 200, "body": {"choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hello"}}]}}}
    out.write_text("\n".join([json.dumps({"id": "a", "text": "{\"name\": \"Ann\"}"}), json.dumps(chat),
                              "{torn"]) + "\n", encoding="utf-8")
    assert done_texts(out) == {"a": "{\"name\": \"Ann\"}", "c": "hello"}


def test_a_proposal_from_one_source_carries_the_other_as_its_fallback() -> None:
    history = History("m")
    history.feed([9, 8, 7, 6, 5, 4, 3, 2, 1, 0])
    drafter = NgramDrafter(history=history.view())
    text = [6, 5, 40, 7, 6, 5]  # own: "6 5" went on with 40; earlier requests: "7 6 5" (longer) went on with 4
    drafter.begin(text)
    draft = drafter.propose(text, 4)
    assert draft.kind == "cache/3" and draft.tokens == [4, 3, 2, 1]
    assert draft.fallback is not None and draft.fallback.kind == "ngram/2" and draft.fallback.tokens[:1] == [40]
