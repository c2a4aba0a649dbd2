"""The target on llama.cpp's RPC servers (issue #18), on one machine: real servers on loopback, a relay for latency,
and the checks that keep llama.cpp from aborting the process on a server it cannot use."""

from __future__ import annotations

import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from localspec.cli import app
from localspec.endpoints import Endpoint, parse_endpoints
from localspec.engine import Model
from localspec.engine.rpc import check
from localspec.errors import UserError
from localspec.events import Step
from localspec.runtime import Runtime
from localspec.settings import GenerationSettings, RuntimeSettings, Settings, SpeculationSettings
from tests.conftest import assert_one_line_error, interruptible
from tests.lossless import assert_lossless, margin
from tests.rpc_helpers import (
    DelayRelay,
    KillingRelay,
    capped_rpc_server,
    free_port,
    netns_available,
    netns_rpc_server,
    rpc_available,
    rpc_server,
)

runner = CliRunner()


@pytest.mark.parametrize("spec", ["localhost", "host:", ":50052", "a:b", "127.0.0.1:70000", "a:1,a:1"])
def test_a_bad_endpoint_is_a_one_line_error(spec: str) -> None:
    with pytest.raises(UserError, match="--rpc"):
        parse_endpoints(spec)


def test_endpoints_parse() -> None:
    assert parse_endpoints("10.0.0.2:50052, 10.0.0.3:50053") == [Endpoint("10.0.0.2", 50052),
                                                                 Endpoint("10.0.0.3", 50053)]


def test_an_unreachable_server_is_one_line_before_any_model_loads() -> None:
    port = free_port()  # nothing listens there
    result = runner.invoke(app, ["run", "hello", "--rpc", f"127.0.0.1:{port}", "-n", "2"])
    assert_one_line_error(result.exit_code, result.output, f"127.0.0.1:{port}", "cannot reach")


@pytest.fixture
def old_server() -> Iterator[Endpoint]:
    """Something that answers llama.cpp's HELLO with another protocol version (6.1.0)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()

    def serve() -> None:
        conn, _ = sock.accept()
        with conn:
            conn.recv(1 + 8 + 24)
            conn.sendall(struct.pack("<Q", 28) + bytes([6, 1, 0, 0]) + bytes(24))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield Endpoint("127.0.0.1", sock.getsockname()[1])
    sock.close()


def test_a_server_of_another_version_is_named_with_both_versions(old_server: Endpoint) -> None:
    with pytest.raises(UserError) as e:
        check([old_server])
    assert str(old_server) in str(e.value) and "6.1.0" in str(e.value) and "7.0" in str(e.value)


def test_the_rpc_server_listens_on_loopback_unless_the_risk_is_named() -> None:
    result = runner.invoke(app, ["rpc-server", "--host", "0.0.0.0"])
    assert_one_line_error(result.exit_code, result.output, "--allow-unauthenticated-remote", "SSH tunnel")
    result = runner.invoke(app, ["rpc-server", "--port", "0"])
    assert_one_line_error(result.exit_code, result.output, "--port")


def test_an_empty_rpc_is_refused_not_run_here() -> None:
    # an unset variable in a script (--rpc "$SERVERS") must not quietly put the model on this machine
    for command in ("run", "bench"):
        result = runner.invoke(app, [command, "hello", "--rpc", ""] if command == "run" else [command, "--rpc", ""])
        assert_one_line_error(result.exit_code, result.output, "--rpc is empty", "leave --rpc out")
    result = runner.invoke(app, ["run", "hello", "--rpc", "127.0.0.1:1,"])
    assert_one_line_error(result.exit_code, result.output, "--rpc takes HOST:PORT")


def test_rpc_server_on_a_taken_port_is_one_line_and_exit_2() -> None:
    # llama.cpp's server says "Failed to create server socket" and exits 0: a supervisor would think it runs
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = runner.invoke(app, ["rpc-server", "--port", str(port)])
    assert_one_line_error(result.exit_code, result.output, f"port {port}", "taken", "--port")


def test_rpc_server_host_must_be_an_ipv4_address_of_this_machine() -> None:
    result = runner.invoke(app, ["rpc-server", "--host", "localhost"])
    assert_one_line_error(result.exit_code, result.output, "IPv4", "127.0.0.1")
    result = runner.invoke(app, ["rpc-server", "--host", "10.255.255.1", "--allow-unauthenticated-remote"])
    assert_one_line_error(result.exit_code, result.output, "not an address of this machine")


def test_rpc_server_with_an_unknown_device_names_the_devices_here() -> None:
    result = runner.invoke(app, ["rpc-server", "--port", str(free_port()), "--device", "CPU,nosuchdev"])
    assert_one_line_error(result.exit_code, result.output, "'nosuchdev'", "CPU (")


def test_tensor_split_needs_one_share_per_server() -> None:
    result = runner.invoke(app, ["run", "x", "--rpc", "127.0.0.1:1,127.0.0.1:2", "--tensor-split", "1"])
    assert_one_line_error(result.exit_code, result.output, "--tensor-split")


# -- with the RPC build and its server (scripts/setup --rpc; scripts/test sets it up) --

needs_rpc = pytest.mark.skipif(rpc_available() is not None, reason=str(rpc_available()))


@pytest.fixture(scope="module")
def servers() -> Iterator[list[Endpoint]]:
    with rpc_server() as (a, _), rpc_server() as (b, _):
        yield [a, b]


def _greedy(rt: Runtime, prompt: str, n: int) -> list[int]:
    rt.fresh(clear_cache=True)
    return [t.id for e in rt.generate(rt.prompt_tokens(prompt), GenerationSettings(max_tokens=n))
            if isinstance(e, Step) for t in e.emitted]


PROMPTS = ["Here is a list: apples, pears, plums, cherries, grapes.\nRepeat the list exactly:\n",
           "Q: What is the capital of Italy?\nA:"]


@needs_rpc
def test_greedy_text_over_two_rpc_servers_is_lossless(
    servers: list[Endpoint], model_path: Path
) -> None:
    spec = SpeculationSettings(drafter="none", k=4)  # fixed: no calibration over the servers' random ports
    # the check scores each text on a local copy of the model, at every position
    with Model(model_path) as local, Runtime.open(Settings(str(model_path), RuntimeSettings(
            n_ctx=512, rpc=tuple(map(str, servers)), tensor_split=(1.0, 1.0)), spec)) as remote:
        assert remote.device.description.startswith("RPC ") and str(servers[1]) in remote.device.description
        for drafter in ("none", "ngram"):
            remote.set_drafter(drafter)
            for prompt in PROMPTS:
                assert_lossless(local, remote.prompt_tokens(prompt), _greedy(remote, prompt, 24), margin(local),
                                label=f"{drafter} over RPC")


@needs_rpc
def test_a_relay_adds_latency_and_generation_still_works(servers: list[Endpoint], model_path: Path) -> None:
    with DelayRelay(servers[0], 0.002) as relay:
        settings = Settings(str(model_path), RuntimeSettings(n_ctx=256, rpc=(str(relay.endpoint),)),
                            SpeculationSettings(drafter="none", k=None))
        with Runtime.open(settings) as rt:
            assert len(_greedy(rt, PROMPTS[1], 4)) == 4


def _run_while(endpoint: Endpoint, model_path: Path, n: int, meanwhile: Callable[[subprocess.Popen[bytes]], None],
               **env: str) -> tuple[int, bytes, bytes]:
    """`localspec run` over ``endpoint`` in a process of its own (llama.cpp may abort it), ``meanwhile`` called with
    it once it generates: its exit code, stdout and stderr."""
    import os

    from tests.conftest import ROOT

    proc = subprocess.Popen(
        [sys.executable, "-m", "localspec", "run", "--rpc", str(endpoint), "--ctx", "4096", "-n", str(n),
         "--drafter", "none", "--model", str(model_path), "Count from one to a thousand in words:"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=interruptible,
        env={**os.environ, "PYTHONIOENCODING": "utf-8", **env})
    try:
        assert proc.stdout is not None
        first = proc.stdout.read(1)
        assert first  # generating
        meanwhile(proc)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, first + out, err


def _lose_it_mid_generation(endpoint: Endpoint, model_path: Path, lose: Callable[[], None],
                            **env: str) -> list[str]:
    """``lose`` the server while a long generation runs: the lines the client wrote to stderr, after checking it
    ended in one line and exit 1, not a hang."""
    code, _, err = _run_while(endpoint, model_path, 3000, lambda _: lose(), **env)
    text = err.decode("utf-8", "replace")
    lines = [line for line in text.splitlines() if line.strip()]
    assert code == 1, text
    assert lines[-1].startswith("localspec: error: lost an RPC server") and str(endpoint) in lines[-1]
    assert "Traceback" not in text and "backtrace" not in text.lower()
    return lines


@needs_rpc
def test_a_server_that_dies_mid_generation_is_one_line_and_an_exit_not_a_hang(model_path: Path) -> None:
    with rpc_server() as (endpoint, server):
        _lose_it_mid_generation(endpoint, model_path, server.kill)


@needs_rpc
def test_a_server_that_freezes_mid_generation_is_one_line_not_a_hang(model_path: Path) -> None:
    # a stopped process's kernel still answers TCP: only the silence watchdog ends the wait for its reply
    with rpc_server() as (endpoint, server):
        try:
            lines = _lose_it_mid_generation(endpoint, model_path, lambda: server.send_signal(signal.SIGSTOP),
                                            LOCALSPEC_RPC_SILENT_AFTER="3")
        finally:
            server.send_signal(signal.SIGCONT)
    assert "no reply came" in lines[-1]


@pytest.mark.parametrize("value", ["soon", "0", "inf", "1e30"])
def test_a_bad_silence_limit_is_one_line_before_any_server_is_asked(
    model_path: Path, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCALSPEC_RPC_SILENT_AFTER", value)
    result = runner.invoke(app, ["run", "hello", "--model", str(model_path), "--rpc", f"127.0.0.1:{free_port()}",
                                 "--drafter", "none", "-n", "2"])
    assert_one_line_error(result.exit_code, result.output, "LOCALSPEC_RPC_SILENT_AFTER", "seconds")


@needs_rpc
def test_ctrl_z_and_fg_mid_generation_over_rpc_do_not_end_it(model_path: Path) -> None:
    # stopped longer than the silence limit: the time the client itself was stopped is not the server's silence
    # (and with a receive timeout on the socket, Linux would not even restart llama.cpp's recv after SIGCONT)
    import time

    def stop_and_continue(proc: subprocess.Popen[bytes]) -> None:
        for _ in range(4):  # most of a pass, the client waits on the server: some stop lands in that wait
            time.sleep(0.2)
            proc.send_signal(signal.SIGSTOP)
            time.sleep(1.5)
            proc.send_signal(signal.SIGCONT)
        time.sleep(1.5)  # past the silence limit once more, running: a watchdog that miscounted has fired by now
        assert proc.poll() is None, "the run ended while it was stopped and continued"
        proc.send_signal(signal.SIGINT)  # the rest of a long generation would add nothing (and take a while)

    with rpc_server() as (endpoint, _):
        code, out, err = _run_while(endpoint, model_path, 3000, stop_and_continue, LOCALSPEC_RPC_SILENT_AFTER="1")
    assert code == 130, err.decode("utf-8", "replace")  # interrupted by the test, not ended by a lost server
    assert b"interrupted" in err and b"Traceback" not in err
    assert len(out) > 20


def test_rpc_server_mem_takes_mib() -> None:
    result = runner.invoke(app, ["rpc-server", "--mem", "0"])
    assert_one_line_error(result.exit_code, result.output, "--mem")


@needs_rpc
def test_a_server_without_room_for_its_layers_is_one_line_that_names_it(model_path: Path) -> None:
    with capped_rpc_server(mem=50) as endpoint:  # the embedded target's layers take 235 MiB
        result = runner.invoke(app, ["run", "hello", "--model", str(model_path), "--rpc", str(endpoint),
                                     "--drafter", "none", "-n", "2"])
    assert_one_line_error(result.exit_code, result.output, str(endpoint), "no room", "layers", "--tensor-split")


def _run_over(endpoint: Endpoint, model_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`localspec run` in a process of its own: a server that hangs up makes llama.cpp abort it (one line, exit)."""
    from tests.conftest import ROOT

    return subprocess.run([sys.executable, "-m", "localspec", "run", "--rpc", str(endpoint), "--drafter", "none",
                           "-n", "2", "--model", str(model_path), *args, "hello"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


@needs_rpc
def test_a_server_without_room_for_the_context_is_one_line_that_says_ctx(model_path: Path) -> None:
    with capped_rpc_server(mem=500) as endpoint:
        done = _run_over(endpoint, model_path)
        assert done.returncode == 0, done.stderr  # the layers, their tensors in transit and 4096 tokens fit
        done = _run_over(endpoint, model_path, "--ctx", "32768")
    assert_one_line_error(done.returncode, done.stderr, str(endpoint), "no room", "--ctx")


@needs_rpc
def test_a_server_that_cannot_receive_the_layers_is_one_line_not_a_lost_server(model_path: Path) -> None:
    # room for the layers (235 MiB), not for them and the 170 MiB embedding in transit: the server hangs up, and
    # llama.cpp aborts the client
    with capped_rpc_server(mem=300) as endpoint:
        done = _run_over(endpoint, model_path)
    assert_one_line_error(done.returncode, done.stderr, str(endpoint), "no room to receive", "--mem")


@needs_rpc
def test_a_server_killed_while_the_layers_upload_is_named_as_gone_not_short_of_room(model_path: Path) -> None:
    # killed when 16 of the layers' 235 MiB went over: it answers no more, so "no room ... --mem" would mislead
    with rpc_server() as (endpoint, server), KillingRelay(server, endpoint, after=16 << 20) as relay:
        done = _run_over(relay.endpoint, model_path)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"localspec: error: the RPC server at {relay.endpoint} (connection refused) went "
                               "away while"), lines[0]
    assert "--mem" not in lines[0] and "Traceback" not in done.stderr


@needs_rpc
@pytest.mark.skipif(not netns_available(), reason="needs root and ip netns to cut a link")
def test_a_server_whose_link_goes_dead_mid_generation_is_one_line_not_a_hang(model_path: Path) -> None:
    # no reset ever comes from a machine that is gone: only the connections' keepalive and user timeout end the wait
    with netns_rpc_server() as (endpoint, cut):
        _lose_it_mid_generation(endpoint, model_path, cut, LOCALSPEC_RPC_DEAD_AFTER="4")
