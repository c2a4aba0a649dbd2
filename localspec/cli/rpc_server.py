"""`localspec rpc-server`: llama.cpp's RPC server, from the same sources as this llama-cpp-python, on loopback."""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from localspec.cli import app, user_errors
from localspec.cli.serve import is_loopback
from localspec.endpoints import RPC_DEFAULT_PORT, Endpoint
from localspec.errors import UserError

BINARY = "ggml-rpc-server"
RISK_FLAG = "--allow-unauthenticated-remote"


def find_server() -> Path:
    """The server binary scripts/setup --rpc built (beside this Python), or one on PATH, or $LOCALSPEC_RPC_SERVER."""
    given = os.environ.get("LOCALSPEC_RPC_SERVER")
    candidates = [Path(given)] if given else []
    candidates.append(Path(sys.prefix) / "bin" / BINARY)
    found = shutil.which(BINARY)
    if found:
        candidates.append(Path(found))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise UserError(f"no {BINARY} here: run scripts/setup --rpc (it builds llama-cpp-python with RPC and the "
                    "server from the same sources), or set LOCALSPEC_RPC_SERVER to one built from them")


@app.command("rpc-server")
def rpc_server(
    host: Annotated[str, typer.Option("--host", help=f"Address to listen on. Anything but loopback needs "
                                      f"{RISK_FLAG}: the protocol has no authentication.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = RPC_DEFAULT_PORT,
    threads: Annotated[int | None, typer.Option("--threads", help="CPU threads for its CPU device (default: all "
                                                "cores).")] = None,
    device: Annotated[str | None, typer.Option("--device", help="Its devices to offer, comma-separated (default: "
                                               "all; see llama.cpp's ggml-rpc-server --help).")] = None,
    mem: Annotated[int | None, typer.Option("--mem", metavar="MB", help="Most memory (MiB) it may allocate for "
                                            "clients: layers, KV cache, compute buffers, and a copy of each tensor "
                                            "while it arrives. A client whose share does not fit gets one line "
                                            "naming this server. Linux; CPU memory only (a GPU's own memory is its "
                                            "limit). Default: no limit.")] = None,
    allow_remote: Annotated[bool, typer.Option(RISK_FLAG, help="Listen on a non-loopback --host although anyone "
                                               "who reaches the port can run code in this process (the RPC "
                                               "protocol has no authentication and a record of remote-code-"
                                               "execution bugs).")] = False,
) -> None:
    """Serve this machine's devices to another machine's localspec (--rpc HOST:PORT), as llama.cpp's RPC server.

    The protocol has no authentication or encryption, so it listens on
    127.0.0.1: from another machine, reach it through an SSH tunnel, e.g. on the
    client: ssh -N -L 50052:127.0.0.1:50052 gpu-box, then --rpc 127.0.0.1:50052.

    Client and server must come from the same llama.cpp: run the same localspec on both machines.

    Examples:

      localspec rpc-server

      localspec rpc-server --port 50053 --threads 8

      localspec rpc-server --mem 4096
    """
    with user_errors():
        if not 0 < port < 65536:
            raise UserError(f"--port must be between 1 and 65535, got {port}")
        if threads is not None and threads < 1:
            raise UserError(f"--threads must be at least 1, got {threads}")
        if mem is not None and mem < 1:
            raise UserError(f"--mem takes MiB, at least 1, got {mem}")
        if mem is not None and not sys.platform.startswith("linux"):
            raise UserError("--mem needs Linux (it caps the server with RLIMIT_DATA): leave it out here")
        if not is_loopback(host) and not allow_remote:
            raise UserError(f"--host {host} would let anyone who reaches this machine run code in it (RPC has no "
                            f"authentication): use an SSH tunnel instead, or pass {RISK_FLAG} if you accept that")
        check_can_listen(host, port)
        if device is not None:
            check_devices(device)
        binary = find_server()
        if not is_loopback(host):
            print(f"localspec: warning: the RPC server listens on {host} without authentication or encryption",
                  file=sys.stderr)
        n_threads = threads or os.cpu_count() or 1
        cmd = [str(binary), "--host", host, "--port", str(port), "--threads", str(n_threads)]
        if device:
            cmd += ["--device", device]
    proc = subprocess.Popen(cmd)
    # stopped by SIGTERM (a service manager, kill): stop the server too, as Ctrl-C does, instead of orphaning it
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        if mem is not None:
            with user_errors():
                # a wildcard address listens on loopback too; a given one is asked where it listens
                probe = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host.strip("[]")
                cap_memory(proc, Endpoint(probe, port), mem, n_threads)
            print(f"localspec: the RPC server may allocate {mem} MiB for clients", file=sys.stderr)
        code = proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait()
        raise typer.Exit(0) from None
    except BaseException:
        proc.kill()
        raise
    if code == 0:
        # it never returns while it serves: an exit of its own is a failure it reported with 0 (its line above,
        # e.g. "Failed to create server socket": the port was taken after the check), and a supervisor must see it
        with user_errors():
            raise UserError(f"{BINARY} stopped by itself without serving on {host}:{port} (its reason is above)")
    raise typer.Exit(code)


def check_can_listen(host: str, port: int) -> None:
    """Bind ``host:port`` as llama.cpp's server will (IPv4, SO_REUSEADDR) and let go: where that fails, the server
    would print "Failed to create server socket" and exit 0, which a script or a supervisor takes for running."""
    try:
        socket.inet_aton(host)  # llama.cpp reads --host with inet_addr: an IPv4 address, no name
    except OSError:
        raise UserError(f"--host takes an IPv4 address such as 127.0.0.1 (llama.cpp's RPC server listens on IPv4 "
                        f"only), got {host!r}") from None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as llama.cpp: a port in TIME_WAIT is free
        try:
            sock.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise UserError(f"port {port} on {host} is taken (another rpc-server?): stop what listens there, or "
                                "pick another --port") from None
            if e.errno == errno.EADDRNOTAVAIL:
                raise UserError(f"--host {host} is not an address of this machine: give one of its own") from None
            if e.errno == errno.EACCES:
                raise UserError(f"port {port} needs privileges here (below 1024): pick another --port") from None
            raise UserError(f"cannot listen on {host}:{port} ({(e.strerror or str(e)).lower()})") from None


def check_devices(spec: str) -> None:
    """Every name in ``--device`` is a device of this machine (llama.cpp's server would print its raw list and exit
    1), or one line that names those it has. The server is built from the same llama.cpp, so it has the same."""
    from localspec.engine.rpc import local_devices

    here = local_devices()
    names = {name.lower() for name, _ in here}  # ggml_backend_dev_by_name ignores case
    for wanted in re.split(r"[,/]+", spec):  # how ggml-rpc-server splits the list
        if wanted.lower() not in names:
            offered = ", ".join(f"{name} ({about})" for name, about in here)
            raise UserError(f"--device {wanted!r} is not a device of this machine; it has: {offered}")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def cap_memory(proc: subprocess.Popen[bytes], endpoint: Endpoint, mib: int, threads: int) -> None:
    """Let the server allocate at most ``mib`` MiB beyond what it holds once it listens (Linux's RLIMIT_DATA, its
    private writable memory), plus the stacks its compute threads will take. ggml-rpc-server lost its own --mem;
    a buffer it cannot allocate is answered as 'no room', which the client's localspec reports by endpoint."""
    import resource

    wait_until_listening(proc, endpoint)
    idle = _vm_data(proc.pid)
    stack = resource.getrlimit(resource.RLIMIT_STACK)[0]
    stack = 8 << 20 if stack in (resource.RLIM_INFINITY, -1) or stack <= 0 else stack
    limit = idle + (mib << 20) + (threads + 2) * stack
    resource.prlimit(proc.pid, resource.RLIMIT_DATA, (limit, limit))


def wait_until_listening(proc: subprocess.Popen[bytes], endpoint: Endpoint, timeout: float = 30.0) -> None:
    from localspec.engine.rpc import hello

    deadline = time.monotonic() + timeout
    while True:
        try:
            hello(endpoint, timeout=1)
            return
        except UserError:
            if proc.poll() is not None:
                raise UserError(f"{BINARY} exited ({proc.returncode}) before it listened on {endpoint}: is the "
                                "port taken?") from None
            if time.monotonic() > deadline:
                raise UserError(f"{BINARY} did not listen on {endpoint} within {timeout:g} s") from None
            time.sleep(0.1)


def _vm_data(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmData:"):
            return int(line.split()[1]) * 1024
    raise UserError(f"cannot read the RPC server's memory (/proc/{pid}/status): leave --mem out")
