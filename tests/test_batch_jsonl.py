"""`localspec batch` file formats on real files, no model: every input form, every kind of bad line, ids used twice,
both output styles read back as JSON, and resuming (successes skipped, failures retried, a torn line dropped).

The layer under test is localspec/batch/files.py; tests/test_batch_cli.py covers the command around it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from localspec.batch.files import LineError, ResultWriter, done_ids, read_requests
from localspec.batch.result import Result
from localspec.engine.chat import Message
from localspec.errors import UserError
from localspec.events import Stats
from localspec.request import Request


def write_lines(path: Path, rows: list[object]) -> Path:
    """Each row as one line: a str verbatim (blank lines, broken JSON), anything else as JSON."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def read_back(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n"), "every record ends its line, so the next append starts a new one"
    return [json.loads(line) for line in text.split("\n")[:-1]]


def key(doc: dict[str, Any]) -> str:
    return doc.get("custom_id", doc.get("id"))


def openai(custom_id: str, url: str, body: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body, **extra}


# -- input --


def test_every_input_form_reads_in_file_order_with_its_line_and_own_settings(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "in.jsonl", [
        {"id": "plain", "prompt": "Once upon a time"},
        "",
        {"id": "tuned", "prompt": "p", "max_tokens": 1, "temperature": 0, "top_p": 1, "seed": 0, "stop": "\n"},
        "   \t",
        {"id": "chat", "messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                                    {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}],
         "temperature": 5, "stop": ["a", "b"]},
        openai("oc", "/v1/chat/completions", {
            "model": "ignored", "max_tokens": 99, "max_completion_tokens": 7, "top_p": 0.5, "seed": 3, "stop": ["."],
            "n": 1, "presence_penalty": 0, "tools": [], "response_format": {"type": "text"},
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Count "},
                                                      {"type": "text", "text": "to three."}]}]}),
        openai("ocomp", "/v1/completions", {"prompt": "1, 2,", "temperature": 0.25}),
    ])
    requests, errors = read_requests(path)
    assert errors == []
    assert requests == [
        Request("plain", prompt="Once upon a time", line=1),
        Request("tuned", prompt="p", max_tokens=1, temperature=0.0, top_p=1.0, seed=0, stop=("\n",), line=3),
        Request("chat", messages=(Message("system", "Be brief."), Message("user", "Hi"),
                                  Message("assistant", "Hello."), Message("user", "Bye")),
                temperature=5.0, stop=("a", "b"), line=5),
        Request("oc", messages=(Message("user", "Count to three."),), max_tokens=7, top_p=0.5, seed=3, stop=(".",),
                style="openai-chat", line=6),
        Request("ocomp", prompt="1, 2,", temperature=0.25, style="openai-completions", line=7),
    ]
    # a line's settings override the command's only where given: absent ones stay None for the job to fill in
    assert (requests[0].max_tokens, requests[0].temperature, requests[0].top_p, requests[0].seed,
            requests[0].stop) == (None, None, None, None, None)
    assert isinstance(requests[1].temperature, float) and isinstance(requests[1].top_p, float)


def test_a_line_without_an_id_is_named_by_its_line_number(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "in.jsonl", ["", {"prompt": "no id"}, {"id": 5, "prompt": "a number"},
                                               {"id": None, "prompt": "null is no id"}])
    requests, errors = read_requests(path)
    assert [(r.id, r.line) for r in requests] == [("line-2", 2), ("5", 3), ("line-4", 4)] and errors == []


BAD_LINES = [
    ('{"id": "x", "prompt": "p",', "line-N", "not JSON"),  # unreadable, so named by its line
    ('"just a string"', "line-N", "not a JSON object"),
    ('{"id": "x"}', "x", "either a prompt or messages"),
    ('{"id": "x", "prompt": "p", "messages": [{"role": "user", "content": "m"}]}', "x", "either a prompt or messages"),
    ('{"id": "x", "prompt": [1, 2]}', "x", "prompt must be a string"),
    ('{"id": "x", "prompt": ["p", "q"]}', "x", "prompt must be a string (or a list of one string)"),
    ('{"id": "x", "messages": "hi"}', "x", "messages must be a non-empty list"),
    ('{"id": "x", "messages": []}', "x", "messages must be a non-empty list"),
    ('{"id": "x", "messages": ["hi"]}', "x", "role"),
    ('{"id": "x", "messages": [{"role": "tool", "content": "m"}]}', "x", "tool_call_id"),
    ('{"id": "x", "messages": [{"role": "user", "content": 3}]}', "x", "content must be a string"),
    ('{"id": "x", "messages": [{"role": "user"}]}', "x", "content must be a string"),
    ('{"id": "x", "prompt": "p", "temperature": 5.01}', "x", "temperature must be between 0 and 5"),
    ('{"id": "x", "prompt": "p", "temperature": -0.1}', "x", "temperature must be between 0 and 5"),
    ('{"id": "x", "prompt": "p", "temperature": NaN}', "x", "temperature must be between 0 and 5"),
    ('{"id": "x", "prompt": "p", "temperature": "hot"}', "x", "temperature must be a number"),
    ('{"id": "x", "prompt": "p", "temperature": true}', "x", "temperature must be a number"),
    ('{"id": "x", "prompt": "p", "max_tokens": 0}', "x", "max_tokens must be at least 1"),
    ('{"id": "x", "prompt": "p", "max_tokens": 2.5}', "x", "max_tokens must be an integer"),
    ('{"id": "x", "prompt": "p", "top_p": 1.5}', "x", "top_p must be in (0, 1]"),
    ('{"id": "x", "prompt": "p", "top_p": 0}', "x", "top_p must be in (0, 1]"),
    ('{"id": "x", "prompt": "p", "seed": -1}', "x", "seed must be 0 or more"),
    ('{"id": "x", "prompt": "p", "seed": 1.5}', "x", "seed must be an integer"),
    ('{"id": "x", "prompt": "p", "stop": 7}', "x", "stop must be"),
    ('{"id": "x", "prompt": "p", "stop": ["a", 1]}', "x", "stop must be"),
    ('{"method": "POST", "url": "/v1/completions", "body": {"prompt": "p"}}', "line-N", "needs a custom_id"),
    ('{"custom_id": 9, "url": "/v1/completions", "body": {"prompt": "p"}}', "9", "needs a custom_id"),
    ('{"custom_id": "x", "method": "PUT", "url": "/v1/completions", "body": {"prompt": "p"}}', "x",
     "method must be POST"),
    ('{"custom_id": "x", "method": "POST", "url": "/v1/responses", "body": {"input": "p"}}', "x", "url must be one of"),
    ('{"custom_id": "x", "method": "POST", "url": "/v1/completions", "body": "p"}', "x", "body must be a JSON object"),
    ('{"custom_id": "x", "method": "POST", "url": "/v1/completions", "body": {"messages": []}}', "x",
     "needs a prompt"),
    ('{"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": {"prompt": "p"}}', "x",
     "needs messages"),
    ('{"custom_id": "x", "url": "/v1/completions", "body": {"prompt": "p", "max_tokens": -3}}', "x",
     "max_tokens must be at least 1"),
]


@pytest.mark.parametrize("line,name,message", BAD_LINES)
def test_a_bad_line_is_an_error_record_for_its_id_and_the_job_goes_on(
    tmp_path: Path, line: str, name: str, message: str
) -> None:
    path = write_lines(tmp_path / "in.jsonl", [{"id": "before", "prompt": "a"}, line, {"id": "after", "prompt": "b"}])
    requests, errors = read_requests(path)
    assert [r.id for r in requests] == ["before", "after"]
    [error] = errors
    assert (error.id, error.line) == (name.replace("line-N", "line-2"), 2) and message in error.message, error
    assert "\n" not in error.message
    assert error.style == ("openai-completions" if '"/v1/completions"' in line else
                           "openai-chat" if "custom_id" in line or "body" in line else "plain")


def test_ids_used_twice_stop_the_job_with_one_line_naming_both_lines(tmp_path: Path) -> None:
    across_styles = [{"id": "a", "prompt": "x"}, "", openai("a", "/v1/completions", {"prompt": "y"})]
    with pytest.raises(UserError) as got:
        read_requests(write_lines(tmp_path / "styles.jsonl", across_styles))
    assert "'a'" in str(got.value) and "line 1 and line 3" in str(got.value) and "\n" not in str(got.value)
    # a bad line keeps its id too: its error record and the good line's result could not be told apart
    with pytest.raises(UserError, match="id 'b' is on line 1 and line 2"):
        read_requests(write_lines(tmp_path / "bad.jsonl", [{"id": "b", "prompt": 3}, {"id": "b", "prompt": "y"}]))


def test_a_missing_or_unreadable_input_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no input file"):
        read_requests(tmp_path / "none.jsonl")
    (tmp_path / "latin1.jsonl").write_bytes(b'{"id": "a", "prompt": "caf\xe9"}\n')
    with pytest.raises(UserError, match="cannot read"):
        read_requests(tmp_path / "latin1.jsonl")


# -- output --

STATS = Stats(prompt_tokens=11, generated_tokens=3, decode_seconds=0.5, target_passes=2, drafted=4, accepted=1,
              accepted_by_position=[[1, 2], [0, 2]], stop_reason="eog")


def test_plain_lines_get_text_token_count_finish_reason_and_stats(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    with ResultWriter(out, "gemma") as writer:
        writer.write(Result("a", "Paris. é ✓", [5, 6, 7], "stop", STATS), Request("a", prompt="p", line=1))
        writer.write(Result("b", finish_reason="error", error="the prompt is too long: raise --ctx"),
                     Request("b", prompt="p" * 9, line=4))
        writer.write_error(LineError("line-5", 5, "line 5 is not JSON (Expecting value)"))
    a, b, bad = read_back(out)
    expected = STATS.to_dict()
    del expected["accepted_by_position"]
    assert a == {"id": "a", "text": "Paris. é ✓", "tokens": 3, "finish_reason": "stop", "stats": expected}
    assert b == {"id": "b", "error": "the prompt is too long: raise --ctx", "line": 4}
    assert bad == {"id": "line-5", "error": "line 5 is not JSON (Expecting value)", "line": 5}
    assert "é ✓" in out.read_text(encoding="utf-8")  # written as text, not \\u escapes


@pytest.mark.parametrize("finish,openai_finish", [("stop", "stop"), ("length", "length"), ("context_full", "length")])
def test_openai_chat_lines_get_openai_batch_output(tmp_path: Path, finish: str, openai_finish: str) -> None:
    out = tmp_path / "out.jsonl"
    with ResultWriter(out, "gemma-3-270m") as writer:
        writer.write(Result("req-1", "One, two, three.", [1, 2, 3, 4], finish, STATS),
                     Request("req-1", messages=(Message("user", "Count"),), style="openai-chat"))
    [doc] = read_back(out)
    assert set(doc) == {"id", "custom_id", "response", "error"} and doc["error"] is None
    assert doc["custom_id"] == "req-1" and doc["id"] == "batch_req_req-1"
    response = doc["response"]
    assert response["status_code"] == 200 and isinstance(response["request_id"], str)
    body = response["body"]
    assert body["object"] == "chat.completion" and body["model"] == "gemma-3-270m"
    assert isinstance(body["id"], str) and isinstance(body["created"], int)
    assert body["choices"] == [{"index": 0, "finish_reason": openai_finish,
                                "message": {"role": "assistant", "content": "One, two, three."}}]
    assert body["usage"] == {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15,
                             "completion_tokens_details": {"reasoning_tokens": 0, "accepted_prediction_tokens": 0,
                                                           "rejected_prediction_tokens": 0}}


def test_openai_completion_lines_get_text_completion_bodies(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    with ResultWriter(out, "m") as writer:
        writer.write(Result("c", " 3, 4", [9, 9], "length", STATS),
                     Request("c", prompt="1, 2,", style="openai-completions"))
    [doc] = read_back(out)
    body = doc["response"]["body"]
    assert doc["custom_id"] == "c" and doc["error"] is None and doc["response"]["status_code"] == 200
    assert body["object"] == "text_completion" and body["model"] == "m"
    assert body["choices"] == [{"index": 0, "text": " 3, 4", "finish_reason": "length"}]
    assert body["usage"] == {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13,
                             "completion_tokens_details": {"reasoning_tokens": 0, "accepted_prediction_tokens": 0,
                                                           "rejected_prediction_tokens": 0}}


def test_failed_openai_lines_carry_an_error_object_and_no_response(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "in.jsonl", [openai("x", "/v1/completions", {"prompt": "p", "top_p": 2})])
    [], [line_error] = read_requests(path)
    out = tmp_path / "out.jsonl"
    with ResultWriter(out, "m") as writer:
        writer.write_error(line_error)
        writer.write(Result("y", finish_reason="error", error="too long"),
                     Request("y", prompt="p", style="openai-chat"))
    bad, failed = read_back(out)
    assert bad["custom_id"] == "x" and bad["id"] == "batch_req_x" and bad["response"] is None
    assert set(bad["error"]) == {"code", "message"} and "top_p must be in (0, 1]" in bad["error"]["message"]
    assert failed == {"id": "batch_req_y", "custom_id": "y", "response": None,
                      "error": {"code": failed["error"]["code"], "message": "too long"}}
    assert isinstance(failed["error"]["code"], str) and failed["error"]["code"]


def test_each_result_is_one_whole_line_on_disk_as_soon_as_it_is_written(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    with ResultWriter(out, "m") as writer:
        for i in range(3):
            writer.write(Result(f"r{i}", "x\ny" * 3000, [1]), Request(f"r{i}", prompt="p"))
            # read through another handle before close: the line is already there, whole
            assert [key(d) for d in read_back(out)] == [f"r{j}" for j in range(i + 1)]
    with ResultWriter(out, "m") as writer:  # a second writer appends, it never truncates
        writer.write(Result("r3", "z", [1]), Request("r3", prompt="p"))
    assert [key(d) for d in read_back(out)] == ["r0", "r1", "r2", "r3"]


# -- resuming --


def test_resuming_skips_successes_and_retries_failures_without_doubling_a_line(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    assert done_ids(out) == set() and not out.exists()  # a first run: nothing done, nothing created
    with ResultWriter(out, "m") as writer:
        writer.write(Result("a", "A", [1]), Request("a", prompt="p", line=1))
        writer.write(Result("b", error="too long", finish_reason="error"), Request("b", prompt="p", line=2))
        writer.write(Result("c", "C", [1]), Request("c", prompt="p", style="openai-chat", line=3))
        writer.write(Result("d", error="too long", finish_reason="error"),
                     Request("d", prompt="p", style="openai-completions", line=4))
        writer.write_error(LineError("line-5", 5, "line 5 is not JSON"))
    first = read_back(out)
    assert done_ids(out) == {"a", "c"}
    assert read_back(out) == [first[0], first[2]]  # the successes untouched, the failures' records gone
    with ResultWriter(out, "m") as writer:  # the retried ones: b succeeds now, d and line-5 fail again
        writer.write(Result("b", "B", [1]), Request("b", prompt="p", line=2))
        writer.write(Result("d", error="too long", finish_reason="error"),
                     Request("d", prompt="p", style="openai-completions", line=4))
        writer.write_error(LineError("line-5", 5, "line 5 is not JSON"))
    assert sorted(key(d) for d in read_back(out)) == ["a", "b", "c", "d", "line-5"]  # one line per id
    assert done_ids(out) == {"a", "b", "c"}
    assert sorted(key(d) for d in read_back(out)) == ["a", "b", "c"]
    assert os.listdir(tmp_path) == ["out.jsonl"]  # the rewrite's temporary file is gone


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o664])
def test_a_rewritten_output_keeps_its_mode_and_its_link(tmp_path: Path, mode: int) -> None:
    real = tmp_path / "real.jsonl"
    with ResultWriter(real, "m") as writer:
        writer.write(Result("a", "A", [1]), Request("a", prompt="p"))
        writer.write(Result("b", error="too long", finish_reason="error"), Request("b", prompt="p"))
    real.chmod(mode)
    out = tmp_path / "out.jsonl"
    out.symlink_to(real)
    assert done_ids(out) == {"a"}  # rewritten without b's error record
    assert out.is_symlink() and [key(d) for d in read_back(real)] == ["a"]
    assert real.stat().st_mode & 0o7777 == mode


def test_a_file_with_nothing_to_drop_is_not_rewritten(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    with ResultWriter(out, "m") as writer:
        writer.write(Result("a", "A", [1]), Request("a", prompt="p"))
    before = out.stat()
    assert done_ids(out) == {"a"}
    after = out.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_a_torn_or_hand_broken_line_is_dropped_so_the_file_stays_jsonl(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    with ResultWriter(out, "m") as writer:
        writer.write(Result("a", "A", [1]), Request("a", prompt="p"))
    with out.open("a", encoding="utf-8") as f:
        f.write("this line was edited by hand\n")
        f.write(json.dumps({"no": "id"}) + "\n")
        f.write(json.dumps({"id": "b", "text": "B", "tokens": 1}) + "\n")
        f.write('{"id": "c", "text": "half a li')  # torn
    assert done_ids(out) == {"a", "b"}
    assert [key(d) for d in read_back(out)] == ["a", "b"]  # ends on a newline: the next append starts clean
    with ResultWriter(out, "m") as writer:
        writer.write(Result("c", "C", [1]), Request("c", prompt="p"))
    assert [key(d) for d in read_back(out)] == ["a", "b", "c"]


def test_a_whole_last_record_without_its_newline_runs_again(tmp_path: Path) -> None:
    # it cannot be told from a line cut just after its last brace, and appending to it would glue two records
    out = tmp_path / "out.jsonl"
    out.write_text(json.dumps({"id": "a", "text": "A", "tokens": 1}) + "\n" + json.dumps({"id": "b", "text": "B"}),
                   encoding="utf-8")
    assert done_ids(out) == {"a"}
    assert [key(d) for d in read_back(out)] == ["a"]


def test_an_output_that_is_not_utf8_cannot_be_resumed(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_bytes(b'{"id": "a", "text": "caf\xe9"}\n')
    with pytest.raises(UserError, match="to resume it"):
        done_ids(out)
    assert out.read_bytes() == b'{"id": "a", "text": "caf\xe9"}\n'  # left as it was for the user to look at


# -- line separators inside JSON strings, and a byte-order mark: once wrongly split or misread --

SEPARATORS = "\u2028\u2029\x85"  # line breaks to str.splitlines, ordinary characters inside a JSON string


def test_a_prompt_holding_a_unicode_line_separator_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"id": "a", "prompt": f"x{SEPARATORS}y"}, ensure_ascii=False) + "\n"
                    + json.dumps({"id": "b", "prompt": "z"}) + "\n", encoding="utf-8")
    requests, errors = read_requests(path)
    assert errors == [] and [(r.id, r.line) for r in requests] == [("a", 1), ("b", 2)]


def test_a_result_holding_a_unicode_line_separator_survives_a_resume(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    with ResultWriter(out, "m") as writer:
        writer.write(Result("a", f"one{SEPARATORS}two", [1]), Request("a", prompt="p"))
    assert done_ids(out) == {"a"}
    assert read_back(out)[0]["text"] == f"one{SEPARATORS}two"
    # escaped on disk: readers that split as str.splitlines does still see one line
    raw = out.read_text(encoding="utf-8")
    assert not set(SEPARATORS) & set(raw) and raw.count("\n") == len(raw.splitlines()) == 1


def test_an_input_with_a_byte_order_mark_reads_its_first_line(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text("\ufeff" + json.dumps({"id": "a", "prompt": "p"}) + "\n", encoding="utf-8")
    requests, errors = read_requests(path)
    assert errors == [] and [r.id for r in requests] == ["a"]


def test_an_input_with_crlf_line_ends_reads_every_line(tmp_path: Path) -> None:
    # splitting at "\n" alone must not leave Windows line ends behind
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"id": "a", "prompt": "p"}\r\n\r\n{"id": "b", "prompt": "q"}\r\n')
    requests, errors = read_requests(path)
    assert errors == [] and [(r.id, r.line) for r in requests] == [("a", 1), ("b", 3)]
