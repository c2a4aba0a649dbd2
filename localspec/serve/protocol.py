"""The server's side of OpenAI's protocol: its error object, and request bodies read by the reader every face
shares (localspec/openai_body.py), so that a body means the same to `serve` as to `batch`."""

from __future__ import annotations

from localspec.openai_body import Body, BodyError, Kind, parse_body


class ApiError(Exception):
    """An answer in OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, object]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def parse(kind: Kind, data: object) -> Body:
    """``data`` as a chat or text completion body, or the ApiError (400) that names the first field it gets
    wrong."""
    try:
        return parse_body(data, kind, "")
    except BodyError as e:
        raise ApiError(400, str(e), param=e.param) from None
