"""RPC on one machine: llama.cpp's RPC servers on loopback, and a relay that adds network latency (this kernel has no
netem): an asyncio TCP proxy that holds every chunk ``delay`` seconds in each direction, in order."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from localspec.cli.rpc_server import find_server, wait_until_listening
from localspec.endpoints import Endpoint


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rpc_available() -> str | None:
    """Why RPC cannot be tested here (None: it can): this llama-cpp-python's build, and the server binary."""
    from localspec.engine.backend import ggml_lib

    if not ggml_lib().ggml_backend_reg_by_name(b"RPC"):
        return "this llama-cpp-python has no RPC backend (scripts/setup --rpc)"
    try:
        find_server()
    except Exception as e:
        return str(e)
    return None


@contextlib.contextmanager
def rpc_server(threads: int = 1) -> Iterator[tuple[Endpoint, subprocess.Popen[bytes]]]:
    port = free_port()
    proc = subprocess.Popen([str(find_server()), "--host", "127.0.0.1", "--port", str(port), "--threads",
                             str(threads)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = Endpoint("127.0.0.1", port)
    try:
        wait_until_listening(proc, endpoint)
        yield endpoint, proc
    finally:
        proc.kill()
        proc.wait(10)


@contextlib.contextmanager
def capped_rpc_server(mem: int) -> Iterator[Endpoint]:
    """`localspec rpc-server --mem MEM` (one thread), once the cap is on."""
    from tests.conftest import ROOT

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "localspec", "rpc-server", "--port", str(port), "--threads", "1",
                             "--mem", str(mem)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stderr is not None
        said = proc.stderr.readline()  # said once the cap is on
        assert f"may allocate {mem} MiB" in said, said
        yield Endpoint("127.0.0.1", port)
    finally:
        proc.terminate()
        proc.wait(10)


def netns_available() -> bool:
    """Whether a server can be put behind a link this test can cut: root, and ip netns."""
    return (hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("ip") is not None
            and subprocess.run(["ip", "netns", "list"], capture_output=True).returncode == 0)


@contextlib.contextmanager
def netns_rpc_server() -> Iterator[tuple[Endpoint, Callable[[], None]]]:
    """An RPC server in a network namespace of its own, reached over a veth pair; ``cut()`` takes the link down, so
    that packets vanish and no reset ever comes (a machine or a link that is gone; loopback cannot show it)."""
    tag = f"ls{os.getpid() % 100000}"
    ns, here, there = f"{tag}ns", f"{tag}a", f"{tag}b"
    net = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}"
    setup = [["ip", "netns", "add", ns], ["ip", "link", "add", here, "type", "veth", "peer", "name", there],
             ["ip", "link", "set", there, "netns", ns], ["ip", "addr", "add", f"{net}.1/30", "dev", here],
             ["ip", "link", "set", here, "up"], ["ip", "-n", ns, "addr", "add", f"{net}.2/30", "dev", there],
             ["ip", "-n", ns, "link", "set", there, "up"], ["ip", "-n", ns, "link", "set", "lo", "up"]]
    proc: subprocess.Popen[bytes] | None = None
    try:
        for cmd in setup:
            subprocess.run(cmd, check=True, capture_output=True)
        port = free_port()
        endpoint = Endpoint(f"{net}.2", port)
        proc = subprocess.Popen(["ip", "netns", "exec", ns, str(find_server()), "--host", endpoint.host, "--port",
                                 str(port), "--threads", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until_listening(proc, endpoint)
        yield endpoint, lambda: subprocess.run(["ip", "link", "set", here, "down"], check=True)
    finally:
        if proc is not None:
            proc.kill()
            proc.wait(10)
        subprocess.run(["ip", "link", "del", here], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


class DelayRelay:
    """127.0.0.1:``port`` → ``target``, every chunk held ``delay`` seconds each way (a one-way latency)."""

    def __init__(self, target: Endpoint, delay: float) -> None:
        self.target, self.delay = target, delay
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint("127.0.0.1", self.port)

    def __enter__(self) -> DelayRelay:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", self.port))
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.target.host, self.target.port)
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                dst.write(data)
                await dst.drain()
            dst.close()

        sender = asyncio.ensure_future(deliver())
        try:
            while data := await src.read(1 << 16):
                queue.put_nowait((time.monotonic() + self.delay, data))
        finally:
            queue.put_nowait((0.0, b""))
            await sender


def model_file() -> Path:
    from localspec.models.embedded import ensure_default_model

    return ensure_default_model(progress=False)


class KillingRelay:
    """127.0.0.1:``port`` → a real server (``proc`` at ``target``) until ``after`` bytes went to it; then the server
    is killed and the relay closes with it, its port too: a server killed while a client uploads, at the same
    point of the upload whatever the machine's speed."""

    def __init__(self, proc: subprocess.Popen[bytes], target: Endpoint, after: int) -> None:
        self.proc, self.target, self.after = proc, target, after
        self.sent = 0
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = Endpoint("127.0.0.1", self._listener.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self) -> KillingRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        self._kill()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection((self.target.host, self.target.port))
            with self._lock:
                self._open += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, counted: bool) -> None:
        try:
            while data := src.recv(1 << 16):
                if counted:
                    with self._lock:
                        self.sent += len(data)
                        due = self.sent >= self.after
                    if due:
                        self._kill()
                        return
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def _kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (Linux); the port closes
        self._listener.close()
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in recv on it, so that close closes
                sock.close()
