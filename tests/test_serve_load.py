"""tools/serve_load.py: every server is started the same way (threads, parallel sequences, context per
sequence), and the comparison with llama-server is read off the right rows. No load is run here (minutes)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from tests.script_modules import load_script

pytest.importorskip("openai")  # the load test's client (the test extra)


sl = load_script("serve_load")


def _args(**over) -> argparse.Namespace:
    base = dict(threads=2, parallel=8, ctx=4096, llama_server=None, ngram_args="--spec-type ngram-mod")
    return argparse.Namespace(**{**base, **over})


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def _fake_binary(tmp_path: Path) -> str:
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    return str(binary)


def test_localspec_and_llama_server_get_the_same_threads_sequences_and_context_per_sequence(tmp_path):
    args = _args(llama_server=_fake_binary(tmp_path))
    ours = sl.command("localspec", 8001, args, "m.gguf")
    theirs = sl.command("llama-server", 8002, args, "m.gguf")
    assert _flag(ours, "--threads") == _flag(theirs, "--threads") == _flag(theirs, "--threads-batch") == "2"
    assert _flag(ours, "--parallel") == _flag(theirs, "--parallel") == "8"
    # localspec's --ctx is per sequence; llama-server's --ctx-size is split evenly between its slots
    assert int(_flag(theirs, "--ctx-size")) // int(_flag(theirs, "--parallel")) == int(_flag(ours, "--ctx")) == 4096
    assert _flag(theirs, "--model") == "m.gguf" and _flag(theirs, "--chat-template") == "gemma"
    assert "--spec-type" not in theirs
    assert sl.command("localspec-plain", 8001, args, "m.gguf") == ours + ["--drafter", "none"]  # the same, no drafts


def test_llama_server_runs_in_its_fastest_greedy_configuration_and_its_defaults_beside_it(tmp_path):
    args = _args(llama_server=_fake_binary(tmp_path))
    fast = sl.command("llama-server", 8002, args, "m.gguf")
    defaults = sl.command("llama-server-defaults", 8002, args, "m.gguf")
    assert fast == defaults + ["--backend-sampling", "--samplers", "top_k", "--top-k", "1"]
    ngram_defaults = sl.command("llama-server-ngram-defaults", 8002, args, "m.gguf")
    assert ngram_defaults == defaults + ["--spec-type", "ngram-mod"]


def test_llama_server_ngram_adds_only_its_speculation(tmp_path):
    ngram_args = "--spec-type ngram-simple --spec-ngram-simple-size-m 8"
    args = _args(llama_server=_fake_binary(tmp_path), ngram_args=ngram_args)
    plain = sl.command("llama-server", 8002, args, "m.gguf")
    ngram = sl.command("llama-server-ngram", 8002, args, "m.gguf")
    assert ngram == plain + ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", "8"]


def test_llama_cpp_python_servers_get_one_sequence_of_the_same_context():
    lookup = sl.command("llama-cpp-lookup", 8003, _args(), "m.gguf")
    assert _flag(lookup, "--n_ctx") == "4096" and _flag(lookup, "--n_threads") == "2"
    assert _flag(lookup, "--interrupt_requests") == "False"
    assert _flag(lookup, "--draft_model") == "prompt-lookup-decoding"


def test_a_missing_llama_server_or_an_unknown_server_is_a_note_not_a_crash(tmp_path):
    with pytest.raises(FileNotFoundError, match="scripts/setup --anchors"):
        sl.command("llama-server", 8002, _args(llama_server=str(tmp_path / "missing")), "m.gguf")
    with pytest.raises(ValueError, match="unknown server"):
        sl.command("vllm", 8002, _args(), "m.gguf")


def test_a_templated_job_and_localspec_without_its_history():
    emails = sl.prompts("template-emails")
    assert len(emails) >= 16 and emails != sl.prompts()
    ours = sl.command("localspec", 8001, _args(), "m.gguf")
    off = sl.command("localspec-no-history", 8001, _args(), "m.gguf")
    assert off == ["env", "LOCALSPEC_HISTORY=off", *ours]


def test_client_counts():
    assert sl.client_counts("1,8,32") == [1, 8, 32]
    for bad in ("", "0", "8,-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            sl.client_counts(bad)


def test_localspec_is_compared_with_llama_servers_best_configuration_per_client_count():
    def report(server, clients, tokens, wall, p95, note=""):
        return sl.Report(server, clients, 2 * clients, wall=wall, tokens=tokens, ttft_p95=p95, note=note)

    reports = [report("localspec", 8, 3000, 10.0, 1.0), report("llama-server", 8, 1500, 10.0, 1.5),
               report("llama-server-ngram", 8, 2000, 10.0, 2.0), report("llama-cpp-lookup", 8, 9000, 10.0, 9.0),
               report("localspec", 1, 500, 2.0, 0.1), report("llama-server-ngram", 1, 0, 0.0, None, note="not built")]
    lines = sl.against_llama_server(reports)
    # llama-cpp-python's server is not llama-server, and a server that did not run is no comparison
    assert lines == ["8 clients: localspec 1.50x llama-server-ngram (its best here), p95 TTFT 1.00 s vs 2.00 s"]


LLAMA_SERVER = Path(sys.executable).parent / "llama-server"


@pytest.mark.skipif(not LLAMA_SERVER.exists(), reason="llama-server not built here (scripts/setup --anchors)")
def test_the_built_llama_server_knows_every_flag_the_load_test_passes():
    helptext = subprocess.run([str(LLAMA_SERVER), "--help"], capture_output=True, text=True, timeout=60).stdout
    cmd = sl.command("llama-server-ngram", 8002, _args(llama_server=str(LLAMA_SERVER)), "m.gguf")
    assert "--backend-sampling" in cmd
    for flag in (c for c in cmd[1:] if c.startswith("--")):
        assert flag in helptext, flag


def test_localspec_at_a_folder_runs_that_folders_package(tmp_path):
    package = tmp_path / "localspec"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text("print('the other checkout')\n")
    server = f"localspec@{tmp_path}"
    cmd = sl.command(server, 8001, _args(), "m.gguf")
    assert cmd == sl.command("localspec", 8001, _args(), "m.gguf")  # started alike; only where it runs differs
    # the package it imports is DIR's, not this checkout's (nor the editable install's)
    done = subprocess.run([sys.executable, "-m", "localspec"], cwd=sl.workdir(server), capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.strip() == "the other checkout"
    assert sl.workdir("localspec") == sl.ROOT
    with pytest.raises(FileNotFoundError, match="holds no localspec package"):
        sl.command(f"localspec@{tmp_path / 'nothing'}", 8001, _args(), "m.gguf")


def _refused(monkeypatch, capsys, *argv: str) -> str:
    """serve_load's one-line refusal of ``argv`` (exit code 2)."""
    monkeypatch.setattr(sys, "argv", ["serve_load.py", *argv, "--servers", "localspec"])
    with pytest.raises(SystemExit) as exit_:
        sl.main()
    assert exit_.value.code == 2
    return capsys.readouterr().err


def test_warm_turns_go_with_a_templated_job(monkeypatch, capsys):
    assert "--warm-turns goes with --items" in _refused(monkeypatch, capsys, "--warm-turns", "1")


def test_tools_go_with_a_templated_job_and_are_the_tool_call_suites_own(monkeypatch, capsys):
    assert "--tools goes with --items" in _refused(monkeypatch, capsys, "--tools", "required")
    # the tools sent are those the suite's prompts describe, with the same parameters
    described = sl.prompts("tool-calls")[0].split("\n")[0]
    for tool in sl.TOOLS:
        function = tool["function"]
        assert function["name"] + "(" in described
        for param in function["parameters"]["properties"]:
            assert f"{param}: " in described.split(function["name"] + "(")[1].split(")")[0]
