"""The runner: interleaving order, drafter validation, bad input at the CLI, and a tiny real benchmark."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from localspec.bench.runner import Job, parse_drafters, schedule
from localspec.cli import app
from localspec.errors import UserError
from tests.conftest import assert_one_line_error


def test_schedule_is_repeat_major_prompt_then_rotated_drafters() -> None:
    jobs = schedule(2, ["none", "ngram", "auto"], 3)
    assert len(jobs) == 2 * 3 * 3
    assert jobs[:6] == [Job(0, 0, "none"), Job(0, 0, "ngram"), Job(0, 0, "auto"),
                        Job(0, 1, "none"), Job(0, 1, "ngram"), Job(0, 1, "auto")]
    # the next repeat starts only when every (prompt, drafter) pair has run once, its drafter order rotated
    assert [j.drafter for j in jobs[6:9]] == ["ngram", "auto", "none"]
    assert [j.drafter for j in jobs[12:15]] == ["auto", "none", "ngram"]
    for r in range(3):
        block = jobs[6 * r : 6 * (r + 1)]
        assert {j.repeat for j in block} == {r}
        pairs = {(p, d) for p in (0, 1) for d in ("none", "ngram", "auto")}
        assert {(j.prompt_index, j.drafter) for j in block} == pairs
    # within a repeat, a prompt's drafters run back to back
    assert [j.prompt_index for j in jobs[:6]] == [0, 0, 0, 1, 1, 1]


def test_parse_drafters() -> None:
    assert parse_drafters("ngram, auto", draft_model=None, anchors=False) == ["none", "ngram", "auto"]
    assert parse_drafters("auto,none,auto", draft_model=None, anchors=True) == [
        "none", "auto", "anchor:create_completion", "anchor:prompt-lookup"]
    with pytest.raises(UserError, match="unknown drafter 'fast'"):
        parse_drafters("none,fast", draft_model=None, anchors=False)
    with pytest.raises(UserError, match="pass --draft"):
        parse_drafters("draft", draft_model=None, anchors=False)
    with pytest.raises(UserError, match="empty"):
        parse_drafters(" , ", draft_model=None, anchors=False)


def _suite(tmp_path: Path, text: str, name: str = "suite.jsonl") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--drafters", "none,warp"], "unknown drafter 'warp'"),
        (["--suite", "{missing}"], "suite file not found"),
        (["--suite", "{bad}"], "suite.jsonl:2: not valid JSON"),
        (["--suite", "{empty}"], "the suite is empty"),
        (["--repeat", "0"], "--repeat must be at least 1"),
        (["--drafters", "none,ngram:k"], "bad drafter variant 'ngram:k'"),
        (["--replay-costs", "{missing}"], "no cost table"),
        (["--replay-costs", "{bad}"], "cannot read cost table"),
        (["--out", "/proc/nope"], "cannot write the report to --out /proc/nope"),
        # a drafter's runs with the rows' predictions are added, never named
        (["--drafters", "none,ngram+prediction"], "give the drafter alone ('ngram')"),
        (["--suite", "edits", "--parallel", "2"], "--parallel runs no row with its prediction"),
        (["--suite", "{chat}", "--anchors"], "--anchors answer the raw prompt"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    good = '{"id": "a", "category": "c", "prompt": "x"}\n'
    paths = {"missing": str(tmp_path / "none.jsonl"), "bad": str(_suite(tmp_path, good + "{oops\n")),
             "empty": str(_suite(tmp_path, "\n", "empty.jsonl")),
             "chat": str(_suite(tmp_path, '{"id": "a", "category": "c", "prompt": "x", "chat": true}\n', "chat.jsonl"))}
    result = CliRunner().invoke(app, ["bench", *(a.format(**paths) for a in args)])
    assert_one_line_error(result.exit_code, result.stderr, message)


def test_tiny_real_bench_writes_the_json_schema_and_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.image

    suite = _suite(tmp_path, "\n".join(json.dumps(row) for row in [
        {"id": "copy", "category": "grounded", "max_tokens": 16,
         "prompt": "Copy exactly: the red fox jumps over the lazy dog.\nCopy: the red fox"},
        {"id": "ask", "category": "chat", "max_tokens": 16, "prompt": "Question: Why is the sky blue?\nAnswer:"},
    ]) + "\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["bench", "--suite", str(suite), "--drafters", "none,ngram,ngram:k3",
                                      "--repeat", "1", "--ctx", "512", "--json", "--out", str(out),
                                      "--replay-costs", "h100"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["model"] and set(doc["machine"]) == {"cpu", "threads", "device", "gpu_layers", "llama_cpp_version"}
    # the recorded command reproduces the run: every option given, the context size included
    # (paths relative to where it ran: a report never carries this machine's absolute paths)
    suite_arg, out_arg = os.path.relpath(suite), os.path.relpath(out)
    assert doc["command"] == (f"localspec bench --suite {suite_arg} --drafters none,ngram,ngram:k3 --repeat 1 "
                              f"--replay-costs h100 --out {out_arg} --ctx 512")
    drafters = ("none", "ngram", "ngram:k3")
    assert {(r["prompt_id"], r["drafter"]) for r in doc["results"]} == {
        (p, d) for p in ("copy", "ask") for d in drafters}
    # the same runs priced on the H100 table, with the oracle as a ceiling; marked as replayed
    replay = doc["replay"]
    assert replay["replayed_on"].startswith("NVIDIA H100") and doc["replayed_on"] is None
    assert {(r["prompt_id"], r["drafter"]) for r in replay["results"]} == {
        (p, d) for p in ("copy", "ask") for d in (*drafters, "oracle")}
    by = {(r["prompt_id"], r["drafter"]): r for r in replay["results"]}
    assert by[("copy", "none")]["speedup"] == 1.0
    assert by[("copy", "oracle")]["speedup"] >= by[("copy", "ngram:k3")]["speedup"] > 1.0
    assert "replayed on NVIDIA H100" in (out / "bench.md").read_text()
    assert doc["machine"]["device"].startswith("CPU")  # which device ran (this build has no GPU offload)
    for r in doc["results"]:
        assert r["tokens_per_second"] > 0 and r["speedup"] > 0
        assert isinstance(r["identical_to_baseline"], bool)
        # a divergence is allowed only as a classified near-tie (NOTES.md, "Numerics")
        assert all(d["near_tie"] is not None for d in r["divergences"])
        # token trees: counted for every drafted run (none here: one chain is the default), not for the baseline
        assert (r["tree_pass_share"] is None) == (r["drafter"] == "none")
        assert r["branches_per_tree_pass"] is None or r["branches_per_tree_pass"] >= 2
    assert {"median_tokens_per_pass", "median_tree_pass_share", "median_branches_per_tree_pass"} <= set(
        doc["groups"][0])
    assert set(doc["summary"]["ngram"]) == {"grounded", "chat"}
    assert set(doc["summary"]["ngram"]["chat"]) == {"median_speedup", "median_tokens_per_second"}
    assert json.loads((out / "bench.json").read_text())["results"] == doc["results"]
    assert "| grounded | ngram |" in (out / "bench.md").read_text()
    assert matplotlib.image.imread(out / "bench.png").ndim == 3


def test_a_bench_under_json_schemas_reports_forced_tokens_and_valid_answers(tmp_path: Path) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
              "age": {"type": "integer", "minimum": 0, "maximum": 130}}, "required": ["name", "age"],
              "additionalProperties": False}
    prompt = ('Extract the fields as JSON.\nText: Anna Schmidt is 34.\nJSON: {"name": "Anna Schmidt", "age": 34}\n'
              "Text: Marco Rossi is 51.\nJSON: ")
    suite = _suite(tmp_path, "\n".join(json.dumps(row) for row in [
        {"id": "whole", "category": "spaced", "max_tokens": 32, "prompt": prompt, "schema": schema},
        {"id": "cut", "category": "cut", "max_tokens": 3, "prompt": prompt, "schema": schema},  # cut off: invalid
    ]) + "\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["bench", "--suite", str(suite), "--drafters", "none,ngram", "--repeat", "1",
                                      "--ctx", "512", "--json", "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    by = {(g["category"], g["drafter"]): g for g in json.loads(result.stdout)["groups"]}
    assert (by[("spaced", "none")]["valid_runs"], by[("spaced", "none")]["checked_runs"]) == (1, 1)
    assert (by[("cut", "ngram")]["valid_runs"], by[("cut", "ngram")]["checked_runs"]) == (0, 1)
    spaced = by[("spaced", "ngram")]
    assert spaced["valid_runs"] == 1 and spaced["forced_accepted"] == spaced["forced_drafted"] > 0
    assert by[("spaced", "none")]["forced_drafted"] == 0  # target-only drafts nothing, forced tokens included
    table = (out / "bench.md").read_text()
    assert "| forced | valid |" in table
    assert f"| {spaced['forced_accepted']}/{spaced['forced_drafted']} | 1/1 |" in table


def test_a_row_with_a_prediction_runs_each_drafter_with_and_without_it(tmp_path: Path) -> None:
    prompt = "Copy this line: The meeting moved to Tuesday at 10:30 in room 4B.\nCopy:"
    suite = _suite(tmp_path, "\n".join(json.dumps(row) for row in [
        {"id": "edit", "category": "edit", "max_tokens": 24, "prompt": prompt, "chat": True,
         "prediction": " The meeting moved to Tuesday at 10:30 in room 4B."},
        {"id": "plain", "category": "plain", "max_tokens": 8, "prompt": prompt},
    ]) + "\n")
    result = CliRunner().invoke(app, ["bench", "--suite", str(suite), "--drafters", "none,ngram", "--repeat", "1",
                                      "--ctx", "512", "--json"])
    assert result.exit_code == 0, result.stderr
    runs = {(r["prompt_id"], r["drafter"]) for r in json.loads(result.stdout)["results"]}
    # a prediction's runs only where the row has one; target-only drafts nothing, a prediction included
    assert runs == {("edit", "none"), ("edit", "ngram"), ("edit", "ngram+prediction"), ("plain", "none"),
                    ("plain", "ngram")}


def test_bench_out_survives_a_chart_that_crashes_and_exits_0(tmp_path: Path, model_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # the chart is drawn in a child process, after bench.json and bench.md are written; here matplotlib's import
    # segfaults in that child (a stub first on its PYTHONPATH), as it did after llama.cpp's CUDA libraries on an H100
    stub = tmp_path / "stub" / "matplotlib"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("import ctypes\nctypes.string_at(0)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(stub.parent), os.environ.get("PYTHONPATH")])))
    suite = _suite(tmp_path, json.dumps({"id": "a", "category": "c", "max_tokens": 4, "prompt": "1, 2, 3,"}) + "\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["bench", "--suite", str(suite), "--drafters", "none", "--repeat", "1",
                                      "--model", str(model_path), "--ctx", "256", "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    assert json.loads((out / "bench.json").read_text())["results"] and (out / "bench.md").exists()
    assert not (out / "bench.png").exists()
    said = [line for line in result.stderr.splitlines() if "chart" in line]
    assert len(said) == 1 and "crashed (SIGSEGV)" in said[0] and "bench.json" in said[0], result.stderr


def _parallel_suite(tmp_path: Path, prompts: int) -> Path:
    return _suite(tmp_path, "\n".join(json.dumps({"id": f"p{i}", "category": "grounded", "max_tokens": 12,
                                                  "prompt": f"Repeat: red, green, blue, {i}. Again: red,"})
                                      for i in range(prompts)))


def test_bench_parallel_runs_the_suite_as_one_batch_beside_one_at_a_time(tmp_path: Path, model_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["bench", "--suite", str(_parallel_suite(tmp_path, 3)), "--drafters",
                                      "none,ngram,ngram:k3", "--parallel", "2", "--repeat", "1", "--model",
                                      str(model_path), "--ctx", "256", "--out", str(out)])
    assert result.exit_code == 0, result.output
    ways = ("one at a time, none", "batch, none", "one at a time, ngram", "batch, ngram",
            "one at a time, ngram:k3", "batch, ngram:k3")  # a pinned entry runs too, with its own k
    assert "Live on this machine, --parallel 2" in result.stdout
    for way in ways:
        assert result.stdout.count(f"| {way} |") == 1  # the live table only: nothing replayed unless asked
    assert "Replayed" not in result.stdout
    # --out: the same report as bench.json and bench.md, and no chart (a few ways, no categories)
    document = json.loads((out / "bench.json").read_text())
    assert document["parallel"] == 2 and document["repeat"] == 1 and "replay" not in document
    assert [w["way"] for w in document["ways"]] == list(ways)
    assert "--parallel 2" in document["command"] and document["machine"]["threads"] >= 1
    assert "Live on this machine, --parallel 2" in (out / "bench.md").read_text()
    assert not (out / "bench.png").exists() and "bench.json" in result.stderr


def test_bench_parallel_json_replays_on_the_table_asked_for(tmp_path: Path, model_path: Path) -> None:
    result = CliRunner().invoke(app, ["bench", "--suite", str(_parallel_suite(tmp_path, 2)), "--drafters",
                                      "none,ngram", "--parallel", "2", "--repeat", "1", "--model", str(model_path),
                                      "--ctx", "256", "--json", "--replay-costs", "h100"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)  # stdout is the JSON object alone
    assert [w["way"] for w in document["ways"]] == ["one at a time, none", "batch, none", "one at a time, ngram",
                                                    "batch, ngram"]
    assert document["ways"][0]["speedup"] == 1.0
    replay = document["replay"]
    assert "h100" in replay["replayed_on"] and len(replay["ways"]) == 4
    assert all(w["tokens_per_second"] > 0 for w in replay["ways"])
    # the tables, for a person, on stderr: live, and the one table asked for (no other shipped table)
    assert "Live on this machine" in result.stderr and result.stderr.count("Replayed on") == 1


@pytest.mark.parametrize(("args", "message"), [
    (["--drafters", "none,ngram:b4"], "no token trees: drop ngram:b4"),
    (["--anchors"], "leave --anchors out"),
])
def test_bench_parallel_refuses_what_a_batch_cannot_run_instead_of_dropping_it(
    tmp_path: Path, args: list[str], message: str
) -> None:
    suite = _suite(tmp_path, '{"id": "a", "category": "c", "prompt": "x"}\n')
    result = CliRunner().invoke(app, ["bench", "--suite", str(suite), "--parallel", "2", *args])
    assert_one_line_error(result.exit_code, result.stderr, message)


def test_bench_parallel_checks_its_value_before_loading_a_model(tmp_path: Path) -> None:
    suite = _suite(tmp_path, '{"id": "a", "category": "c", "prompt": "x"}\n')
    result = CliRunner().invoke(app, ["bench", "--suite", str(suite), "--parallel", "0"])
    assert_one_line_error(result.exit_code, result.stderr, "--parallel must be 'auto' or a number")
