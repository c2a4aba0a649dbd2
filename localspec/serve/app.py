"""The HTTP face: OpenAI's routes on a Starlette app, over the Service's queue and scheduler.

Safe by default: every /v1 route and /metrics need the key when one is set (compared in constant time); a body
over ``max_body`` is a 413 before it is read whole; malformed JSON, wrong types and prompts longer than a sequence
are 400s in OpenAI's error shape; a request that waits longer than ``queue_timeout`` for a sequence is a 503 with
Retry-After; anything unexpected is a 500 with one line, never a traceback.

One client cannot hurt another (docs/serve.md, "Isolation"): a request is admitted (its body read, its template
rendered, its grammar compiled with the model's tokenizer) in a worker thread, ``ADMITTING`` at a time, so the event
loop stays free; whatever fails there is that request's 400. What fails later, inside the scheduler, ends that
request alone with its own error (a stream's last event before ``[DONE]``).
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from localspec.batch.run import make_job
from localspec.errors import UserError
from localspec.history import scope_of_key
from localspec.openai_body import Body, loads
from localspec.serve import messages_api, responses_api
from localspec.serve.admission import Admissions, Busy
from localspec.serve.face import Face, FaceAnswer
from localspec.serve.metrics import LagProbe
from localspec.serve.pieces import Ended, FailedPiece, Piece, answer_pieces
from localspec.serve.protocol import ApiError, parse
from localspec.serve.responses import Answer, failure
from localspec.serve.service import Service, Ticket
from localspec.structured.tools import Calls, ToolUse

log = logging.getLogger("localspec.serve")
T = TypeVar("T")
CLIENT_GONE = 499  # nginx's "client closed request": counted in /metrics, never seen by anyone
# requests admitted at once (body read, template rendered, grammar compiled), each in a worker thread: the CPU is the
# scheduler's, so a few are enough to keep a queue of them moving
ADMITTING = 2
# requests that may wait (admission, then a free sequence) per sequence, where --max-queue does not say
QUEUE_PER_SEQUENCE = 8


class ClientGone(Exception):
    """The client disconnected while its request waited."""


@dataclass(frozen=True)
class Limits:
    api_key: str | None = None
    max_body: int = 4 * 1024 * 1024  # bytes: a whole context of text is far less
    queue_timeout: float = 60.0  # seconds a request may wait for a free sequence
    # seconds a request's admission may take (its grammar's compile, mostly): past it a 503, since how long a compile
    # takes depends on the server's load as much as on the grammar (llguidance's own limits bound its work)
    admit_timeout: float = 30.0
    request_timeout: float | None = 600.0  # seconds a request may generate; then it ends with finish_reason "length"
    # requests that may wait at once, from the handler's first line to a sequence taking them (None:
    # QUEUE_PER_SEQUENCE a sequence); past it a 503 at once, before the body is read
    max_queue: int | None = None


def create_app(service: Service, limits: Limits, names: tuple[str, ...]) -> Starlette:
    """``names``: what a request's ``model`` may say (the model, its profile, "default")."""
    rt = service.rt
    model_name = names[0]
    admissions = Admissions(ADMITTING, limits.admit_timeout)
    reading = anyio.CapacityLimiter(ADMITTING)  # an answer's calls are read beside, not behind, others' compiles
    max_queue = limits.max_queue or QUEUE_PER_SEQUENCE * rt.parallel
    waiting = [0]  # requests between the handler's first line and a sequence taking them

    def authorize(request: Request) -> str:
        """The caller's scope (localspec/history): drafts and cached prefixes never cross from one API key's
        requests to another's. One key today; a second key would be a second scope, nothing else to change."""
        if limits.api_key is None:
            return scope_of_key(None)
        # "Bearer KEY", the scheme in any case (RFC 7235: auth schemes are case-insensitive); or Anthropic's
        # "x-api-key: KEY"
        scheme, _, given = request.headers.get("authorization", "").strip().partition(" ")
        if scheme.lower() != "bearer":
            given = request.headers.get("x-api-key", "")
        if not hmac.compare_digest(given.strip().encode(), limits.api_key.encode()):
            raise ApiError(401, "a valid API key is needed: send the header 'Authorization: Bearer KEY' (or "
                                "'x-api-key: KEY')", type="authentication_error", code="invalid_api_key")
        return scope_of_key(limits.api_key)

    async def read_body(request: Request) -> bytes:
        """The body's bytes (parsed in the admitting thread: a megabyte of JSON is milliseconds of the loop's)."""
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limits.max_body:
            raise ApiError(413, f"the request body is over {limits.max_body} bytes", code="request_too_large")
        body = bytearray()
        async for piece in request.stream():
            body += piece
            if len(body) > limits.max_body:
                raise ApiError(413, f"the request body is over {limits.max_body} bytes", code="request_too_large")
        return bytes(body)

    def decoded(raw: bytes) -> object:
        try:
            return loads(raw)
        except ValueError as e:  # UnicodeDecodeError included
            raise ApiError(400, f"the request body is not valid JSON: {e}") from None

    def check_model(name: str | None) -> None:
        if name is not None and name not in names:
            raise ApiError(404, f"the model {name!r} is not served here: use {model_name!r} (GET /v1/models)",
                           param="model", code="model_not_found")

    def admit(face: Face, raw: bytes, fits: bool) -> tuple[Body, FaceAnswer, Any]:
        """The request as a job, every part of it checked (in a worker thread: it may compile a grammar); ``fits``:
        its prompt must fit a sequence (not where it is only counted)."""
        data = decoded(raw)
        body = face.read(data)
        check_model(body.model)
        answer = face.answer(model_name, data)
        return body, answer, job_of(body, answer.id, face.prompt_param if fits else None)

    async def admitted(face: Face, raw: bytes, fits: bool = True) -> tuple[Body, FaceAnswer, Any]:
        try:
            return await admissions.run(lambda: admit(face, raw, fits))
        except Busy:
            pass
        raise ApiError(503, f"the server could not check this request within {limits.admit_timeout:g} s (its grammar's "
                            "compile, behind others'); retry later", type="server_error", code="server_busy",
                       headers={"Retry-After": "5"})

    def job_of(body: Body, id: str, prompt_param: str | None) -> Any:
        """``prompt_param``: the field a prompt too long for a sequence is blamed on (None: not checked)."""
        try:
            job = make_job(rt, replace(body.request, id=id), 0, chat=False)
        except UserError as e:  # BodyError and ConstraintError name their field
            raise ApiError(400, str(e), param=getattr(e, "param", None)) from None
        if prompt_param is not None and len(job.prompt) >= rt.lanes.n_ctx:
            raise ApiError(400, f"the prompt is {len(job.prompt)} tokens but a sequence holds {rt.lanes.n_ctx} "
                                "(the server's --ctx)", param=prompt_param if body.request.messages is not None
                           else "prompt", code="context_length_exceeded")
        return job

    async def queued(request: Request, ticket: Ticket) -> None:
        """Wait for a sequence to take the request; a 503 if none does within the queue timeout."""
        with anyio.move_on_after(limits.queue_timeout):
            await watching(request, ticket, ticket.admitted.wait)
            return
        if service.queue.withdraw(ticket):
            ticket.gone.set()
            raise ApiError(503, f"the server is busy: no sequence was free within {limits.queue_timeout:g} s; "
                                "retry later", type="server_error", code="server_busy",
                           headers={"Retry-After": str(max(1, round(limits.queue_timeout / 4)))})

    async def generate(request: Request, face: Face) -> Response:
        if waiting[0] >= max_queue:  # refused at once, before its body is read: a burst cannot pile up
            raise ApiError(503, f"the server is busy: {waiting[0]} requests are waiting already (its --max-queue); "
                                "retry later", type="server_error", code="server_busy",
                           headers={"Retry-After": str(max(1, round(limits.queue_timeout / 4)))})
        waiting[0] += 1
        try:
            scope = authorize(request)
            body, answer, job = await admitted(face, await read_body(request))
            job.scope = scope
            deadline = None if limits.request_timeout is None else time.monotonic() + limits.request_timeout
            ticket = service.submit(job, deadline)
            try:
                await queued(request, ticket)
            except BaseException:
                ticket.gone.set()
                service.queue.withdraw(ticket)
                raise
        finally:
            waiting[0] -= 1
        pieces = answer_pieces(ticket.events.get, body.request.tools, read_calls, ticket.drafters)
        if body.stream:
            return _EventStream(_guarded(answer, answer.stream(pieces, body.include_usage)), ticket)
        try:
            done = await watching(request, ticket, lambda: _last(pieces))
        finally:
            ticket.gone.set()
        if isinstance(done, FailedPiece):  # raised out here: inside watching's task group it would come wrapped
            raise failure(done)
        return JSONResponse(answer.whole(done))

    async def read_calls(text: str, tools: ToolUse, ids: tuple[str, ...]) -> Calls:
        """The calls in an answer, read in a worker thread: checking their arguments may compile a tool's schema."""
        return await anyio.to_thread.run_sync(rt.tool_calls, text, tools, ids, limiter=reading)

    def face_route(face: Face) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            return await answered(request, face.endpoint, lambda: generate(request, face), face.error_body)

        return handle

    def count_route(face: Face) -> Callable[[Request], Awaitable[Response]]:
        """The prompt's tokens as ``face`` would generate from it (Anthropic's count_tokens), admitted and checked
        as a generation is, never generated."""

        async def count(request: Request) -> Response:
            authorize(request)
            # counted whatever the context holds: a client counts to learn whether it fits
            _, _, job = await admitted(face, await read_body(request), fits=False)
            return JSONResponse({"input_tokens": len(job.prompt)})

        async def handle(request: Request) -> Response:
            return await answered(request, face.endpoint + "/count_tokens", lambda: count(request), face.error_body)

        return handle

    async def models(request: Request) -> Response:
        async def listing() -> Response:
            authorize(request)
            data = [{"id": name, "object": "model", "created": 0, "owned_by": "localspec"} for name in names
                    if name != "default"]
            return JSONResponse({"object": "list", "data": data})

        return await answered(request, "models", listing)

    async def health(request: Request) -> Response:
        state = {"model": model_name, "busy": service.busy(), "queued": len(service.queue), "parallel": rt.parallel}
        if service.dead is not None:  # the worker thread is gone: nothing will be generated, say so
            return JSONResponse({"status": "error", "error": service.dead, **state}, status_code=503)
        return JSONResponse({"status": "ok", **state})

    async def metrics(request: Request) -> Response:
        async def text() -> Response:
            authorize(request)
            body = service.metrics.render(lambda: len(service.queue), service.busy, probe.worst)
            return PlainTextResponse(body, media_type="text/plain; version=0.0.4")

        return await answered(request, "metrics", text)

    async def answered(request: Request, endpoint: str, handle: Callable[[], Awaitable[Response]],
                       error_body: Callable[[ApiError], dict[str, Any]] = ApiError.body) -> Response:
        """The handler's response, or its error in its API's shape (``error_body``); counted either way."""
        try:
            response = await handle()
        except ClientGone:
            response = Response(status_code=CLIENT_GONE)
        except ApiError as e:
            response = JSONResponse(error_body(e), status_code=e.status, headers=e.headers)
        except Exception as e:  # one line at the default verbosity; the traceback at debug (--verbose)
            log.error("%s failed: %s: %s", endpoint, type(e).__name__, " ".join(str(e).split())[:300])
            log.debug("%s failed", endpoint, exc_info=True)
            response = JSONResponse(error_body(ApiError(500, "internal error: see the server's log",
                                                        type="server_error")), status_code=500)
        service.metrics.request(endpoint, response.status_code)
        return response

    async def not_found(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        message = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on "
                   f"{request.url.path}"}.get(status, "the request failed")
        return JSONResponse(ApiError(status, message).body(), status_code=status)

    probe = LagProbe()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with anyio.create_task_group() as group:
            group.start_soon(probe.run)
            yield
            group.cancel_scope.cancel()

    faces = (Face("chat/completions", lambda data: parse("chat", data), lambda model, _: Answer(True, model)),
             Face("completions", lambda data: parse("completion", data), lambda model, _: Answer(False, model),
                  prompt_param="prompt"))
    responses, messages = responses_api.face(), messages_api.face()
    routes = [
        Route("/v1/chat/completions", face_route(faces[0]), methods=["POST"]),
        Route("/v1/completions", face_route(faces[1]), methods=["POST"]),
        Route("/v1/responses", face_route(responses), methods=["POST"]),
        Route("/v1/messages", face_route(messages), methods=["POST"]),
        Route("/v1/messages/count_tokens", count_route(messages_api.count_face()), methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: not_found}, lifespan=lifespan)


async def watching(request: Request, ticket: Ticket, wait: Callable[[], Awaitable[T]]) -> T:
    """``wait()``, unless the client goes away first: then its sequence is stopped and the wait cancelled."""
    result: list[T] = []
    async with anyio.create_task_group() as group:

        async def run() -> None:
            result.append(await wait())
            group.cancel_scope.cancel()

        async def listen() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            ticket.gone.set()
            group.cancel_scope.cancel()

        group.start_soon(run)
        group.start_soon(listen)
    if not result:
        raise ClientGone
    return result[0]


async def _last(pieces: AsyncIterator[Piece]) -> Ended | FailedPiece:
    async for piece in pieces:
        if isinstance(piece, (Ended, FailedPiece)):
            return piece
    raise RuntimeError("the answer ended without its end")


async def _guarded(answer: FaceAnswer, events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The stream has its 200 already: what fails in it is its own error as its last event, one line in the log."""
    try:
        async for event in events:
            yield event
    except Exception as e:
        message = f"the answer failed: {type(e).__name__}: {' '.join(str(e).split())[:300]}"
        log.error("%s", message)
        log.debug("the stream failed", exc_info=True)
        yield answer.failed(ApiError(500, message, type="server_error"))


class _EventStream(StreamingResponse):
    """Server-sent events that stop the request's sequence when the client goes away (within a pass: the
    scheduler checks before each one), whichever ASGI version the server speaks."""

    def __init__(self, content: AsyncIterator[bytes], ticket: Ticket) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.ticket = ticket

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:  # the client went away mid-write
                        pass
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            self.ticket.gone.set()
