"""The starlette application: routes, API-key check, error shapes, metrics, shutdown."""

from __future__ import annotations

import hmac
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from runtime import Engine
from server.anthropic import errors as anthropic_errors
from server.anthropic import routes as anthropic_api
from server.cache_view import routes as cache_api
from server.common.errors import APIError, error_response
from server.common.state import ServerSettings, ServerState
from server.lora import routes as lora_api
from server.ollama import errors as ollama_errors
from server.ollama import routes as ollama_api
from server.openai import routes as openai_api
from server.openapi import openapi_document
from server.pooling import routes as pooling_api
from server.responses import routes as responses_api
from server.responses.store import ResponseStore
from server.sglang import routes as native_api

logger = logging.getLogger("radixserve.server")
OPEN_PATHS = {"/health"}


class APIKeyMiddleware:
    """With --api-key, every route but /health needs `Authorization: Bearer <key>` or, as Anthropic's
    clients send it, `x-api-key: <key>` (constant-time compares)."""

    def __init__(self, app: ASGIApp, api_key: str | None) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode() if api_key else None
        self.key = api_key.encode() if api_key else b""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.expected is None or scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        bearer = hmac.compare_digest(headers.get(b"authorization", b""), self.expected)
        if not (hmac.compare_digest(headers.get(b"x-api-key", b""), self.key) or bearer):
            message = "missing or wrong API key (send Authorization: Bearer <key>, or x-api-key: <key>)"
            response = _error_in_shape(scope["path"], 401, message)
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _error_in_shape(path: str, status: int, message: str) -> Response:
    """An error before any route ran, in the shape of the protocol the path belongs to."""
    if path.startswith("/v1/messages"):
        return anthropic_errors.error_response(status, message)
    if path.startswith("/api/"):
        return ollama_errors.error_response(status, message)
    return error_response(status, message)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return error_response(exc.status, exc.message, exc.param, exc.headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = "no such route" if exc.status_code == 404 else str(exc.detail)
    return _error_in_shape(request.url.path, exc.status_code, f"{message}: {request.method} {request.url.path}")


async def _internal_error(request: Request, exc: Exception) -> Response:
    logger.exception("unhandled error on %s", request.url.path)
    return error_response(500, f"internal error: {type(exc).__name__}")


async def _metrics(request: Request) -> Response:
    state: ServerState = request.app.state.radix
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")


async def _openapi(request: Request) -> Response:
    return JSONResponse(openapi_document())


def build_app(engine: Engine, settings: ServerSettings | None = None,
              engine_args: dict[str, object] | None = None, own_engine: bool = True) -> Starlette:
    settings = settings or ServerSettings()
    state = ServerState(engine, settings, engine_args or vars(engine.args))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        if own_engine:
            engine.shutdown()  # graceful: uvicorn stops accepting, finishes responses, then we stop
            print("radixserve: engine stopped", file=sys.stderr, flush=True)

    routes = [
        Route("/v1/completions", openai_api.completions, methods=["POST"]),
        Route("/v1/chat/completions", openai_api.chat_completions, methods=["POST"]),
        Route("/v1/models", openai_api.list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", openai_api.retrieve_model, methods=["GET"]),
        Route("/v1/embeddings", pooling_api.embeddings, methods=["POST"]),
        Route("/v1/rerank", pooling_api.rerank, methods=["POST"]),
        Route("/rerank", pooling_api.rerank, methods=["POST"]),  # Jina's and vLLM's path without /v1
        Route("/v1/score", pooling_api.score, methods=["POST"]),
        Route("/v1/messages", anthropic_api.messages, methods=["POST"]),  # Anthropic (server/anthropic/)
        Route("/v1/messages/count_tokens", anthropic_api.count_tokens, methods=["POST"]),
        Route("/v1/responses", responses_api.create_response, methods=["POST"]),
        Route("/api/chat", ollama_api.chat, methods=["POST"]),  # Ollama (server/ollama/)
        Route("/api/generate", ollama_api.generate, methods=["POST"]),
        Route("/api/tags", ollama_api.tags, methods=["GET"]),
        Route("/api/show", ollama_api.show, methods=["POST"]),
        Route("/api/embed", ollama_api.embed, methods=["POST"]),
        Route("/api/embeddings", ollama_api.embeddings, methods=["POST"]),
        Route("/api/ps", ollama_api.ps, methods=["GET"]),
        Route("/api/version", ollama_api.version, methods=["GET"]),
        *(Route(f"/api/{what}", ollama_api.manage, methods=["POST"]) for what in ("pull", "push", "create", "copy")),
        Route("/api/delete", ollama_api.manage, methods=["DELETE"]),
        Route("/api/blobs/{digest}", ollama_api.manage, methods=["POST", "HEAD"]),
        Route("/v1/responses/{response_id}", responses_api.get_response, methods=["GET"]),
        Route("/v1/responses/{response_id}", responses_api.delete_response, methods=["DELETE"]),
        Route("/generate", native_api.generate, methods=["POST"]),
        Route("/load_lora_adapter", lora_api.sglang_load, methods=["POST"]),  # LoRA adapters (server/lora/)
        Route("/unload_lora_adapter", lora_api.sglang_unload, methods=["POST"]),
        Route("/v1/load_lora_adapter", lora_api.vllm_load, methods=["POST"]),
        Route("/v1/unload_lora_adapter", lora_api.vllm_unload, methods=["POST"]),
        Route("/flush_cache", native_api.flush_cache, methods=["POST", "GET"]),
        Route("/abort_request", native_api.abort_request, methods=["POST"]),
        Route("/get_model_info", native_api.get_model_info, methods=["GET"]),
        Route("/model_info", native_api.get_model_info, methods=["GET"]),  # the names SGLang's router asks first
        Route("/tokenize", native_api.tokenize, methods=["POST"]),
        Route("/get_server_info", native_api.get_server_info, methods=["GET"]),
        Route("/server_info", native_api.get_server_info, methods=["GET"]),
        Route("/health", native_api.health, methods=["GET"]),
        Route("/health_generate", native_api.health_generate, methods=["GET"]),
        Route("/metrics", _metrics, methods=["GET"]),
        Route("/cache", cache_api.cache_tree, methods=["GET"]),  # the live view (server/cache_view/routes.py)
        Route("/cache/view", cache_api.cache_view, methods=["GET"]),
        Route("/openapi.json", _openapi, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={
        APIError: _api_error, HTTPException: _http_error, Exception: _internal_error})
    app.state.radix = state
    # Stored Responses API answers; dropping one releases its pinned tokens (server/responses/store.py).
    app.state.responses = ResponseStore(settings.responses_store_size, settings.responses_ttl, engine.unpin_prefix)
    app.add_middleware(APIKeyMiddleware, api_key=settings.api_key)
    return app
