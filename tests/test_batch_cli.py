"""`localspec batch`: the file formats, bad input, resuming, Ctrl-C, and a real job on the real model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from localspec.batch.files import ResultWriter, done_ids, is_stream, parse_line, read_requests
from localspec.batch.result import Result
from localspec.cli import app
from localspec.engine.chat import Message
from localspec.errors import UserError
from localspec.request import Request
from tests.conftest import assert_one_line_error, interruptible

CHAT = {"custom_id": "c", "method": "POST", "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": [{"type": "text", "text": "Count to five."}]}],
                 "max_tokens": 12, "stop": "six"}}
COMPLETION = {"custom_id": "d", "method": "POST", "url": "/v1/completions",
              "body": {"prompt": "1, 2, 3,", "max_tokens": 10, "temperature": 0.7, "seed": 1}}
JOB = [
    {"id": "a", "prompt": "The capital of France is", "max_tokens": 12},
    {"id": "b", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8, "stop": ["\n"]},
    CHAT,
    COMPLETION,
]


def write(path: Path, rows: list[object]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# -- input lines --


def test_every_input_form_becomes_a_request_with_its_own_settings() -> None:
    plain, chat, openai_chat, openai_completion = (parse_line(json.dumps(r), i + 1) for i, r in enumerate(JOB))
    assert plain == Request("a", prompt="The capital of France is", max_tokens=12, line=1)
    assert chat == Request("b", messages=(Message("user", "Say hi."),), max_tokens=8, stop=("\n",), line=2)
    assert openai_chat == Request("c", messages=(Message("user", "Count to five."),), max_tokens=12, stop=("six",),
                                  style="openai-chat", line=3)
    assert openai_completion == Request("d", prompt="1, 2, 3,", max_tokens=10, temperature=0.7, seed=1,
                                        style="openai-completions", line=4)
    assert parse_line('{"prompt": "no id"}', 9).id == "line-9"


@pytest.mark.parametrize("line,message", [
    ("{oops", "not JSON"),
    ("[1, 2]", "not a JSON object"),
    ('{"id": "x"}', "either a prompt or messages"),
    ('{"id": "x", "prompt": "p", "messages": [{"role": "user", "content": "m"}]}', "either a prompt or messages"),
    ('{"id": "x", "prompt": 5}', "prompt must be a string"),
    ('{"id": "x", "messages": [{"role": "robot", "content": "m"}]}', "role"),
    ('{"id": "x", "prompt": "p", "temperature": 9}', "temperature must be between 0 and 5"),
    ('{"id": "x", "prompt": "p", "max_tokens": 0}', "max_tokens must be at least 1"),
    ('{"id": "x", "prompt": "p", "max_tokens": "ten"}', "max_tokens must be an integer"),
    ('{"id": "x", "prompt": "p", "top_p": 0}', "top_p must be in (0, 1]"),
    ('{"id": "x", "prompt": "p", "seed": -1}', "seed must be 0 or more"),
    ('{"id": "x", "prompt": "p", "stop": [""]}', "stop must be"),
    ('{"custom_id": "x", "method": "GET", "url": "/v1/completions", "body": {"prompt": "p"}}', "method must be POST"),
    ('{"custom_id": "x", "url": "/v1/embeddings", "body": {"input": "p"}}', "url must be one of"),
    ('{"custom_id": "x", "url": "/v1/chat/completions", "body": {"prompt": "p"}}', "needs messages"),
])
def test_a_bad_line_is_an_error_for_its_id_not_for_the_job(line: str, message: str) -> None:
    got = parse_line(line, 3)
    assert not isinstance(got, Request) and message in got.message, got
    assert got.id in ("x", "line-3")


def test_an_id_used_twice_stops_the_job_before_any_work(tmp_path: Path) -> None:
    path = write(tmp_path / "in.jsonl", [{"id": "a", "prompt": "x"}, "", {"id": "b", "prompt": "y"},
                                         {"id": "a", "prompt": "z"}])
    with pytest.raises(UserError, match="id 'a' is on line 1 and line 4"):
        read_requests(path)


# -- output and resuming --


def test_resuming_keeps_successes_drops_failures_and_a_torn_line(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    with ResultWriter(out, "m") as writer:
        writer.write(Result("a", "text", [1, 2]), Request("a", prompt="p"))
        writer.write(Result("b", finish_reason="error", error="too long"), Request("b", prompt="p", line=2))
        writer.write(Result("c", "x", [3]), Request("c", prompt="p", style="openai-chat"))
    with out.open("a", encoding="utf-8") as f:
        f.write('{"id": "d", "text": "half')  # a torn last line
    assert done_ids(out) == {"a", "c"}
    assert [_id for _id in (d.get("custom_id", d.get("id")) for d in lines(out))] == ["a", "c"]  # valid JSONL again


# -- the command --


@pytest.mark.parametrize("args,message", [
    (["{missing}", "-o", "{out}"], "no input file"),
    (["{dup}", "-o", "{out}"], "ids must be unique"),
    (["{good}", "-o", "{out}", "--parallel", "0"], "--parallel must be 'auto' or a number"),
    (["{good}", "-o", "{out}", "--parallel", "many"], "--parallel must be 'auto' or a number"),
    (["{good}", "-o", "{out}", "--replay-costs", "h100"], "add --summary FILE"),
    (["{good}", "-o", "{out}", "--replay-costs", "nope", "--summary", "{out}.s"], "no cost table"),
    (["{good}", "-o", "{out}", "--drafter", "draft"], "--drafter draft needs a draft model"),
    (["{good}", "-o", "{out}", "--temperature", "-1"], "--temperature must be between 0 and 5"),
    (["{good}", "-o", "{out}", "--max-tokens", "100", "--max-tokens-cap", "50"], "is over --max-tokens-cap 50"),
    # the prompts as the results: compared as files, not names
    (["{good}", "-o", "{good}"], "are the same file"),
    (["{good}", "-o", "{hard}"], "are the same file"),
    (["{good}", "-o", "{link}"], "are the same file"),
    (["{good}", "-o", "{out}", "--summary", "{link}"], "are the same file"),
    # found out before the job runs, not after
    (["{good}", "-o", "{out}", "--summary", "{tmp}/no/such/folder/s.json"], "there is no folder"),
    (["{good}", "-o", "{tmp}/no/such/folder/out.jsonl"], "there is no folder"),
    (["{good}", "-o", "{tmp}"], "is a folder"),
])
def test_bad_usage_is_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    good = write(tmp_path / "good.jsonl", [{"id": "a", "prompt": "x"}])
    (tmp_path / "hard.jsonl").hardlink_to(good)
    (tmp_path / "link.jsonl").symlink_to(good)
    paths = {"missing": str(tmp_path / "none.jsonl"), "out": str(tmp_path / "out.jsonl"), "good": str(good),
             "hard": str(tmp_path / "hard.jsonl"), "link": str(tmp_path / "link.jsonl"), "tmp": str(tmp_path),
             "dup": str(write(tmp_path / "dup.jsonl", [{"id": "a", "prompt": "x"}, {"id": "a", "prompt": "y"}]))}
    before = good.stat()
    result = CliRunner().invoke(app, ["batch", *(a.format(**paths) for a in args)])
    assert_one_line_error(result.exit_code, result.stderr, message)
    assert not (tmp_path / "out.jsonl").exists() or "ids must be unique" not in message
    after = good.stat()  # the prompts untouched: same content, same mode
    assert good.read_text() == '{"id": "a", "prompt": "x"}\n' and after.st_mode == before.st_mode


def test_a_rerun_with_all_done_still_writes_the_whole_jobs_summary(tmp_path: Path) -> None:
    inp = write(tmp_path / "in.jsonl", [{"id": "a", "prompt": "x"}, {"id": "b", "prompt": "y"}])
    out, summary = tmp_path / "out.jsonl", tmp_path / "summary.json"
    with ResultWriter(out, "m") as writer:
        for name in ("a", "b"):
            writer.write(Result(name, "done", [1, 2]), Request(name, prompt="p"))
    result = CliRunner().invoke(app, ["batch", str(inp), "-o", str(out), "--summary", str(summary),
                                      "--model", "/nonexistent/never-loaded.gguf"])
    assert result.exit_code == 0, result.output
    assert "2 of 2 already done" in result.stderr
    totals = json.loads(summary.read_text())
    assert (totals["prompts"], totals["ok"], totals["failed"], totals["already_done"], totals["ran"]) == (2, 2, 0, 2, 0)
    assert (totals["generated_tokens"], totals["passes"], totals["interrupted"]) == (0, 0, False)
    assert totals["device"] is None


def test_a_stream_output_is_written_and_never_read_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert is_stream(Path("-")) and is_stream(fifo) and is_stream(Path("/dev/null"))
    assert not is_stream(tmp_path / "new.jsonl") and not is_stream(write(tmp_path / "f.jsonl", []))
    with ResultWriter(Path("-"), "m") as writer:
        writer.write(Result("a", "A", [1]), Request("a", prompt="p"))
    assert json.loads(capsys.readouterr().out)["text"] == "A"
    assert not (tmp_path / "-").exists()


def test_a_real_job_writes_every_line_and_resumes_without_redoing_work(tmp_path: Path, model_path: Path) -> None:
    # a lone surrogate (JSON's "\ud800") once made every run of the job a traceback
    inp = write(tmp_path / "in.jsonl", [*JOB, "not json", {"id": "long", "prompt": "word " * 600},
                                        '{"id": "odd", "prompt": "a\\ud800b"}'])
    out, summary = tmp_path / "out.jsonl", tmp_path / "summary.json"
    args = ["batch", str(inp), "-o", str(out), "--model", str(model_path), "--ctx", "512", "--quiet"]
    result = CliRunner().invoke(app, [*args, "--summary", str(summary), "--replay-costs", "h100"])
    assert result.exit_code == 1, result.output
    assert "3 of 7 prompts failed" in result.stderr
    by_id = {d.get("custom_id", d.get("id")): d for d in lines(out)}
    assert sorted(by_id) == ["a", "b", "c", "d", "line-5", "long", "odd"]
    assert "lone surrogate" in by_id["odd"]["error"]
    a = by_id["a"]
    assert a["tokens"] == 12 and a["finish_reason"] == "length" and a["stats"]["generated_tokens"] == 12
    assert "\n" not in by_id["b"]["text"]  # its own stop
    chat = by_id["c"]["response"]
    assert chat["status_code"] == 200 and chat["body"]["object"] == "chat.completion"
    assert chat["body"]["choices"][0]["message"]["role"] == "assistant"
    assert chat["body"]["usage"]["completion_tokens"] <= 12
    assert by_id["d"]["response"]["body"]["choices"][0]["text"]
    assert "not JSON" in by_id["line-5"]["error"] and "raise --ctx" in by_id["long"]["error"]
    totals = json.loads(summary.read_text())
    assert totals["prompts"] == 7 and totals["ok"] == 4 and totals["failed"] == 3
    assert totals["generated_tokens"] == sum(d["tokens"] for d in by_id.values() if "tokens" in d) + sum(
        d["response"]["body"]["usage"]["completion_tokens"] for d in by_id.values() if d.get("response"))
    assert totals["replayed"]["tokens_per_second"] > 0 and "H100" in totals["replayed"]["device"]
    # again: the four successes are skipped, the three failures run (and fail) again, and no line is doubled; the
    # summary counts the whole job, and says what this run did
    again = CliRunner().invoke(app, [*args, "--summary", str(summary)])
    assert again.exit_code == 1 and "4 of 7 already done" in again.stderr
    totals = json.loads(summary.read_text())
    assert (totals["prompts"], totals["ok"], totals["failed"], totals["already_done"], totals["ran"]) == (7, 4, 3, 4, 3)
    assert sorted(d.get("custom_id", d.get("id")) for d in lines(out)) == sorted(by_id)
    assert [d for d in lines(out) if "error" not in d or d["error"] is None] == [
        d for d in by_id.values() if "error" not in d or d["error"] is None]  # the successes, untouched


def test_ctrl_c_stops_the_job_leaves_whole_lines_and_says_how_to_resume(tmp_path: Path, model_path: Path) -> None:
    inp = write(tmp_path / "in.jsonl", [{"id": f"p{i}", "prompt": f"Count from {i}:", "max_tokens": 8 + 40 * (i % 2)}
                                        for i in range(12)])
    out = tmp_path / "out.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "localspec", "batch", str(inp), "-o", str(out), "--model", str(model_path),
         "--parallel", "2", "--ctx", "256", "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=interruptible,
    )  # fmt: skip
    deadline = time.monotonic() + 120  # a bound on waiting, not a timing assertion
    while (not out.exists() or not out.read_text()) and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    text = err.decode()
    assert proc.returncode == 130, text
    assert "run the same command again to resume" in text and "Traceback" not in text
    written = lines(out)  # every line whole
    assert 1 <= len(written) < 12 and all(d["tokens"] >= 1 for d in written)


def test_results_to_a_pipe_come_out_and_the_job_ends(tmp_path: Path, model_path: Path) -> None:
    # `-o /dev/stdout | cat` once hung: reading the pipe it writes, to resume, waits forever
    inp = write(tmp_path / "in.jsonl", [{"id": "a", "prompt": "1, 2, 3,", "max_tokens": 3}, {"id": None, "prompt": 5}])
    proc = subprocess.run(
        [sys.executable, "-m", "localspec", "batch", str(inp), "-o", "/dev/stdout", "--model", str(model_path),
         "--ctx", "256", "--parallel", "1", "--quiet"],
        capture_output=True, text=True, timeout=300,  # a bound on a hang, not a timing assertion
    )  # fmt: skip
    assert proc.returncode == 1 and "error records are on stdout" in proc.stderr, proc.stderr
    by_id = {d["id"]: d for d in (json.loads(line) for line in proc.stdout.splitlines())}
    assert by_id["a"]["tokens"] == 3 and "prompt must be a string" in by_id["line-2"]["error"]


def test_a_finished_job_says_what_it_did_and_what_came_from_earlier_requests(tmp_path: Path, model_path: Path) -> None:
    item = {"prompt": "Reply with only a JSON object with the keys name and city: Ann lives in Oslo.", "max_tokens": 24}
    inp = write(tmp_path / "in.jsonl", [{"id": "a", **item}, {"id": "b", **item}])
    out, summary = tmp_path / "out.jsonl", tmp_path / "summary.json"
    # one at a time: the second line drafts from the first one's text
    args = ["batch", str(inp), "-o", str(out), "--model", str(model_path), "--ctx", "512", "--parallel", "1"]
    result = CliRunner().invoke(app, [*args, "--summary", str(summary)], env={"LOCALSPEC_HISTORY": "memory"})
    assert result.exit_code == 0, result.output
    last = result.stderr.strip().splitlines()[-1]
    totals = json.loads(summary.read_text())
    assert last.startswith(f"localspec: done: 2 prompt(s), {totals['generated_tokens']} tokens in ")
    assert last.endswith(f"results in {out}")
    assert totals["cache_drafted"] == sum(d["stats"]["cache_drafted"] for d in lines(out)) > 0
    assert f"{totals['cache_accepted']} of {totals['cache_drafted']} drafted from earlier requests" in last


def test_a_line_nested_past_the_bound_fails_alone_between_two_good_ones(tmp_path: Path, model_path: Path) -> None:
    """An earlier call's arguments nested 5,000 deep ended the whole job with a RecursionError traceback before any
    line ran (0f55e20); now that line is an error record naming the field, and the good lines around it run."""
    deep = {"id": "deep", "messages": [
        {"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[" * 5000 + "]" * 5000}}]},
        {"role": "tool", "tool_call_id": "c", "content": "1"}]}
    inp = write(tmp_path / "in.jsonl", [{"id": "a", "prompt": "One"}, deep, {"id": "b", "prompt": "Two"}])
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(app, ["batch", str(inp), "-o", str(out), "--model", str(model_path), "--ctx", "256",
                                      "--max-tokens", "2", "--quiet"])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    by_id = {d["id"]: d for d in lines(out)}
    assert sorted(by_id) == ["a", "b", "deep"] and by_id["a"]["text"] and by_id["b"]["text"]
    assert "arguments" in by_id["deep"]["error"] and "deeper than" in by_id["deep"]["error"]
