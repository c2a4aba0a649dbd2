"""llama.cpp's RPC backend: the target's layers on `rpc-server`s over the network (issue #18).

llama-cpp-python's ``rpc_servers=`` has been ignored since 0.3.10 (the field left ``llama_model_params``); servers are
registered through ggml's backend registry instead: ``ggml_backend_reg_by_name("RPC")``, its proc address
``ggml_backend_rpc_add_server(endpoint)`` (which connects at once), ``ggml_backend_register``; the model then takes
the servers' devices in ``llama_model_params.devices``.

llama.cpp aborts the process when it cannot connect or the handshake fails (GGML_ABORT), so every endpoint is
checked here first, in Python, with the same HELLO the library sends: a server that is down, or speaks another
protocol version, is one line that names it, before llama.cpp sees it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import socket
import struct
from collections.abc import Iterator

from localspec.endpoints import CONNECT_TIMEOUT, Endpoint
from localspec.engine import rpc_watch
from localspec.engine.backend import ggml_lib
from localspec.errors import UserError

# this llama.cpp's protocol (ggml/include/ggml-rpc.h of the vendored source): major must match, minor not be newer
PROTO_MAJOR, PROTO_MINOR = 7, 0
_HELLO = 14  # RPC_CMD_HELLO, fixed across versions so that any two can say which they are
_CAPS = 24  # RPC_CONN_CAPS_SIZE: transport capabilities (RDMA); all zero: plain TCP


def hello(endpoint: Endpoint, timeout: float = CONNECT_TIMEOUT) -> tuple[int, int, int]:
    """The server's protocol version, asked as llama.cpp asks it; UserError if it cannot be asked."""
    try:
        return _ask_version(endpoint, timeout)
    except TimeoutError:
        raise UserError(f"the RPC server at {endpoint} did not answer within {timeout:g} s: is it running, and "
                        "reachable (an SSH tunnel, a firewall)?") from None
    except ConnectionError as e:
        raise UserError(f"cannot reach the RPC server at {endpoint} ({_why(e)}): start it there with "
                        f"`localspec rpc-server --port {endpoint.port}`") from None
    except OSError as e:
        raise UserError(f"cannot reach the RPC server at {endpoint} ({_why(e)})") from None


def _ask_version(endpoint: Endpoint, timeout: float) -> tuple[int, int, int]:
    with socket.create_connection((endpoint.host, endpoint.port), timeout=timeout) as sock:
        sock.sendall(struct.pack("<BQ", _HELLO, _CAPS) + bytes(_CAPS))
        head = _recv(sock, 8)
        (size,) = struct.unpack("<Q", head)
        if size < 3 or size > 4096:
            raise UserError(f"{endpoint} answered, but not as an RPC server of llama.cpp: is that the port?")
        major, minor, patch = _recv(sock, size)[:3]
        return major, minor, patch


def check(endpoints: list[Endpoint]) -> None:
    """Every server is up and speaks this llama.cpp's protocol, or a UserError that names the first that is not."""
    for endpoint in endpoints:
        major, minor, patch = hello(endpoint)
        if major != PROTO_MAJOR or minor > PROTO_MINOR:
            raise UserError(f"the RPC server at {endpoint} speaks protocol {major}.{minor}.{patch}, this llama.cpp "
                            f"{PROTO_MAJOR}.{PROTO_MINOR}: run the same localspec (and llama-cpp-python) on both "
                            "machines")


def devices(endpoints: list[Endpoint]) -> list[int]:
    """Register the servers with llama.cpp (checked first) and return their devices (``ggml_backend_dev_t``),
    in order, for ``llama_model_params.devices``."""
    check(endpoints)
    ggml = ggml_lib()
    reg = ggml.ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise UserError("this llama-cpp-python was built without RPC: run scripts/setup --rpc (it rebuilds it with "
                        "-DGGML_RPC=on)")
    address = ggml.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server")
    if not address:
        raise UserError("this llama.cpp's RPC backend has no ggml_backend_rpc_add_server: it is too old for localspec")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(address)
    _exit_in_one_line_on_abort(ggml, endpoints)
    out: list[int] = []
    for endpoint in endpoints:
        server = add_server(str(endpoint).encode())
        if not server:
            raise UserError(f"the RPC server at {endpoint} offers no device")
        ggml.ggml_backend_register(server)
        out += [ggml.ggml_backend_reg_dev_get(server, i) for i in range(ggml.ggml_backend_reg_dev_count(server))]
    return out


_ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
_on_abort: object = None  # the installed callback, kept alive for as long as llama.cpp may call it
_sending = ""  # what is on its way to the servers now ("" once the model is loaded: generating)


@contextlib.contextmanager
def sending(what: str) -> Iterator[None]:
    """While ``what`` (the target's layers) goes to the servers: a server that closes the connection now most
    likely had no room to receive a tensor (it holds a copy of each one in transit), not a crash."""
    global _sending
    _sending = what
    try:
        yield
    finally:
        _sending = ""


def _exit_in_one_line_on_abort(ggml: ctypes.CDLL, endpoints: list[Endpoint]) -> None:
    """A server that dies mid-generation makes llama.cpp abort (RPC_STATUS_ASSERT → GGML_ABORT) from its dispatcher
    thread: say so in one line and exit 1, instead of a backtrace and a core dump. There is nothing to recover: the
    layers that server held are gone."""
    global _on_abort
    names = ", ".join(map(str, endpoints))

    def on_abort(message: bytes | None) -> None:
        detail = (message or b"").decode("utf-8", "replace").strip().rsplit(": ", 1)[-1]
        gone = _gone(endpoints) if _sending else None
        if gone:
            line = (f"localspec: error: the RPC server at {gone} went away while {_sending} went to it: start it "
                    "again there (localspec rpc-server), then run again\n")
        elif _sending:
            line = (f"localspec: error: an RPC server ({names}) closed the connection while {_sending} went to it: "
                    "most likely it had no room to receive them (a tensor in transit takes room of its own); give "
                    "it a smaller share with --tensor-split, or start it with a larger --mem\n")
        else:
            if rpc_watch.fired:
                detail = (f"no reply came in {rpc_watch.fired:g} s (a server stopped answering: frozen, or busy "
                          "longer than LOCALSPEC_RPC_SILENT_AFTER allows)")
            line = (f"localspec: error: lost an RPC server ({names}): {detail or 'llama.cpp aborted'}; check that "
                    "every server still runs and can be reached, then run again\n")
        os.write(2, line.encode())
        os._exit(2 if _sending and not gone else 1)  # not a return: llama.cpp would abort() after it

    _on_abort = _ABORT_CALLBACK(on_abort)
    ggml.ggml_set_abort_callback(_on_abort)


def _gone(endpoints: list[Endpoint]) -> str | None:
    """The first server that no longer answers HELLO, with why; None if all do. A server with no room for a tensor
    hangs up on that client only and listens again; one that was killed, crashed or stopped does not answer."""
    for endpoint in endpoints:
        try:
            _ask_version(endpoint, CONNECT_TIMEOUT)
        except TimeoutError:
            return f"{endpoint} (no answer within {CONNECT_TIMEOUT:g} s)"
        except OSError as e:
            return f"{endpoint} ({_why(e)})"
        except UserError:
            pass  # something answers there: not gone
    return None


# ggml-alloc's line for a buffer a backend refused; an RPC server's buffer type is named RPC<device>[<endpoint>]
_REFUSED = re.compile(r"failed to allocate RPC\d+\[([^\]]+)\] buffer of size (\d+)")


def no_room(log: str, what: str, fix: str) -> UserError | None:
    """The RPC server that had no room for a buffer, as llama.cpp logged it (``log``): one line that names it and
    the size, ``what`` the buffer held, ``fix`` the way out; None if no server refused one."""
    refused = _REFUSED.findall(log)
    if not refused:
        return None
    endpoint, size = refused[-1]
    return UserError(f"the RPC server at {endpoint} has no room for {int(size) / 2**20:.0f} MiB of {what}: {fix}, "
                     "or free memory there (a larger --mem, if it runs under localspec rpc-server --mem)")


def local_devices() -> list[tuple[str, str]]:
    """This machine's devices as llama.cpp names them (CPU, CUDA0, …), with their descriptions: what
    `localspec rpc-server --device` may offer."""
    ggml = ggml_lib()
    found = [ggml.ggml_backend_dev_get(i) for i in range(ggml.ggml_backend_dev_count())]
    return [((ggml.ggml_backend_dev_name(d) or b"?").decode(), (ggml.ggml_backend_dev_description(d) or b"?").decode())
            for d in found]


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        piece = sock.recv(n - len(data))
        if not piece:
            raise ConnectionResetError("the connection closed")
        data += piece
    return data


def _why(e: OSError) -> str:
    return (e.strerror or str(e) or type(e).__name__).lower()
