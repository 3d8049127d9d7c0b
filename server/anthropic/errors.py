"""Errors in Anthropic's shape: {"type": "error", "error": {"type": ..., "message": ...}}, with the
error types Anthropic's SDK maps to its exception classes, for every answer of this room (a bad
body, an engine error, a bug: never OpenAI's shape, never a bare 500 page)."""

from __future__ import annotations


import msgspec
from starlette.responses import Response

from server.common.errors import errors_in_shape

TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
         429: "rate_limit_error", 500: "api_error", 501: "api_error", 503: "overloaded_error",
         529: "overloaded_error"}


def error_body(status: int, message: str) -> dict[str, object]:
    return {"type": "error", "error": {"type": TYPES.get(status, "api_error"), "message": message}}


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return Response(msgspec.json.encode(error_body(status, message)), status_code=status,
                    media_type="application/json", headers=headers)


# A route whose failures answer in Anthropic's shape.
anthropic_errors = errors_in_shape(error_response)
