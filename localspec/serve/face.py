"""An API face of the server: how a body is read into the one body reader's ``Body``, how an answer is sent
(whole, or as server-sent events), and the shape of its errors. Chat and text completions (serve/responses.py),
OpenAI's Responses API (serve/responses_api.py) and Anthropic's Messages API (serve/messages_api.py) are faces
over the same admission, queue, scheduler and pieces (serve/pieces.py); none has a reader of its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from localspec.openai_body import Body
from localspec.serve.pieces import Ended, Piece
from localspec.serve.protocol import ApiError


class FaceAnswer(Protocol):
    """One answer being sent in a face's own objects."""

    id: str

    def whole(self, ended: Ended) -> dict[str, Any]:
        """The answer as one JSON object."""
        ...

    def stream(self, pieces: AsyncIterator[Piece], include_usage: bool) -> AsyncIterator[bytes]:
        """The answer as server-sent events, up to the face's own last event."""
        ...

    def failed(self, error: ApiError) -> bytes:
        """An error after the stream began: its last events."""
        ...


@dataclass(frozen=True)
class Face:
    """``endpoint``: its name in /metrics and the log; ``read``: a decoded JSON body → Body (ApiError 400 naming
    the field); ``answer``: a new answer for the served model's name and the decoded body (read already: a face may
    repeat its settings); ``error_body``: an ApiError in this API's
    shape; ``prompt_param``: the field a too-long prompt is blamed on."""

    endpoint: str
    read: Callable[[object], Body]
    answer: Callable[[str, object], FaceAnswer]
    error_body: Callable[[ApiError], dict[str, Any]] = ApiError.body
    prompt_param: str = "messages"
