"""`localspec rpc-server`: llama.cpp's RPC server, from the same sources as this llama-cpp-python, on loopback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from localspec.cli import app, user_errors
from localspec.cli.serve import is_loopback
from localspec.errors import UserError
from localspec.settings import RPC_DEFAULT_PORT

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
    allow_remote: Annotated[bool, typer.Option(RISK_FLAG, help="Listen on a non-loopback --host although anyone "
                                               "who reaches the port can run code in this process (the RPC "
                                               "protocol has no authentication and a record of remote-code-"
                                               "execution bugs).")] = False,
) -> None:
    """Serve this machine's devices to another machine's localspec (--rpc HOST:PORT), as llama.cpp's RPC server.

    The protocol has no authentication or encryption, so it listens on 127.0.0.1: from another machine, reach it
    through an SSH tunnel, e.g. on the client: ssh -N -L 50052:127.0.0.1:50052 gpu-box, then --rpc 127.0.0.1:50052.

    Client and server must come from the same llama.cpp: run the same localspec on both machines.

    Examples:

      localspec rpc-server

      localspec rpc-server --port 50053 --threads 8
    """
    with user_errors():
        if not 0 < port < 65536:
            raise UserError(f"--port must be between 1 and 65535, got {port}")
        if threads is not None and threads < 1:
            raise UserError(f"--threads must be at least 1, got {threads}")
        if not is_loopback(host) and not allow_remote:
            raise UserError(f"--host {host} would let anyone who reaches this machine run code in it (RPC has no "
                            f"authentication): use an SSH tunnel instead, or pass {RISK_FLAG} if you accept that")
        binary = find_server()
        if not is_loopback(host):
            print(f"localspec: warning: the RPC server listens on {host} without authentication or encryption",
                  file=sys.stderr)
        cmd = [str(binary), "--host", host, "--port", str(port), "--threads", str(threads or os.cpu_count() or 1)]
        if device:
            cmd += ["--device", device]
    try:
        code = subprocess.call(cmd)
    except KeyboardInterrupt:
        code = 0
    raise typer.Exit(code)
