"""Where llama.cpp's RPC servers are: ``HOST:PORT`` endpoints, parsed and checked without loading llama.cpp.

A ground-floor module: the settings check ``--rpc`` with it, the engine connects to what it returns, and the
`rpc-server` command listens on its default port; none of them needs another for that.
"""

from __future__ import annotations

from dataclasses import dataclass

from localspec.errors import UserError

RPC_DEFAULT_PORT = 50052  # llama.cpp's rpc-server default
CONNECT_TIMEOUT = 5.0  # seconds a server may take to accept a connection and answer HELLO


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_endpoints(spec: str | list[str]) -> list[Endpoint]:
    """``HOST:PORT[,HOST:PORT…]`` (or a list of them) → endpoints; a one-line UserError for anything else."""
    parts = spec if isinstance(spec, list) else spec.split(",")
    out: list[Endpoint] = []
    for part in (p.strip() for p in parts):
        if not part and len(parts) == 1:
            # `--rpc ""` (an unset variable in a script, say) must not quietly run everything here
            raise UserError(f"--rpc is empty: give HOST:PORT (e.g. 127.0.0.1:{RPC_DEFAULT_PORT}), or leave --rpc "
                            "out to run the model on this machine")
        host, sep, port = part.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UserError(f"--rpc takes HOST:PORT[,HOST:PORT...], got {part!r} (e.g. 127.0.0.1:{RPC_DEFAULT_PORT})")
        out.append(Endpoint(host.strip("[]"), int(port)))
    if len(set(out)) != len(out):
        raise UserError(f"--rpc names a server twice: {spec}")
    return out
