"""/openapi.json: the public routes, with request and response schemas generated from msgspec
(a `{name}` in a path is a required string path parameter)."""

from __future__ import annotations

import re

import msgspec

from server.anthropic import protocol as an
from server.common.errors import ErrorResponse
from server.lora import protocol as lr
from server.ollama import protocol as ol
from server.openai import protocol as p
from server.pipeline.request import ChatCompletionRequest
from server.pooling import protocol as pp
from server.responses import protocol as rp
from server.responses import schema as rs
from server.sglang import protocol as sg

# (method, path, request body type or None, response type, summary)
ROUTES: list[tuple[str, str, type | None, type | None, str]] = [
    ("post", "/v1/completions", p.CompletionRequest, p.CompletionResponse, "Create a completion"),
    ("post", "/v1/chat/completions", ChatCompletionRequest, p.ChatCompletionResponse, "Create a chat completion"),
    ("get", "/v1/models", None, p.ModelList, "List served models"),
    ("post", "/v1/embeddings", pp.EmbeddingRequest, pp.EmbeddingResponse, "Create embeddings"),
    ("post", "/v1/rerank", pp.RerankRequest, pp.RerankResponse, "Rerank documents for a query (Cohere/Jina shape)"),
    ("post", "/v1/score", pp.ScoreRequest, pp.ScoreResponse, "Score text pairs with the reranker (vLLM shape)"),
    ("post", "/v1/responses", rp.ResponsesRequest, rs.ResponseObject, "Create a response (OpenAI Responses API)"),
    ("get", "/v1/responses/{response_id}", None, rs.ResponseObject, "A stored response"),
    ("delete", "/v1/responses/{response_id}", None, rs.ResponseDeleted, "Delete a stored response"),
    ("post", "/generate", sg.GenerateRequest, sg.GenerateResponse, "Generate (SGLang native)"),
    ("post", "/abort_request", sg.AbortRequest, None, "Abort a request by id"),
    ("post", "/load_lora_adapter", lr.LoadLoraRequest, lr.LoraResult, "Load a LoRA adapter (SGLang shape)"),
    ("post", "/unload_lora_adapter", lr.UnloadLoraRequest, lr.LoraResult, "Unload a LoRA adapter (SGLang shape)"),
    ("post", "/v1/load_lora_adapter", lr.LoadLoraRequest, None, "Load a LoRA adapter (vLLM shape; text answer)"),
    ("post", "/v1/unload_lora_adapter", lr.UnloadLoraRequest, None, "Unload a LoRA adapter (vLLM shape; text answer)"),
    ("post", "/flush_cache", None, None, "Drop the prefix cache"),
    ("get", "/get_model_info", None, None, "Model facts"),
    ("post", "/tokenize", None, None, "Token ids of a text"),
    ("get", "/get_server_info", None, None, "Server arguments and engine stats"),
    ("get", "/health", None, sg.HealthStatus, "Liveness"),
    ("get", "/metrics", None, None, "Prometheus metrics"),
    ("get", "/cache", None, None, "One page of the prefix cache's radix tree (?offset=&limit=)"),
    ("post", "/v1/messages", an.MessagesRequest, an.MessageResponse, "Create a message (Anthropic Messages API)"),
    ("post", "/v1/messages/count_tokens", an.CountTokensRequest, an.TokenCount, "Count a message's input tokens"),
    ("post", "/api/chat", ol.ChatRequest, None, "Chat (Ollama; NDJSON unless stream is false)"),
    ("post", "/api/generate", ol.GenerateRequest, None, "Generate (Ollama; NDJSON unless stream is false)"),
    ("post", "/api/embed", ol.EmbedRequest, None, "Embeddings (Ollama)"),
    ("post", "/api/embeddings", ol.EmbeddingsRequest, None, "One embedding, not normalised (Ollama, older route)"),
    ("get", "/api/tags", None, None, "The served model (Ollama)"),
    ("post", "/api/show", ol.ShowRequest, None, "The served model's details and capabilities (Ollama)"),
    ("get", "/api/ps", None, None, "The loaded model (Ollama)"),
    ("get", "/api/version", None, None, "The Ollama API version spoken (Ollama)"),
]
# Routes whose errors are in their protocol's own shape, by path prefix (the rest: OpenAI's).
ERROR_SHAPES: dict[str, type] = {"/v1/messages": an.AnthropicError, "/api/": ol.ErrorBody}


def openapi_document() -> dict[str, object]:
    types = [t for _, _, req, resp, _ in ROUTES for t in (req, resp) if t is not None]
    types += [ErrorResponse, *ERROR_SHAPES.values()]
    # Each type's reference as msgspec names it (two rooms' types of one name get their module's path).
    schemas, components = msgspec.json.schema_components(types, ref_template="#/components/schemas/{name}")
    ref = dict(zip(types, schemas))
    paths: dict[str, dict[str, object]] = {}
    for method, path, req, resp, summary in ROUTES:
        shape = next((t for prefix, t in ERROR_SHAPES.items() if path.startswith(prefix)), ErrorResponse)
        error = {"description": "Error", "content": {"application/json": {"schema": ref[shape]}}}
        op: dict[str, object] = {"summary": summary, "responses": {
            "200": {"description": "OK", "content": {"application/json": {
                "schema": ref[resp] if resp else {"type": "object"}}}},
            "400": error, "401": error,
        }}
        names = re.findall(r"\{(\w+)\}", path)
        if names:
            op["parameters"] = [{"name": n, "in": "path", "required": True, "schema": {"type": "string"}} for n in names]
            op["responses"]["404"] = error  # type: ignore[index]
        if req is not None:
            op["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref[req]}}}
        paths.setdefault(path, {})[method] = op
    return {"openapi": "3.0.3", "info": {"title": "radixserve", "version": "0.1.0"}, "paths": paths,
            "components": {"schemas": components}}
