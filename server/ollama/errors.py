"""Errors in Ollama's shape: `{"error": "..."}` with the HTTP status, for every answer of this room
(Ollama's clients raise ResponseError with that text); in a stream, one last `{"error": ...}` line."""

from __future__ import annotations


import msgspec
from starlette.responses import Response

from server.common.errors import errors_in_shape


def error_line(message: str) -> bytes:
    return msgspec.json.encode({"error": message}) + b"\n"


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return Response(msgspec.json.encode({"error": message}), status_code=status, media_type="application/json",
                    headers=headers)


# A route whose failures answer in Ollama's shape.
ollama_errors = errors_in_shape(error_response)
