"""`localspec serve`: the OpenAI API on the batch scheduler, bound to loopback unless told otherwise."""

from __future__ import annotations

import gc
import ipaddress
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer

from localspec.cli import app, user_errors
from localspec.cli.batch import parse_parallel
from localspec.cli.options import generation_options
from localspec.errors import UserError
from localspec.settings import Settings

if TYPE_CHECKING:
    from localspec.serve.app import Limits

API_KEY_ENV = "LOCALSPEC_API_KEY"
LOOPBACK_NAMES = {"localhost"}


@app.command()
@generation_options("serve", hide=("p_min",))
def serve(
    host: Annotated[str, typer.Option("--host", help="Address to listen on. Anything but loopback needs --api-key "
                                      "(or --insecure).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on (0: any free one; the address is "
                                      "printed).")] = 8000,
    api_key: Annotated[str | None, typer.Option("--api-key", metavar="KEY", help=f"Require 'Authorization: "
                                                f"Bearer KEY' on /v1 and /metrics. Default: ${API_KEY_ENV}.",
                                                show_default=False)] = None,
    parallel: Annotated[str, typer.Option("--parallel", help="Requests decoded together: 'auto' (as many as pay "
                                          "on this device's pass costs, at most 8) or a number.")] = "auto",
    queue_timeout: Annotated[float, typer.Option("--queue-timeout", metavar="SECONDS", help="How long a request "
                                                 "may wait for a free sequence before it gets 503.")] = 60.0,
    request_timeout: Annotated[float, typer.Option("--request-timeout", metavar="SECONDS", help="How long one "
                                                   "request may generate; then it ends as if its max_tokens were "
                                                   "reached (finish_reason 'length'). 0: no limit.")] = 600.0,
    max_queue: Annotated[int | None, typer.Option("--max-queue", metavar="N", help="Requests that may wait at once "
                                                  "(being checked, or for a free sequence); past it a request gets "
                                                  "503 with Retry-After at once. Default: 8 a sequence.",
                                                  show_default=False)] = None,
    max_body: Annotated[int, typer.Option("--max-body", metavar="BYTES", help="Largest request body (413 past "
                                          "it).")] = 4 * 1024 * 1024,
    insecure: Annotated[bool, typer.Option("--insecure", help="Allow a non-loopback --host without an API key: "
                                           "anyone who reaches the port can use the model.")] = False,
    *,
    options: Settings,
    given: dict[str, Any],
) -> None:
    """Serve the OpenAI and Anthropic APIs (streaming or not) with speculative decoding.

    Every request is a sequence in one shared target pass, each one drafting
    with n-gram lookup, and with a draft model where one is given (--draft, or
    a --profile's): every sequence's drafts then come from it at once.

    A conversation that comes back (agents resend it every turn) reuses the cache of its earlier turns.

    The model, drafter and sampling options are the defaults a request's own fields override.

    Routes: POST /v1/chat/completions, POST /v1/completions, POST
    /v1/responses (OpenAI's Responses API), POST /v1/messages and
    /v1/messages/count_tokens (Anthropic's Messages API), GET /v1/models,
    GET /health, GET /metrics.

    Examples:

      localspec serve

      localspec serve --port 8080 --parallel 4

      localspec serve --profile qwen2.5-coder-1.5b   (the Coder 1.5B, drafted by the 0.5B)

      LOCALSPEC_API_KEY=secret localspec serve --host 0.0.0.0

      curl http://127.0.0.1:8000/v1/chat/completions -d '{"messages": [{"role": "user", "content": "Hi"}]}'
    """
    with user_errors():
        deps = _serve_extra()
        key = api_key if api_key is not None else os.environ.get(API_KEY_ENV) or None
        check_binding(host, key, insecure)
        lanes = parse_parallel(parallel)
        if queue_timeout <= 0:
            raise UserError(f"--queue-timeout must be more than 0 seconds, got {queue_timeout:g}")
        if request_timeout < 0:
            raise UserError(f"--request-timeout must be 0 (no limit) or more seconds, got {request_timeout:g}")
        if max_queue is not None and max_queue < 1:
            raise UserError(f"--max-queue must be at least 1, got {max_queue}")
        if max_body < 1024:
            raise UserError(f"--max-body must be at least 1024 bytes, got {max_body}")
        sock = bind(host, port)  # before the model loads: a port in use is said at once
        from localspec.serve.app import Limits

        limits = Limits(key, max_body, queue_timeout, request_timeout=request_timeout or None, max_queue=max_queue)
        _run(sock, options, lanes, limits, given.get("profile"), deps)


def _serve_extra() -> Any:
    try:
        import uvicorn

        import localspec.serve.app  # noqa: F401  (Starlette)
    except ImportError as e:
        raise UserError(f"localspec serve needs the 'serve' extra ({e.name} is missing): "
                        "pip install 'localspec[serve]'") from None
    return uvicorn


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_binding(host: str, key: str | None, insecure: bool) -> None:
    """Only loopback without a key: another address would hand the model to whoever reaches the port."""
    if is_loopback(host) or key:
        return
    if not insecure:
        raise UserError(f"--host {host} would let anyone who reaches this machine use the model: set --api-key KEY "
                        f"(or ${API_KEY_ENV}), or pass --insecure if that is what you want")
    _say(f"warning: serving on {host} without an API key (--insecure): anyone who reaches the port can use it")


def bind(host: str, port: int) -> socket.socket:
    if not 0 <= port <= 65535:
        raise UserError(f"--port must be between 0 and 65535, got {port}")
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        infos = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(infos[0][4])
    except OSError as e:
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}; pick another --port or --host") from None
    return sock


def _run(sock: socket.socket, options: Settings, lanes: int | None, limits: Limits, profile: str | None,
         uvicorn: Any) -> None:
    from localspec.runtime import BatchRuntime
    from localspec.serve.app import create_app
    from localspec.serve.service import Service
    from localspec.worker import Worker

    worker = Worker("localspec-serve")
    try:
        # opened on the worker: llama.cpp's context is decoded from the thread that made it
        # a server holds other people's text: kept in memory only, unless the operator asks (--keep-history; the
        # LOCALSPEC_HISTORY variable can only lower that); kept on disk, it is saved as the server goes (service.py)
        # opened as a seeded job (a provisional calibration taken as it is, how passes are read back settled): any
        # request may carry a seed, and a seeded request alone on a server repeats its text across its restarts
        rt = worker.call(lambda: BatchRuntime.open(options, lanes, say=_say, history_default="memory", seeded=True))
    except BaseException:
        worker.shutdown()
        sock.close()
        raise
    for notice in rt.notices:
        _say(notice)
    if rt.grammars is not None:  # structured output's tokenizer now, not in the first such client's time
        worker.call(rt.grammars.prepare)
    # what is loaded now (the vocabulary's pieces, the tokenizer, the caches) lives as long as the server: out of the
    # collector's reach, a full collection no longer walks it, which held the GIL, and so the event loop, ~50-120 ms
    gc.collect()
    gc.freeze()
    # the event loop, the worker and the admission threads take turns at the GIL: a thread that wants it waits up to
    # the switch interval for each thread ahead of it (5 ms by default), and the loop's wake-ups queue behind them
    sys.setswitchinterval(0.001)
    # one C call holds the GIL to its end: json.loads of a 1 MB body (a hostile schema) ~45 ms on a 2-core EPYC. It
    # collects every ~700 objects, and a Python callback there is where the interpreter hands the GIL over: the
    # event loop's longest wait behind it fell from 47 ms to 5-8 ms
    gc.callbacks.append(_switch_point)
    service = Service(rt, worker)
    names = tuple(dict.fromkeys(n for n in (rt.model_name, profile, "default") if n))
    application = create_app(service, limits, names)
    config = uvicorn.Config(application, log_level="warning", access_log=False, timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    sock.listen(2048)  # now, not in uvicorn's startup: a client that read the address below is queued, not refused
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    speculation = options.speculation
    _say(f"serving {rt.model_name} at http://{shown}:{port}/v1 · {rt.parallel} sequences at a time · drafter "
         f"{speculation.drafter}{'' if speculation.k is None else f' k={speculation.k}'} · {rt.device.description}"
         f"{' · API key required' if limits.api_key else ''}; Ctrl-C stops")
    service.start()
    terminated = False
    try:
        with _sigterm_raises():
            server.run(sockets=[sock])
    except _Terminated:
        terminated = True
    finally:
        service.close()  # the requests end, the history is saved (with --keep-history), the model closes
        sock.close()
    _say("stopped")
    if terminated:  # ended by the signal, as supervisors expect of a process told to stop
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


class _Terminated(Exception):
    """SIGTERM (systemd, docker stop, kill) once uvicorn has shut down: stop as cleanly as Ctrl-C."""


@contextmanager
def _sigterm_raises() -> Iterator[None]:
    """While the server runs, SIGTERM raises ``_Terminated`` once uvicorn has shut down. uvicorn catches the signal,
    shuts down, puts back the handler it found and raises the signal again: with the default handler the process
    died there, before the ``finally`` that saves the history and closes the model."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum: int, frame: object) -> None:
        raise _Terminated

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _say(text: str) -> None:
    print(f"localspec: {text}", file=sys.stderr, flush=True)


def _switch_point(phase: str, info: dict[str, int]) -> None:
    """A garbage collection's callback that does nothing: entering it lets a waiting thread take the GIL."""
