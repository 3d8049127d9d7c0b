"""Ollama's API: `/api/chat` and `/api/generate` on the one chat pipeline (server/pipeline/chat.py),
streamed as NDJSON unless `stream` is false; `/api/embed` and `/api/embeddings` on the same model and
cache (embed.py); `/api/tags`, `/api/show`, `/api/ps` and `/api/version`
about the served model; the routes that manage models (pull, push, create, copy, delete, blobs)
answer 501 with what to do instead. Every error is in Ollama's shape (errors.py)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from server.common.errors import APIError, bad_request
from server.common.state import ServerState, decode_body
from server.common.wire import json_response
from server.ollama import models
from server.ollama.embed import check_dimensions, embeddings_of, now_ns, vector
from server.ollama.errors import ollama_errors
from server.ollama.protocol import ChatRequest, EmbeddingsRequest, EmbedRequest, GenerateRequest, ShowRequest
from server.ollama.render import Clock, chat_object, created_at, generate_object, lines, ndjson
from server.ollama.translate import chat_request, generate_request
from server.pipeline.chat import (
    ChatPlan,
    check_context,
    final_message,
    plan_chat,
    run_chat,
    sampling_params,
    stream_chat,
)
from server.pipeline.request import ChatCompletionRequest
from server.pipeline.structured import constraint_for

NDJSON = "application/x-ndjson"


def _state(request: Request) -> ServerState:
    return request.app.state.radix


@ollama_errors
async def chat(request: Request) -> Response:
    state = _state(request)
    body = decode_body(await state.read_body(request), ChatRequest)
    model = models.check_model(state, body.model)
    if not body.messages:  # Ollama's way to load a model: nothing to run, the model is loaded
        return json_response({"model": model, "created_at": created_at(), "message": {"role": "assistant",
                              "content": ""}, "done": True, "done_reason": "load"})
    plan = plan_chat(state, chat_request(body, state.engine.context_len))
    return await _answer(state, plan, model, body.stream, chat=True)


@ollama_errors
async def generate(request: Request) -> Response:
    state = _state(request)
    body = decode_body(await state.read_body(request), GenerateRequest)
    model = models.check_model(state, body.model)
    if not body.prompt:  # as above: an empty prompt loads (or, with keep_alive 0, unloads) the model
        reason = "unload" if body.keep_alive in (0, "0", "0s") else "load"
        return json_response({"model": model, "created_at": created_at(), "response": "", "done": True,
                              "done_reason": reason})
    chat_body = generate_request(body, state.engine.context_len)
    plan = _raw_plan(state, chat_body, body.prompt) if body.raw else plan_chat(state, chat_body)
    return await _answer(state, plan, model, body.stream, chat=False)


def _raw_plan(state: ServerState, body: ChatCompletionRequest, prompt: str) -> ChatPlan:
    """`raw`: the prompt as the model's input, no chat template."""
    constraint = constraint_for(body)
    try:
        ids = state.engine.encode(prompt)
    except ValueError as exc:
        raise bad_request(exc) from exc
    params = sampling_params(body, default_max=max(state.engine.context_len - len(ids), 1), constraint=constraint)
    check_context(state, len(ids), body)
    return ChatPlan(ids, params, constraint, prompt)


async def _answer(state: ServerState, plan: ChatPlan, model: str, stream: bool, chat: bool) -> Response:
    clock = Clock()
    if stream:
        outputs = await stream_chat(state, plan)
        return StreamingResponse(ndjson(lines(model, plan, outputs, clock, chat)), media_type=NDJSON)
    (out,) = await run_chat(state, plan)
    clock.seen(out)
    message, _ = final_message(plan, out)
    shape = chat_object if chat else generate_object
    return json_response(shape(model, message, out, clock))


@ollama_errors
async def embed(request: Request) -> Response:
    state = _state(request)
    start = now_ns()
    body = decode_body(await state.read_body(request), EmbedRequest)
    model = models.check_model(state, body.model)
    texts = [body.input] if isinstance(body.input, str) else list(body.input or [])
    if not texts:
        raise APIError(400, "input: at least one text is required", "input")
    check_dimensions(state, body.dimensions)
    outs = await embeddings_of(state, texts, normalize=True, truncate=body.truncate)
    return json_response({"model": model, "embeddings": [vector(o, body.dimensions) for o in outs],
                          "total_duration": now_ns() - start, "load_duration": 0,
                          "prompt_eval_count": sum(o.prompt_tokens for o in outs)})


@ollama_errors
async def embeddings(request: Request) -> Response:
    """The older route: one prompt, its vector as pooled (not normalised), as Ollama answers it."""
    state = _state(request)
    body = decode_body(await state.read_body(request), EmbeddingsRequest)
    models.check_model(state, body.model)
    if not body.prompt:
        return json_response({"embedding": []})
    (out,) = await embeddings_of(state, [body.prompt], normalize=False, truncate=True)
    return json_response({"embedding": vector(out, None)})


@ollama_errors
async def tags(request: Request) -> Response:
    return json_response({"models": [models.entry(_state(request))]})


@ollama_errors
async def ps(request: Request) -> Response:
    return json_response({"models": [models.entry(_state(request), running=True)]})


@ollama_errors
async def show(request: Request) -> Response:
    state = _state(request)
    body = decode_body(await state.read_body(request), ShowRequest)
    models.check_model(state, body.model or body.name)
    return json_response(models.show(state))


@ollama_errors
async def version(request: Request) -> Response:
    return json_response({"version": models.API_VERSION})


INSTEAD = {
    "pull": "start the server with the model: python -m server --model <folder, GGUF file, Hugging Face id or "
            "ollama:NAME>",
    "push": "this server publishes nothing; push with Ollama itself",
    "create": "start the server with the model folder or GGUF file: python -m server --model PATH",
    "copy": "name the served model with --served-model-name",
    "delete": "stop the server, or start it with another --model",
    "blobs": "start the server with the model folder or GGUF file: python -m server --model PATH",
}


@ollama_errors
async def manage(request: Request) -> Response:
    """The routes that manage Ollama's model store: not ours. 501 with what to do instead."""
    what = request.url.path.removeprefix("/api/").split("/")[0]
    raise APIError(501, f"/api/{what} is not supported: radixserve serves the one model it was started with; "
                        f"{INSTEAD.get(what, 'see docs/apis.md')}")
