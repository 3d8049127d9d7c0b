"""Errors in Ollama's shape: `{"error": "..."}` with the HTTP status, for every answer of this room
(Ollama's clients raise ResponseError with that text); in a stream, one last `{"error": ...}` line."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from server.common.errors import APIError

logger = logging.getLogger("radixserve.server")


def error_line(message: str) -> bytes:
    return msgspec.json.encode({"error": message}) + b"\n"


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return Response(msgspec.json.encode({"error": message}), status_code=status, media_type="application/json",
                    headers=headers)


def ollama_errors(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """A route whose failures answer in Ollama's shape."""

    @functools.wraps(handler)
    async def route(request: Request) -> Response:
        try:
            return await handler(request)
        except APIError as exc:
            return error_response(exc.status, exc.message, exc.headers)
        except Exception as exc:  # noqa: BLE001 - a bug still answers in the client's shape
            logger.exception("unhandled error on %s", request.url.path)
            return error_response(500, f"internal error: {type(exc).__name__}")

    return route
