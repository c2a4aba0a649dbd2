"""Keep llama.cpp's RPC connections from hanging the client: llama.cpp waits on its sockets without any timeout.

Two ways a server can leave it waiting for good, each caught its own way, both ending in llama.cpp's abort (a
failed receive is RPC_STATUS_ASSERT), which engine/rpc.py turns into one line:

- **its machine or link goes away** (no reset ever arrives): the connections get TCP keepalive and a user timeout,
  and the kernel ends one that goes unanswered for about DEAD_AFTER seconds ($LOCALSPEC_RPC_DEAD_AFTER);
- **its process freezes** (stopped, deadlocked): its kernel still answers TCP, so the above never fires. A watchdog
  thread shuts the connection down once llama.cpp has waited SILENT_AFTER seconds ($LOCALSPEC_RPC_SILENT_AFTER) in
  ``recv`` on it with nothing sent or received meanwhile. llama.cpp only waits in ``recv`` while a reply is due
  (an idle connection's thread waits on its queue, not its socket), so an idle chat is never cut; one graph of a
  server's share must come back within the limit (a long prompt's batch on a slow machine: raise it).

Not a receive timeout (SO_RCVTIMEO): with one set, Linux does not restart ``recv`` after the process is stopped
and continued, so Ctrl-Z and ``fg`` would abort a generation (signal(7)). The watchdog reads what the kernel knows
instead: which thread waits in which system call (/proc/self/task/*/syscall), and when each connection last sent
or received data (TCP_INFO). Linux only; elsewhere there is no watch.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import platform
import socket
import struct
import termios
import threading
import time
from collections.abc import Iterable, Iterator

from localspec.endpoints import Endpoint
from localspec.errors import UserError

DEAD_AFTER = 30.0  # seconds a server may leave TCP unanswered before its connection counts as gone
SILENT_AFTER = 120.0  # seconds a server may take over a reply that is due before it counts as stopped
_RECVFROM = {"x86_64": 45, "aarch64": 207}.get(platform.machine())  # the syscall glibc's recv() makes
_LAST_DATA_SENT, _LAST_DATA_RECV = 44, 52  # ms since, in struct tcp_info (linux/tcp.h, stable since 2.6)

fired = 0.0  # the limit, once the watchdog has shut a silent server's connection down (the abort's line says so)


def limits() -> tuple[float, float]:
    """(DEAD_AFTER, SILENT_AFTER) as the environment sets them: checked before any model loads."""
    return _seconds("LOCALSPEC_RPC_DEAD_AFTER", DEAD_AFTER), _seconds("LOCALSPEC_RPC_SILENT_AFTER", SILENT_AFTER)


def _seconds(variable: str, default: float) -> float:
    try:
        value = float(os.environ.get(variable, default))
    except ValueError:
        value = -1.0
    if not 1.0 <= value <= 86400.0:  # the kernel counts whole seconds and milliseconds in 32 bits
        raise UserError(f"{variable} must be a number of seconds from 1 to 86400, like {default:g}")
    return value


def watch_connections(endpoints: Iterable[Endpoint]) -> int:
    """Watch llama.cpp's connections to ``endpoints`` (made when their layers loaded) both ways above; returns how
    many it found."""
    if not hasattr(socket, "TCP_USER_TIMEOUT"):
        return 0
    dead_after, silent_after = limits()
    peers = set()
    for endpoint in endpoints:
        with contextlib.suppress(OSError):
            peers |= {(info[4][0], endpoint.port) for info in socket.getaddrinfo(endpoint.host, endpoint.port)}
    found = {}
    for fd, inode, sock in _sockets():
        with sock:
            try:
                if sock.type != socket.SOCK_STREAM or sock.getpeername()[:2] not in peers:
                    continue
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, max(1, round(dead_after / 3)))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, max(1, round(dead_after / 6)))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, round(dead_after * 1000))
                found[fd] = inode
            except OSError:
                continue
    if found and _RECVFROM is not None:
        threading.Thread(target=_watch_silence, args=(found, silent_after), name="localspec-rpc-watch",
                         daemon=True).start()
    return len(found)


def _sockets(only: dict[int, str] | None = None) -> Iterator[tuple[int, str, socket.socket]]:
    """This process's sockets (``only``: those fds, still the same sockets) as (fd, inode, a duplicate to query)."""
    if socket.getdefaulttimeout() is not None:
        return  # a socket object made now would set O_NONBLOCK on llama.cpp's socket too: its recv would fail
    for name in os.listdir("/proc/self/fd") if only is None else map(str, only):
        try:
            inode = os.readlink(f"/proc/self/fd/{name}")
            if not inode.startswith("socket:") or (only is not None and only.get(int(name)) != inode):
                continue
            fd = os.dup(int(name))
        except OSError:
            continue  # closed meanwhile
        try:
            sock = socket.socket(fileno=fd)
        except OSError:
            os.close(fd)  # no longer a socket: the number was reused meanwhile
            continue
        yield int(name), inode, sock


def _waiting_in_recv() -> set[int]:
    """The fds some thread of this process is blocked receiving on now."""
    fds = set()
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/self/task/{tid}/syscall", encoding="ascii") as f:
                call = f.read().split()
            if int(call[0]) == _RECVFROM:
                fds.add(int(call[1], 16))
    return fds


def _silent_seconds(sock: socket.socket) -> float:
    """How long the connection has carried no data either way, and nothing waits unread: 0 if a reply is in."""
    unread = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    if struct.unpack("i", unread)[0] > 0:
        return 0.0
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    sent = struct.unpack_from("=I", info, _LAST_DATA_SENT)[0]
    received = struct.unpack_from("=I", info, _LAST_DATA_RECV)[0]
    return min(sent, received) / 1000.0


def _watch_silence(connections: dict[int, str], limit: float) -> None:
    """Until the connections close: shut down one whose reply llama.cpp has waited for ``limit`` seconds."""
    global fired
    period = min(1.0, limit / 4)
    last = time.monotonic()
    while True:
        time.sleep(period)
        now = time.monotonic()
        resumed = now - last > period + 1.0  # the process was stopped (Ctrl-Z): let llama.cpp read what came meanwhile
        last = now
        waiting = set() if resumed else _waiting_in_recv()
        alive = 0
        for fd, _, sock in _sockets(connections):
            alive += 1
            with sock, contextlib.suppress(OSError):
                if fd in waiting and _silent_seconds(sock) >= limit:
                    fired = limit  # first: llama.cpp aborts, in its own thread, as soon as the socket is shut
                    try:
                        sock.shutdown(socket.SHUT_RDWR)  # its recv returns: it aborts, and rpc.py says why
                    except OSError:
                        fired = 0.0
        if not alive:
            return
