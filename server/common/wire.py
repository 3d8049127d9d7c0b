"""What goes on the wire for every protocol: a msgspec-encoded JSON response, and server-sent events
that end in `[DONE]` (an error mid-stream becomes one last event in OpenAI's error shape)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
from starlette.responses import Response

from server.common.errors import APIError, error_json


def json_response(obj: object, status: int = 200) -> Response:
    return Response(msgspec.json.encode(obj), status_code=status, media_type="application/json")


async def sse(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    try:
        async for event in events:
            yield b"data: " + event + b"\n\n"
    except APIError as exc:
        yield b"data: " + error_json(exc.status, exc.message, exc.param) + b"\n\n"
    yield b"data: [DONE]\n\n"
