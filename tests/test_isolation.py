"""One client cannot hurt another: a request that fails, at admission or later inside the scheduler, fails alone,
with its own error, and every other request gets the text it would have had without it.

The scheduler's guard is checked exactly on the toy model (a job whose own steps raise among others); the server
and batch faces with the real model, llguidance and llama.cpp: each kind of bad request sent while a long one runs
gets a 400 naming its cause, and the long one's text is what it is alone, token for token."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from localspec.events import Finished, Step
from localspec.schema.cache import BoundedCache
from localspec.schema.spec import ConstraintError, ConstraintSpec, capped_json
from localspec.settings import GenerationSettings, SamplingSettings
from localspec.speculative.jobs import Failed, Job
from tests.conftest import localspec
from tests.test_scheduler_toy import PROMPTS, alone, batch
from tests.test_serve import Server, start

# -- the scheduler, exactly (toy model) --


def _raises() -> bool:
    raise RuntimeError("this job's own callback broke")


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_job_whose_own_step_fails_ends_alone_and_the_others_keep_their_text(temperature: float) -> None:
    sampling = [SamplingSettings(temperature=temperature, seed=i) for i in range(6)]
    good = [Job(PROMPTS[i], GenerationSettings(max_tokens=30), sampling[i]) for i in range(4)]
    # one fails in a step of its own (its stop callback raises before a pass), one before it can start (a grammar on
    # a runtime with no vocabulary for it): both mid-batch, with lanes to free for the jobs after them
    broken = Job(PROMPTS[4], GenerationSettings(max_tokens=30), sampling[4], stop=_raises)
    unstartable = Job(PROMPTS[5], GenerationSettings(max_tokens=30, constraint=ConstraintSpec("json_object")),
                      sampling[5])
    jobs = [good[0], broken, good[1], unstartable, good[2], good[3]]
    k = None if temperature == 0 else 3
    got, lanes, events = batch(jobs, 2, ["ngram", "draft"], k)
    failed = {id(job): e for job, e in events if isinstance(e, Failed)}
    assert set(failed) == {id(broken), id(unstartable)}
    assert failed[id(broken)].status == 500 and "RuntimeError: this job's own callback broke" in \
        failed[id(broken)].message
    assert failed[id(unstartable)].status == 400 and "structured output" in failed[id(unstartable)].message
    for i, job in enumerate(jobs):
        if job in good:
            kind = ["ngram", "draft"][i % 2]
            assert got[i] == alone(job.prompt, kind, job.settings, job.sampling, k), f"job {i}"
            assert isinstance([e for j, e in events if j is job][-1], Finished)
    # exactly one last event each, and a failed job's lane emptied for the next
    assert sum(isinstance(e, Finished | Failed) for _, e in events) == len(jobs)
    assert all(not isinstance(e, Step) for j, e in events if j is unstartable)


def test_the_bounded_cache_keeps_count_and_bytes() -> None:
    cache: BoundedCache[str, str] = BoundedCache(3, 10, lambda k, v: len(v))
    for key, value in [("a", "1234"), ("b", "1234"), ("c", "12")]:
        cache.put(key, value)
    assert cache.get("a") == "1234"  # used: the least recent is now b
    cache.put("d", "123")  # 13 bytes: b goes
    assert cache.get("b") is None and cache.bytes == 9 and len(cache) == 3
    cache.put("huge", "x" * 11)  # larger than the whole cache: not kept, nothing dropped for it
    assert cache.get("huge") is None and len(cache) == 3
    for key in "efgh":
        cache.put(key, "")
    assert len(cache) == 3


def test_a_schema_or_tools_list_is_written_as_json_dumps_writes_it_and_refused_past_the_cap() -> None:
    schema = {"type": "object", "properties": {"città": {"type": "string", "pattern": "\\d+"}, "n": {"type": "number"}}}
    assert capped_json(schema, "schema", "x") == json.dumps(schema)  # the spec's text, as before the cap was written
    assert capped_json(schema, "schema", "x", ensure_ascii=False) == json.dumps(schema, ensure_ascii=False)
    huge = {"type": "object", "properties": {f"p{i:05d}": {"type": "string"} for i in range(36000)}}  # ~1 MB
    with pytest.raises(ConstraintError, match="over the 65,536 bytes") as e:
        capped_json(huge, "JSON schema", "response_format.json_schema")
    assert e.value.param == "response_format.json_schema"
    # 33,000 characters of "é": under the cap counted in characters, over it in UTF-8's 66,000 bytes
    wide = {"d": "é" * 33000}
    with pytest.raises(ConstraintError, match="tools list"):
        capped_json(wide, "tools list", "tools", ensure_ascii=False)


# -- the server: each bad kind beside a long request (real model) --

# the long request drafts with a pinned k: its passes then have the sizes its text gives them, whatever the other
# request costs the server's pass timings (adaptive lengths follow those, and a near-tie late in this text flipped
# with them: "Proceeding" against "Proceed to" at 7badb2e). Any change in it is then the bad request's doing
LONG = {"messages": [{"role": "user", "content": "Continue the list up to 100: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"}],
        "max_tokens": 96, "temperature": 0, "speculation": {"k": 4}}


# the same body through the openai client, which sends what it does not know in extra_body
OPENAI_LONG = {**{k: v for k, v in LONG.items() if k != "speculation"},
               "extra_body": {"speculation": LONG["speculation"]}}


def _message(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


def _tools(n: int) -> list[dict]:
    return [{"type": "function", "function": {"name": f"tool_{i}", "parameters": {"type": "object"}}}
            for i in range(n)]


def _nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


SURROGATE_CALL = [{"role": "user", "content": "Weather?"},
                  {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
                      "name": "tool_0", "arguments": '{"city": "\\ud800"}'}}]},
                  {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]

BAD = {
    "unknown special token": ({"response_format": {"type": "grammar", "grammar": "start: <|x|>"}},
                              "unknown special token"),
    "token id out of range": ({"response_format": {"type": "grammar", "grammar": "start: <[999999]>"}},
                              "999999"),
    "GBNF syntax error": ({"response_format": {"type": "grammar", "grammar": "root ::= \"a\" | ("}}, "GBNF"),
    "unsupported schema": ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"$ref": "#/$defs/nowhere"}}}}}},
        "JSON schema"),
    "129 tools": ({"tools": _tools(129)}, "128"),
    "a schema nested past the parser's depth": ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "deep", "schema": _nested(300)}}}, "nests deeper than 64 levels"),
    "a lone surrogate in a call's arguments": ({"messages": SURROGATE_CALL, "tools": _tools(1)}, "lone surrogate"),
    "a 70 KiB schema": ({"response_format": {"type": "json_schema", "json_schema": {"name": "big", "schema": {
        "type": "object", "properties": {f"p{i:05d}": {"type": "string"} for i in range(3000)}}}}},
        "bytes"),
}


@pytest.fixture(scope="module")
def pair(model_path: Path) -> Iterator[Server]:
    """Two sequences, greedy: the long request and a bad one at once."""
    yield from start("--parallel", "2", "--ctx", "1024", "--drafter", "ngram")


def _long(server: Server, stream: bool, started: threading.Event) -> str:
    client = server.client()
    if not stream:
        started.set()
        r = client.chat.completions.create(model="default", **OPENAI_LONG)
        return r.choices[0].message.content or ""
    pieces = []
    for chunk in client.chat.completions.create(model="default", stream=True, **OPENAI_LONG):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
            started.set()
    return "".join(pieces)


def _busy(server: Server) -> int:
    status, _, body = server.http("GET", "/health")
    return json.loads(body)["busy"]


def test_each_bad_request_beside_a_long_one_is_its_own_400_and_the_long_text_is_unchanged(pair: Server) -> None:
    alone_text = _long(pair, False, threading.Event())
    assert len(alone_text) > 150
    for n, (kind, (fields, fragment)) in enumerate(BAD.items()):
        stream = n % 2 == 1
        started = threading.Event()
        out: list[str] = []
        runner = threading.Thread(target=lambda s=stream, e=started, o=out: o.append(_long(pair, s, e)))
        runner.start()
        assert started.wait(120)
        while not stream and _busy(pair) == 0:  # the whole one is running before the bad one comes
            time.sleep(0.01)
        status, _, body = pair.http("POST", "/v1/chat/completions", {"messages": _message("Hi"), "max_tokens": 8,
                                                                     **fields})
        runner.join(300)
        error = json.loads(body)["error"]
        assert status == 400 and fragment in error["message"], (kind, status, error)
        assert out == [alone_text], kind
    log = "".join(pair.log)
    assert "Traceback" not in log and "ExceptionGroup" not in log, log[-2000:]
    # the loop was never held up by a compile: /metrics says how late it woke at worst
    metrics = pair.metrics()
    assert "localspec_event_loop_lag_seconds_max" in metrics


def test_health_says_ok_while_the_worker_runs(pair: Server) -> None:
    status, _, body = pair.http("GET", "/health")
    assert status == 200 and json.loads(body)["status"] == "ok"


# -- batch: bad lines among good ones --


def test_a_batch_with_bad_lines_writes_their_errors_and_every_good_line_as_without_them(tmp_path: Path) -> None:
    good = [{"id": f"g{i}", "messages": _message(text), "max_tokens": 24} for i, text in enumerate(
        ["Name three rivers.", "Count from one to ten in words.", "Say hello in French and Spanish."])]
    bad = [
        {"id": "b-token", "messages": _message("Hi"), "response_format": {"type": "grammar",
                                                                          "grammar": "start: <|x|>"}},
        {"id": "b-range", "messages": _message("Hi"), "response_format": {"type": "grammar",
                                                                          "grammar": "start: <[999999]>"}},
        {"id": "b-tools", "messages": _message("Hi"), "tools": _tools(129)},
    ]
    results = {}
    for name, lines in [("good", good), ("mixed", [good[0], bad[0], good[1], bad[1], bad[2], good[2]])]:
        src, out = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.out.jsonl"
        src.write_text("".join(json.dumps(line) + "\n" for line in lines))
        # no drafter: a drafter's lengths are priced on live pass timings, so under load its passes (and llama.cpp's
        # numerics with them) differ between two runs; target-only passes depend on the texts alone
        r = localspec(["batch", str(src), "-o", str(out), "--parallel", "2", "--ctx", "512", "--drafter", "none"],
                      timeout=300)
        assert r.code in (0, 1), r.stderr
        assert "Traceback" not in r.stderr, r.stderr
        results[name] = {d["id"]: d for d in map(json.loads, out.read_text().splitlines())}
    mixed = results["mixed"]
    for line in bad:
        assert mixed[line["id"]].get("error"), mixed[line["id"]]
    assert "unknown special token" in mixed["b-token"]["error"]
    for line in good:
        assert mixed[line["id"]]["text"] == results["good"][line["id"]]["text"], line["id"]


def test_a_request_past_the_servers_deadline_ends_as_length(model_path: Path) -> None:
    # 2,000 tokens take seconds on any machine this runs on; the deadline is half a second
    server_gen = start("--parallel", "1", "--ctx", "4096", "--drafter", "none", "--request-timeout", "0.5")
    server = next(server_gen)
    try:
        r = server.client().chat.completions.create(
            model="default", messages=_message("Continue the list: 1, 2, 3, 4, 5,"), max_tokens=2000, temperature=0)
        assert r.choices[0].finish_reason == "length" and 0 < r.usage.completion_tokens < 2000, r
        status, _, body = server.http("GET", "/health")
        assert status == 200 and json.loads(body)["busy"] == 0
    finally:
        server_gen.close()


# -- a pass that fails (a fault injected into a real pass: localspec/faults.py) --

FAULT = "FAULT-7f3a"


def test_a_failed_pass_ends_the_requests_in_it_and_the_server_goes_on(model_path: Path) -> None:
    server_gen = start("--parallel", "2", "--ctx", "1024", "--drafter", "ngram", env={"LOCALSPEC_FAULT": FAULT})
    server = next(server_gen)
    try:
        alone_text = _long(server, False, threading.Event())
        got: list[tuple[int, dict]] = []
        runner = threading.Thread(target=lambda: got.append(_answer(server, LONG)))
        runner.start()
        while _busy(server) == 0:  # the long one is running before the faulty one joins its passes
            time.sleep(0.01)
        status, body = _answer(server, {"messages": _message(f"Say {FAULT}."), "max_tokens": 8})
        runner.join(300)
        assert status == 500 and "the shared pass failed: InjectedFault" in body["error"]["message"], body
        # the pass they shared failed: the long one ends with that error too, whole, not a generic one
        assert got and got[0][0] == 500 and "the shared pass failed" in got[0][1]["error"]["message"], got
        # and the server goes on: its lanes empty, the same request gets the same text again
        status, _, health = server.http("GET", "/health")
        assert status == 200 and json.loads(health) == {**json.loads(health), "status": "ok", "busy": 0}
        assert _long(server, False, threading.Event()) == alone_text
        log = "".join(server.log)
        assert "Traceback" not in log and log.count("the shared pass failed") == 1, log[-2000:]
    finally:
        server_gen.close()


def _answer(server: Server, body: dict) -> tuple[int, dict]:
    status, _, raw = server.http("POST", "/v1/chat/completions", body)
    return status, json.loads(raw)


def test_a_batch_whose_pass_fails_writes_errors_for_its_lines_in_it_and_a_resume_runs_them(tmp_path: Path) -> None:
    lines = [{"id": f"g{i}", "messages": _message(text), "max_tokens": 16} for i, text in enumerate(
        ["Name three rivers.", f"Say {FAULT}.", "Count from one to ten in words.", "Say hello in French."])]
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(line) + "\n" for line in lines))
    args = ["batch", str(src), "-o", str(out), "--parallel", "2", "--ctx", "512", "--drafter", "none"]
    r = localspec(args, timeout=300, env={"LOCALSPEC_FAULT": FAULT})
    assert r.code == 1 and "Traceback" not in r.stderr, r.stderr  # some lines failed; the job went on
    first = {d["id"]: d for d in map(json.loads, out.read_text().splitlines())}
    assert set(first) == {line["id"] for line in lines}  # every line has its record
    failed = {i for i, d in first.items() if d.get("error")}
    assert "g1" in failed and all("the shared pass failed" in first[i]["error"] for i in failed)
    assert failed <= {"g0", "g1"}  # only what shared the failed pass: g0 ran beside g1; the lines after it ran
    assert all(first[i]["text"] for i in first if i not in failed)
    # the same command again (no fault now) runs the failed lines and keeps the rest
    r = localspec(args, timeout=300)
    assert r.code == 0, r.stderr
    again = {d["id"]: d for d in map(json.loads, out.read_text().splitlines())}
    assert set(again) == set(first) and not any(d.get("error") for d in again.values())
    assert all(again[i] == first[i] for i in first if i not in failed)
