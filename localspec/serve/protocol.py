"""The OpenAI request bodies the server takes, and the error object it answers with.

Strict types: a known field with a wrong type is a 400 naming it (``"5"`` is not a number, as OpenAI's own server
says); unknown fields are ignored, as there. What localspec cannot do (``n`` > 1, logprobs) is a 400 that says so,
never a silently different answer.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from localspec.settings import DRAFTERS


class ApiError(Exception):
    """An answer in OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, object]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class StreamOptions(_Body):
    include_usage: bool = False


class Speculation(_Body):
    """localspec's extension: this request's drafter and draft length (k None: adaptive). Token trees are not
    verified inside the shared pass, so ``branches`` may only be 1."""

    drafter: str | None = None
    k: int | None = Field(default=None, ge=0, le=16)
    branches: int = Field(default=1, ge=1, le=1)


class ContentPart(_Body):
    type: str
    text: str | None = None


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart] | None = None


class _Generation(_Body):
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    speculation: Speculation | None = None
    user: str | None = None


class ChatCompletionRequest(_Generation):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None


class CompletionRequest(_Generation):
    prompt: str | list[str]
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None


def parse(kind: type[_Generation], body: object) -> _Generation:
    """``body`` as ``kind``, or the ApiError (400) that names the first field it gets wrong."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    try:
        request = kind.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        loc = [str(part) for part in first["loc"]]
        # pydantic names a union's branch ("stop.str"): the user wrote "stop"
        param = ".".join(p for p in loc if p not in ("str", "list[str]", "list[ContentPart]", "function-after"))
        what = first["msg"][0].lower() + first["msg"][1:]
        raise ApiError(400, f"{param or 'body'}: {what}", param=param or None) from None
    _unsupported(request)
    return request


def _unsupported(request: _Generation) -> None:
    if request.n != 1:
        raise ApiError(400, "n: only n=1 is supported (one choice per request); send several requests instead",
                       param="n")
    if isinstance(request, ChatCompletionRequest) and (request.logprobs or request.top_logprobs):
        raise ApiError(400, "logprobs are not supported by localspec serve", param="logprobs")
    if isinstance(request, CompletionRequest):
        if request.logprobs:
            raise ApiError(400, "logprobs are not supported by localspec serve", param="logprobs")
        if request.echo:
            raise ApiError(400, "echo is not supported by localspec serve", param="echo")
        if request.suffix:
            raise ApiError(400, "suffix (fill-in-the-middle) is not supported by localspec serve", param="suffix")
        if isinstance(request.prompt, list) and len(request.prompt) != 1:
            raise ApiError(400, "prompt: one prompt per request (a list of one string at most)", param="prompt")
    stop = [request.stop] if isinstance(request.stop, str) else request.stop or []
    if len(stop) > 4 or any(not s for s in stop):
        raise ApiError(400, "stop: at most 4 non-empty strings", param="stop")
    drafter = request.speculation.drafter if request.speculation is not None else None
    if drafter is not None and (drafter not in DRAFTERS or drafter in ("draft", "early-exit")):
        raise ApiError(400, "speculation.drafter: the server drafts with none, ngram or auto (n-gram lookup; a draft "
                            "model would need a context per sequence)", param="speculation.drafter")
