"""The live view of the prefix cache: GET /cache (one page of the radix tree as JSON) and GET
/cache/view (a self-contained page that draws it and refreshes itself).

The tree is read on the engine thread only (Engine.cache_snapshot posts the walk to the loop);
here the handler waits for it off the event loop, like /flush_cache.
"""

from __future__ import annotations

import asyncio
from functools import cache
from importlib.resources import files

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from radix.tree_view import DEFAULT_LIMIT
from server.common.errors import APIError, bad_request
from server.common.state import ServerState
from server.common.wire import json_response


def _int_param(request: Request, name: str, default: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise APIError(400, f"{name}: must be an integer, got {raw!r}", name) from None


async def cache_tree(request: Request) -> Response:
    state: ServerState = request.app.state.radix
    offset = _int_param(request, "offset", 0)
    limit = _int_param(request, "limit", DEFAULT_LIMIT)
    try:
        page = await asyncio.get_running_loop().run_in_executor(None, state.engine.cache_snapshot, offset, limit)
    except ValueError as exc:
        raise bad_request(exc) from exc
    return json_response(page)


@cache
def _page() -> str:
    return files("server.cache_view").joinpath("static/cache_view.html").read_text(encoding="utf-8")


async def cache_view(request: Request) -> Response:
    return HTMLResponse(_page())
