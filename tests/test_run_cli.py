"""`localspec run` end to end: the real command, the real model, the real llama.cpp."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import Result, interruptible, localspec
from tests.conftest import assert_one_line_error as one_line_error

PARIS = "Question: What is the capital of France?\nAnswer:"


def assert_one_line_error(result: Result, *fragments: str) -> None:
    one_line_error(result.code, result.stderr, *fragments)


def test_greedy_answer_is_sensible_and_deterministic(model_path: Path) -> None:
    first = localspec(["run", PARIS, "--max-tokens", "8", "--drafter", "none"])
    again = localspec(["run", PARIS, "--max-tokens", "8", "--drafter", "none"])
    assert first.code == 0, first.stderr
    assert "Paris" in first.stdout
    assert first.stdout == again.stdout
    assert "tok/s" in first.stderr and "prefill" in first.stderr


def test_json_document_has_the_documented_shape(model_path: Path) -> None:
    result = localspec(["run", PARIS, "--max-tokens", "12", "--json"])
    assert result.code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert set(doc) >= {"model", "drafter", "text", "tokens", "stats"}
    assert doc["model"] == "gemma3-270m" and doc["drafter"] == "auto"
    assert doc["text"] == "".join(t["text"] for t in doc["tokens"])
    for token in doc["tokens"]:
        assert set(token) == {"id", "text", "source"} and token["source"] in ("draft", "target")
    stats = doc["stats"]
    for key in ("prompt_tokens", "generated_tokens", "prefill_seconds", "decode_seconds", "tokens_per_second",
                "target_passes", "drafted", "accepted", "acceptance_rate", "mean_accepted_length",
                "tree_passes", "branches"):
        assert key in stats, key
    assert stats["generated_tokens"] == len(doc["tokens"]) <= 12
    assert stats["tree_passes"] == stats["branches"] == 0  # one chain unless --branches N asks for trees
    assert "tree passes" not in result.stderr


def test_tree_counts_in_json_and_on_the_stats_line(model_path: Path) -> None:
    # whether the policy builds trees on this machine depends on its pass costs: the counts must agree either way
    prompt = "Repeat: the cat sat on the mat, the cat ran to the rug, the cat sat on the"
    result = localspec(["run", prompt, "--drafter", "ngram", "--branches", "2", "--max-tokens", "12", "--json"])
    assert result.code == 0, result.stderr
    stats = json.loads(result.stdout)["stats"]
    assert 0 <= stats["tree_passes"] <= stats["target_passes"]
    assert stats["branches"] == 2 * stats["tree_passes"]  # a tree pass verified exactly 2 branches here
    assert stats["mean_accepted_length"] == pytest.approx(stats["generated_tokens"] / stats["target_passes"])
    assert "tokens/pass" in result.stderr
    assert ("tree passes" in result.stderr) == (stats["tree_passes"] > 0)


def test_stats_line_counts_tree_passes_and_branches() -> None:
    from localspec.cli.render import stats_lines
    from localspec.events import Stats

    chain = Stats(generated_tokens=30, target_passes=10, drafted=40, accepted=20)
    tree = Stats(generated_tokens=30, target_passes=10, drafted=40, accepted=20, tree_passes=4, branches=11)
    assert "3.00 tokens/pass · time" in stats_lines(chain, "ngram")[1]
    assert "3.00 tokens/pass (4 tree passes, 11 branches) · time" in stats_lines(tree, "ngram")[1]


def test_stdin_prompt_and_stop_string(model_path: Path) -> None:
    result = localspec(["run", "-", "--max-tokens", "40", "--stop", "\n", "--json"], input=PARIS)
    assert result.code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert "Paris" in doc["text"] and "\n" not in doc["text"]
    assert doc["stats"]["stop_reason"] == "stop"


def test_streaming_never_splits_a_utf8_character(model_path: Path) -> None:
    prompt = "Traduis en japonais et en chinois : « Bonjour, café ! » 日本語:"
    result = localspec(["run", prompt, "--max-tokens", "40", "--drafter", "none", "--json"])
    doc = json.loads(result.stdout)
    assert any(ord(ch) > 127 for ch in doc["text"]), doc["text"]  # the test exercises multibyte output
    assert "\ufffd" not in doc["text"]
    for token in doc["tokens"]:
        assert "\ufffd" not in token["text"]


def test_seeded_sampling_is_reproducible(model_path: Path) -> None:
    # the promise as --help states it: the same command and seed, adaptive draft lengths included (a seeded request
    # prices them on the measured pass costs, not on live timings: tests/test_seed_real.py has the history on disk)
    args = ["run", "Once upon a time", "--max-tokens", "24", "--temperature", "0.9", "--seed", "7", "--json"]
    a, b = localspec(args), localspec(args)
    assert a.code == 0, a.stderr
    assert json.loads(a.stdout)["text"] == json.loads(b.stdout)["text"]
    # and the seed and the temperature are used: another seed samples another text (both dropped, the two agree)
    other = localspec([*args[:-2], "8", "--json"])
    assert other.code == 0 and json.loads(other.stdout)["text"] != json.loads(a.stdout)["text"], other.stdout


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--max-tokens", "0"], "--max-tokens"),
        (["--max-tokens", "-3"], "--max-tokens"),
        (["--temperature", "-1"], "--temperature"),
        (["--top-p", "0"], "--top-p"),
        (["--min-p", "1.5"], "--min-p"),
        (["--top-k", "-2"], "--top-k"),
        (["--drafter", "magic"], "unknown drafter"),
        (["--model", "no-such-model"], "gemma3-270m"),
        (["--model", "/nonexistent/model.gguf"], "not found"),
    ],
)
def test_bad_options_give_one_line_and_exit_2(args: list[str], fragment: str) -> None:
    assert_one_line_error(localspec(["run", "hello", *args]), fragment)


def test_a_file_that_is_not_gguf_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_text("this is not a model")
    assert_one_line_error(localspec(["run", "hello", "--model", str(fake)]), "not a GGUF")


def test_a_truncated_gguf_is_refused(tmp_path: Path, model_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    with model_path.open("rb") as src:
        cut.write_bytes(src.read(8_000_000))
    result = localspec(["run", "hello", "--model", str(cut)])
    assert_one_line_error(result)
    assert "truncated" in result.stderr or "incomplete" in result.stderr


def test_a_prompt_longer_than_the_context_is_refused(model_path: Path) -> None:
    result = localspec(["run", "word " * 600, "--ctx", "256"])
    assert_one_line_error(result, "--ctx")


def test_ctrl_c_keeps_the_text_prints_stats_and_exits_130(model_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "localspec", "run", "Write a very long story about the sea.", "--max-tokens", "4000",
         "--drafter", "none", "--ctx", "8192"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=interruptible,
    )
    assert proc.stdout is not None
    first = proc.stdout.read(20)  # wait until generation is visibly under way
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert len(first + out) >= 20
    assert b"tok/s" in err and b"interrupted" in err
    assert b"Traceback" not in err


def test_a_draft_model_with_another_tokenizer_is_refused(tmp_path: Path, model_path: Path) -> None:
    from localspec.engine.rewrite import copy_model

    other = tmp_path / "other-tokenizer.gguf"
    copy_model(model_path, other, int_overrides={"tokenizer.ggml.eos_token_id": 7})
    for command in (["run", "hello", "--drafter", "draft"], ["bench", "--drafters", "none,draft", "--repeat", "1"]):
        assert_one_line_error(localspec([*command, "--draft", str(other)]), "tokenizer", "EOS 1 vs 7")


def test_a_profile_sets_model_and_drafter_for_run_and_bench(tmp_path: Path, model_path: Path) -> None:
    run = localspec(["run", PARIS, "--profile", "default", "--max-tokens", "6", "--json"])
    assert run.code == 0, run.stderr
    assert json.loads(run.stdout)["drafter"] == "ngram"
    suite = tmp_path / "one.jsonl"
    suite.write_text(json.dumps({"id": "paris", "category": "qa", "prompt": PARIS, "max_tokens": 6}) + "\n")
    bench = localspec(["bench", "--profile", "gemma3-270m-early-exit", "--suite", str(suite), "--repeat", "1",
                       "--json"])
    assert bench.code == 0, bench.stderr
    drafters = {r["drafter"] for r in json.loads(bench.stdout)["results"]}
    assert drafters >= {"none", "early-exit"}
    assert_one_line_error(localspec(["run", "hi", "--profile", "nope"]), "nope")


def test_a_drafter_the_policy_keeps_off_is_named() -> None:
    # (whether early exit pays depends on this machine's timings, so the rule is tested on the stats it reads)
    from localspec.cli.run import switched_off
    from localspec.events import Stats

    off = Stats(generated_tokens=64, target_passes=64, drafted=3)
    assert "--drafter early-exit drafted 3 token(s) in 64 steps" in (switched_off("early-exit", None, off) or "")
    assert "decoded plainly" in (switched_off("draft", None, off) or "")
    assert switched_off("early-exit", 2, off) is None  # --k forces drafting: nothing was switched off
    assert switched_off("auto", None, off) is None  # auto decoding plainly is its normal answer
    assert switched_off("early-exit", None, Stats(generated_tokens=64, target_passes=40, drafted=60)) is None


def test_a_prediction_file_is_drafted_from_and_counted(tmp_path: Path, model_path: Path) -> None:
    prompt = "Copy this line: The meeting moved to Tuesday at 10:30 in room 4B.\nCopy:"
    plain = localspec(["run", prompt, "-n", "24", "--k", "4", "--json"])
    assert plain.code == 0, plain.stderr
    text = json.loads(plain.stdout)["text"]
    (tmp_path / "answer.txt").write_text(text)
    got = localspec(["run", prompt, "-n", "24", "--k", "4", "--json", "--prediction", str(tmp_path / "answer.txt")])
    assert got.code == 0, got.stderr
    stats = json.loads(got.stdout)["stats"]
    assert stats["accepted_prediction_tokens"] >= 20 and stats["prediction_accepted"] >= 12
    assert stats["prediction_drafted"] <= stats["drafted"]
    # from stdin, with the stats line that says it
    piped = localspec(["run", prompt, "-n", "24", "--k", "4", "--prediction", "-"], input=text)
    assert piped.code == 0 and "prediction: drafted" in piped.stderr, piped.stderr


@pytest.mark.parametrize(("args", "fragment"), [
    (["hello", "--prediction", "/nonexistent/file.py"], "cannot read --prediction"),
    (["-", "--prediction", "-"], "give --prediction a file"),
])
def test_a_prediction_that_cannot_be_read_is_one_line(args: list[str], fragment: str) -> None:
    assert_one_line_error(localspec(["run", *args, "--model", "/nonexistent/never-loaded.gguf"], input="x"),
                          fragment)


def test_a_prediction_under_a_schema_drafts_after_the_forced_tokens(tmp_path: Path, model_path: Path) -> None:
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps({"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}},
        "required": ["name", "age", "city"]}))
    args = ["run", "--chat", "Anna is 34 and lives in Paris. As JSON:", "--json-schema", str(schema), "--json",
            "-n", "60"]
    plain = localspec(args)
    assert plain.code == 0, plain.stderr
    text = json.loads(plain.stdout)["text"]
    (tmp_path / "answer.json").write_text(text)
    got = localspec([*args, "--prediction", str(tmp_path / "answer.json")])
    assert got.code == 0, got.stderr
    doc = json.loads(got.stdout)
    # the grammar's forced tokens and the prediction's drafts share the passes; the text is the same JSON
    assert json.loads(doc["text"]) == json.loads(text)
    stats = doc["stats"]
    assert stats["prediction_accepted"] > 0 and stats["forced_drafted"] > 0
    assert stats["rejected_prediction_tokens"] == 0  # all of it is the answer
