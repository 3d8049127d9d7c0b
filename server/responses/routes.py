"""`POST /v1/responses` (the OpenAI Responses API), `GET` and `DELETE /v1/responses/{id}`.

A Responses request is turned into a chat request and run through the chat pipeline
(server/pipeline/chat.py: chat template, output constraint, tool-call and reasoning parsers); its
answer comes back as output items (`reasoning`, `message` with `output_text`, `function_call`),
streamed as the Responses events (`response.created` ... `response.completed`, each with a
`sequence_number`).

`previous_response_id` continues a stored response (server/responses/store.py). Beyond the peers,
the continuation does not re-render and re-tokenize the earlier turns: the new prompt is the
stored turn's own token ids (its prompt and the tokens the model wrote) followed by the tokens of
what the chat template adds after that turn, so the prefix is token-for-token what is cached, and
the stored turn's tokens are pinned in the radix cache (Engine.pin_prefix) while the response is
stored. `usage.input_tokens_details.cached_tokens` shows it. The continuation falls back to the
plain chat rendering when it cannot be exact (instructions, tools or template options changed, or
a template that rewrites earlier turns).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from runtime import Output
from server.common.errors import APIError, error_json
from server.common.state import ServerState, decode_body
from server.pipeline.chat import ChatPlan, ChoiceStream, final_message, plan_chat, run_chat, stream_chat
from server.pipeline.request import AssistantMessage, ChatMessage, ToolCall, ToolCallFunction
from server.responses.items import ItemStream, new_id, output_items, response_object
from server.responses.protocol import ResponsesRequest
from server.responses.store import ResponseStore, StoredResponse
from server.responses.tool_kinds import chat_tools as responses_tools
from server.responses.translate import chat_request, continuation_ids, frame, input_messages, refuse_unsupported


def _json(obj: object, status: int = 200) -> Response:
    return Response(msgspec.json.encode(obj), status_code=status, media_type="application/json")


# -- routes ------------------------------------------------------------------------------------------------


def _store(request: Request) -> ResponseStore:
    return request.app.state.responses


async def create_response(request: Request) -> Response:
    state: ServerState = request.app.state.radix
    body = decode_body(await state.read_body(request), ResponsesRequest)
    state.check_model(body.model)
    refuse_unsupported(body)
    store = _store(request)
    prev: StoredResponse | None = None
    history: list[ChatMessage] = []
    if body.previous_response_id is not None:
        prev = store.get(body.previous_response_id)
        if prev is None:  # OpenAI's answer for an unknown id (ours also expire and are evicted)
            raise APIError(400, f"Previous response with id {body.previous_response_id!r} not found.",
                           "previous_response_id")
        history = list(prev.messages)
    new = input_messages(body)
    chat = chat_request(body, history + new)
    plan = plan_chat(state, chat)
    if prev is not None and prev.frame == frame(body):
        turn_at = len(chat.messages) - len(new) - 1  # prev's output: the last message of the history
        ids = continuation_ids(state, prev, chat, turn_at)
        if ids is not None:
            plan.ids = ids
    rid = new_id("resp")
    created = int(time.time())
    state.log_request(rid, body.input)
    names = responses_tools(body.tools)[1]  # custom and namespaced tools' calls, as the request named them
    if body.stream:
        stream = await stream_chat(state, plan)
        events = _events(state, store, rid, created, body, plan, history + new, stream)
        return StreamingResponse(_sse(names.events(events)), media_type="text/event-stream")
    (out,) = await run_chat(state, plan)
    message, _ = final_message(plan, out)
    obj = response_object(state, rid, created, body, [names.qualify(i) for i in output_items(message)], out)
    _remember(state, store, body, obj, plan, history + new, message, out)
    state.log_response(rid, [out.text])
    return _json(obj)


def _remember(state: ServerState, store: ResponseStore, body: ResponsesRequest, obj: dict[str, object],
              plan: ChatPlan, conversation: list[ChatMessage], message: AssistantMessage, out: Output) -> None:
    """Store a finished response (unless store is false) and pin its tokens for the next turn."""
    if not body.store or out.finish_reason == "abort":
        return
    said = ChatMessage(role="assistant", content=message.content, tool_calls=message.tool_calls)
    if message.tool_calls and not all(_is_json(c.function.arguments) for c in message.tool_calls):
        said = ChatMessage(role="assistant", content=out.text)  # a call cut short: the history keeps the text
    token_ids = list(plan.ids) + list(out.token_ids)
    rid = str(obj["id"])
    store.put(StoredResponse(id=rid, body=obj, messages=[*conversation, said], token_ids=token_ids,
                             output_ids=list(out.token_ids), frame=frame(body), cache_salt=body.cache_salt))
    state.engine.pin_prefix(rid, token_ids, store.ttl_s, body.cache_salt)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


async def _events(state: ServerState, store: ResponseStore, rid: str, created: int, body: ResponsesRequest,
                  plan: ChatPlan, conversation: list[ChatMessage], stream: AsyncIterator[Output]
                  ) -> AsyncIterator[dict[str, object]]:
    yield {"type": "response.created", "response": response_object(state, rid, created, body, [], None)}
    yield {"type": "response.in_progress", "response": response_object(state, rid, created, body, [], None)}
    choice = ChoiceStream(plan)
    items = ItemStream()
    async for out in stream:
        if out.error:
            raise APIError(500, out.error)
        for delta in choice.feed(out.delta_text, final=out.finished):
            for event in items.feed(delta):
                yield event
        if out.finished:
            for event in items.close():
                yield event
            if not items.items:  # nothing was said at all: still one (empty) message, as without streaming
                for event in items.open("message") + items.close():
                    yield event
            obj = response_object(state, rid, created, body, items.items, out)
            _remember(state, store, body, obj, plan, conversation, _said(items.items), out)
            kind = "response.completed" if obj["status"] == "completed" else "response.incomplete"
            yield {"type": kind, "response": obj}


def _said(items: list[dict[str, object]]) -> AssistantMessage:
    """The assistant turn the streamed items make (what the next turn's history holds)."""
    text = "".join(str(part["text"]) for item in items if item["type"] == "message"
                   for part in item["content"])  # type: ignore[attr-defined]
    calls = [ToolCall(id=str(i["call_id"]), function=ToolCallFunction(str(i["name"]), str(i["arguments"])))
             for i in items if i["type"] == "function_call"]
    return AssistantMessage(content=text or None, tool_calls=calls or None)


async def _sse(events: AsyncIterator[dict[str, object]]) -> AsyncIterator[bytes]:
    sequence = 0
    try:
        async for event in events:
            event["sequence_number"] = sequence
            sequence += 1
            yield b"event: " + str(event["type"]).encode() + b"\ndata: " + msgspec.json.encode(event) + b"\n\n"
    except APIError as exc:
        error = msgspec.json.decode(error_json(exc.status, exc.message, exc.param))["error"]
        event = {"type": "error", **error, "sequence_number": sequence}
        yield b"event: error\ndata: " + msgspec.json.encode(event) + b"\n\n"


async def get_response(request: Request) -> Response:
    rid = request.path_params["response_id"]
    entry = _store(request).get(rid)
    if entry is None:
        raise APIError(404, f"Response with id {rid!r} not found.", "response_id")
    return _json(entry.body)


async def delete_response(request: Request) -> Response:
    rid = request.path_params["response_id"]
    if not _store(request).delete(rid):
        raise APIError(404, f"Response with id {rid!r} not found.", "response_id")
    return _json({"id": rid, "object": "response", "deleted": True})
