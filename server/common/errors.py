"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Awaitable, Callable

import msgspec
from starlette.requests import Request
from starlette.responses import Response

logger = logging.getLogger("radixserve.server")
Handler = Callable[[Request], Awaitable[Response]]


class ErrorBody(msgspec.Struct):
    message: str
    type: str
    param: str | None = None
    code: int | None = None


class ErrorResponse(msgspec.Struct):
    error: ErrorBody


_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
          500: "internal_server_error", 503: "service_unavailable"}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.headers = headers or {}


def error_response(status: int, message: str, param: str | None = None,
                   headers: dict[str, str] | None = None) -> Response:
    body = ErrorResponse(ErrorBody(message=message, type=_TYPES.get(status, "error"), param=param, code=status))
    return Response(msgspec.json.encode(body), status_code=status, media_type="application/json", headers=headers)


def error_json(status: int, message: str, param: str | None = None) -> bytes:
    body = ErrorResponse(ErrorBody(message=message, type=_TYPES.get(status, "error"), param=param, code=status))
    return msgspec.json.encode(body)


def param_of(message: str) -> str | None:
    """Our ValueErrors start with the offending field's name ("top_p must be ...")."""
    match = re.match(r"^([a-z_][a-z0-9_.\[\]]*)\b", message)
    return match.group(1) if match else None


def bad_request(exc: Exception) -> APIError:
    message = str(exc)
    return APIError(400, message, param_of(message))


def errors_in_shape(render: Callable[[int, str, dict[str, str] | None], Response]) -> Callable[[Handler], Handler]:
    """A route decorator for a protocol room: every failure of the route (a bad body, an engine error,
    a bug) answers through `render(status, message, headers)`, the protocol's own error shape."""

    def wrap(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except APIError as exc:
                return render(exc.status, exc.message, exc.headers)
            except Exception as exc:  # noqa: BLE001 - a bug still answers in the client's shape
                logger.exception("unhandled error on %s", request.url.path)
                return render(500, f"internal error: {type(exc).__name__}")

        return route

    return wrap
