"""`POST /v1/messages` and `POST /v1/messages/count_tokens`: Anthropic's Messages API on the one chat
pipeline (server/pipeline/chat.py: chat template, constraints, tool-call and reasoning parsers).

A body becomes a chat request (translate.py), is planned and run like a chat completion, and its
answer goes back as a Message or as Anthropic's event stream (render.py); every error is in
Anthropic's shape (errors.py). `cache_control` marks are retained by the pipeline (retention.py);
the prompt's cached tokens are reported as `cache_read_input_tokens`.
"""

from __future__ import annotations

import dataclasses

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from server.anthropic.errors import anthropic_errors
from server.anthropic.protocol import CountTokensRequest, MessagesRequest
from server.anthropic.render import (
    content_blocks,
    message_events,
    message_object,
    new_message_id,
    sse,
    stop_reason,
    usage,
)
from server.anthropic.translate import chat_request
from server.common.errors import APIError
from server.common.state import ServerState, decode_body
from server.common.wire import json_response
from server.pipeline.chat import ChatPlan, final_message, plan_chat, run_chat, stream_chat


def _check_model(state: ServerState, model: str | None) -> None:
    if model is not None and model not in state.model_names:
        raise APIError(404, f"model: {model!r} is not served here; this server serves {state.served_model_name!r} "
                            "(Claude Code: set ANTHROPIC_MODEL and ANTHROPIC_SMALL_FAST_MODEL to it)", "model")


def _plan(state: ServerState, body: MessagesRequest) -> tuple[ChatPlan, bool]:
    """The plan, and whether max_tokens was cut to the room the context leaves: as Anthropic's
    models do, a max_tokens past the context window is not an error (Claude Code asks for 32,000):
    the answer stops at the window, with stop_reason model_context_window_exceeded."""
    chat = chat_request(body)
    plan = plan_chat(state, msgspec.structs.replace(chat, max_tokens=None))  # max_new_tokens: the room left
    capped = plan.params.max_new_tokens < body.max_tokens
    plan.params = dataclasses.replace(plan.params, max_new_tokens=min(body.max_tokens, plan.params.max_new_tokens))
    return plan, capped


@anthropic_errors
async def messages(request: Request) -> Response:
    state: ServerState = request.app.state.radix
    body = decode_body(await state.read_body(request), MessagesRequest)
    _check_model(state, body.model)
    plan, capped = _plan(state, body)
    rid = new_message_id()
    state.log_request(rid, body.messages)
    model = body.model or state.served_model_name
    stops = body.stop_sequences or []
    omit = body.thinking is not None and body.thinking.display == "omitted"  # Claude Code asks this
    if body.stream:
        stream = await stream_chat(state, plan)
        events = message_events(rid, model, plan, stream, stops, capped, omit)
        return StreamingResponse(sse(events), media_type="text/event-stream")
    (out,) = await run_chat(state, plan)
    message, finish = final_message(plan, out)
    reason, sequence = stop_reason(out, finish, stops, capped)
    state.log_response(rid, [out.text])
    return json_response(message_object(rid, model, content_blocks(message, omit), reason, sequence, usage(out, plan)))


@anthropic_errors
async def count_tokens(request: Request) -> Response:
    state: ServerState = request.app.state.radix
    body = decode_body(await state.read_body(request), CountTokensRequest)
    _check_model(state, body.model)
    plan = plan_chat(state, chat_request(body))
    return json_response({"input_tokens": len(plan.ids)})
