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
import uuid
from collections.abc import AsyncIterator

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from runtime import Output
from server.common.errors import APIError, error_json
from server.common.state import ServerState, decode_body
from server.pipeline.chat import ChatPlan, ChoiceStream, final_message, plan_chat, run_chat, stream_chat
from server.pipeline.messages import chat_messages
from server.pipeline.request import (
    AssistantMessage,
    ChatCompletionRequest,
    ChatMessage,
    DeltaMessage,
    FunctionDef,
    JsonSchemaFormat,
    NamedFunction,
    NamedToolChoice,
    ResponseFormat,
    Tool,
    ToolCall,
    ToolCallFunction,
)
from server.pipeline.structured import chat_tools
from server.responses.protocol import ContentPart, InputItem, ResponsesRequest
from server.responses.store import ResponseStore, StoredResponse

MESSAGE_ROLES = {"user", "system", "developer", "assistant"}
# Stands for the stored turn's output while the template renders what follows it.
_TURN_MARK = "RADIXSERVE_TURN_7f3a9c"


def _json(obj: object, status: int = 200) -> Response:
    return Response(msgspec.json.encode(obj), status_code=status, media_type="application/json")


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


# -- request -> chat request ------------------------------------------------------------------------


def _refuse_unsupported(body: ResponsesRequest) -> None:
    for name in ("background", "conversation", "prompt", "top_logprobs", "max_tool_calls"):
        if getattr(body, name) not in (None, False):
            raise APIError(400, f"{name} is not supported", name)
    if body.truncation not in (None, "disabled"):
        raise APIError(400, "truncation: only 'disabled' is supported (a prompt that does not fit is a 400)",
                       "truncation")
    if body.max_output_tokens is not None and body.max_output_tokens < 1:
        raise APIError(400, f"max_output_tokens must be >= 1, got {body.max_output_tokens}", "max_output_tokens")


def _text(content: str | list[ContentPart] | None, field: str) -> str:
    if content is None:
        raise APIError(400, f"{field} is required", field)
    if isinstance(content, str):
        return content
    parts = []
    for j, part in enumerate(content):
        if part.type not in ("input_text", "output_text", "text") or part.text is None:
            raise APIError(400, f"{field}[{j}].type: only text parts are supported, got {part.type!r}", f"{field}[{j}]")
        parts.append(part.text)
    return "".join(parts)


def input_messages(body: ResponsesRequest) -> list[ChatMessage]:
    """The request's `input` as chat messages (function calls join the assistant turn they follow)."""
    if body.input is None:
        raise APIError(400, "input is required", "input")
    if isinstance(body.input, str):
        return [ChatMessage(role="user", content=body.input)]
    messages: list[ChatMessage] = []
    for i, item in enumerate(body.input):
        kind = item.type or ("message" if item.role else None)
        where = f"input[{i}]"
        if kind == "message":
            if item.role not in MESSAGE_ROLES:
                raise APIError(400, f"{where}.role: unknown role {item.role!r}; use one of {sorted(MESSAGE_ROLES)}",
                               f"{where}.role")
            messages.append(ChatMessage(role=item.role, content=_text(item.content, f"{where}.content")))
        elif kind == "function_call":
            messages_append_call(messages, item, where)
        elif kind == "function_call_output":
            if not item.call_id:
                raise APIError(400, f"{where}.call_id is required", f"{where}.call_id")
            output = item.output if item.output is not None else ""
            messages.append(ChatMessage(role="tool", tool_call_id=item.call_id, content=_text(output, f"{where}.output")))
        elif kind == "reasoning":
            continue  # the model's earlier reasoning: not shown to it again (templates drop it too)
        else:
            raise APIError(400, f"{where}.type: unsupported input item type {kind!r} (message, function_call, "
                                "function_call_output and reasoning are)", f"{where}.type")
    if not messages:
        raise APIError(400, "input must hold at least one message or function call output", "input")
    return messages


def messages_append_call(messages: list[ChatMessage], item: InputItem, where: str) -> None:
    for name in ("call_id", "name", "arguments"):
        if not isinstance(getattr(item, name), str) or (name != "arguments" and not getattr(item, name)):
            raise APIError(400, f"{where}.{name} is required", f"{where}.{name}")
    call = ToolCall(id=item.call_id or "", function=ToolCallFunction(item.name or "", item.arguments or ""))
    last = messages[-1] if messages else None
    if last is not None and last.role == "assistant":
        last.tool_calls = [*(last.tool_calls or []), call]
    else:
        messages.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))


def _tools(body: ResponsesRequest) -> list[Tool] | None:
    if not body.tools:
        return None
    tools = []
    for i, tool in enumerate(body.tools):
        if tool.type != "function":
            raise APIError(400, f"tools[{i}].type: only function tools are supported, got {tool.type!r}",
                           f"tools[{i}].type")
        if not tool.name:
            raise APIError(400, f"tools[{i}].name is required", f"tools[{i}].name")
        tools.append(Tool(type="function", function=FunctionDef(name=tool.name, description=tool.description,
                                                                parameters=tool.parameters, strict=tool.strict)))
    return tools


def _tool_choice(body: ResponsesRequest) -> str | NamedToolChoice | None:
    choice = body.tool_choice
    if choice is None or isinstance(choice, str):
        return choice
    if choice.type != "function" or not choice.name:
        raise APIError(400, f"tool_choice: only a function ({{\"type\": \"function\", \"name\": ...}}) or none, auto, "
                            f"required are supported, got type {choice.type!r}", "tool_choice")
    return NamedToolChoice(type="function", function=NamedFunction(choice.name))


def _response_format(body: ResponsesRequest) -> ResponseFormat | None:
    fmt = body.text.format if body.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if body.tools and (body.tool_choice == "required" or not isinstance(body.tool_choice, (str, type(None)))):
        # A forced call answers with no message: the format is for the turn that does (the Agents
        # SDK sends both while it forces a tool, then resets tool_choice for the final answer).
        return None
    if fmt.type == "json_schema":
        return ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat(
            name=fmt.name, description=fmt.description, schema=fmt.schema, strict=fmt.strict))
    return ResponseFormat(type=fmt.type)


def chat_request(body: ResponsesRequest, conversation: list[ChatMessage]) -> ChatCompletionRequest:
    system = [ChatMessage(role="system", content=body.instructions)] if body.instructions else []
    return ChatCompletionRequest(
        model=body.model, messages=system + conversation, tools=_tools(body), tool_choice=_tool_choice(body),
        parallel_tool_calls=body.parallel_tool_calls, max_tokens=body.max_output_tokens,
        temperature=body.temperature, top_p=body.top_p, seed=body.seed, top_k=body.top_k, min_p=body.min_p,
        frequency_penalty=body.frequency_penalty, presence_penalty=body.presence_penalty,
        repetition_penalty=body.repetition_penalty, stop=body.stop, cache_salt=body.cache_salt,
        response_format=_response_format(body), chat_template_kwargs=body.chat_template_kwargs,
        tool_call_parser=body.tool_call_parser, reasoning_parser=body.reasoning_parser)


def _frame(body: ResponsesRequest) -> str:
    """What the earlier turns' tokens depend on besides the conversation: equal frames, equal prefixes."""
    tools = [msgspec.to_builtins(t) for t in body.tools or []]
    return json.dumps([body.instructions, tools, body.chat_template_kwargs, body.cache_salt], sort_keys=True)


# -- continuing a stored turn with its own tokens ---------------------------------------------------------


def continuation_ids(state: ServerState, prev: StoredResponse, chat: ChatCompletionRequest, turn_at: int) -> list[int] | None:
    """prev's tokens + the tokens of what the template writes after prev's output (None: not exact).

    turn_at: the index, in chat.messages, of prev's output (an assistant message)."""
    tokenizer = state.engine.tokenizer
    messages = chat_messages(chat)
    head = messages[:turn_at] + [{"role": "assistant", "content": _TURN_MARK}]
    tools = chat_tools(chat)
    try:
        before = tokenizer.apply_chat_template(head, False, tools, chat.chat_template_kwargs)
        after = tokenizer.apply_chat_template(head + messages[turn_at + 1:], True, tools, chat.chat_template_kwargs)
    except ValueError:
        return None
    if before.count(_TURN_MARK) != 1 or not after.startswith(before):
        return None  # the template rewrites earlier turns: no exact continuation
    closing = before[before.index(_TURN_MARK) + len(_TURN_MARK):]  # how the template ends a turn
    written = tokenizer.decode(prev.output_ids, skip_special_tokens=False)
    closing = closing[_overlap(written, closing):]  # the model already wrote the end-of-turn token
    suffix = closing + after[len(before):]
    return prev.token_ids + list(tokenizer.hf(suffix, add_special_tokens=False).input_ids)


def _overlap(text: str, closing: str) -> int:
    """The longest k with text ending in closing[:k]."""
    for k in range(min(len(text), len(closing)), 0, -1):
        if text.endswith(closing[:k]):
            return k
    return 0


# -- the answer as output items -------------------------------------------------------------------------


def _message_item(item_id: str, text: str, status: str = "completed") -> dict[str, object]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status == "completed" else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, object]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def _reasoning_item(item_id: str, text: str | None) -> dict[str, object]:
    content = [{"type": "reasoning_text", "text": text}] if text is not None else []
    return {"type": "reasoning", "id": item_id, "summary": [], "content": content, "status": "completed"}


def output_items(message: AssistantMessage) -> list[dict[str, object]]:
    items: list[dict[str, object]] = []
    if message.reasoning_content:
        items.append(_reasoning_item(_new_id("rs"), message.reasoning_content))
    if message.content or not items and not message.tool_calls:  # nothing said at all: one empty message
        items.append(_message_item(_new_id("msg"), message.content or ""))
    for call in message.tool_calls or []:
        items.append(_call_item(_new_id("fc"), call.id, call.function.name, call.function.arguments))
    return items


def _usage(out: Output) -> dict[str, object]:
    return {"input_tokens": out.prompt_tokens, "input_tokens_details": {"cached_tokens": out.cached_tokens},
            "output_tokens": out.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": out.prompt_tokens + out.completion_tokens}


def _status(out: Output | None) -> tuple[str, dict[str, str] | None]:
    if out is None:
        return "in_progress", None
    if out.finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if out.finish_reason == "abort":
        return "incomplete", {"reason": "aborted"}
    return "completed", None


def response_object(state: ServerState, rid: str, created: int, body: ResponsesRequest,
                    output: list[dict[str, object]], out: Output | None) -> dict[str, object]:
    status, incomplete = _status(out)
    choice = body.tool_choice
    fmt = body.text.format if body.text is not None and body.text.format is not None else None
    return {
        "id": rid, "object": "response", "created_at": created, "status": status, "background": False,
        "error": None, "incomplete_details": incomplete, "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens, "model": state.served_model_name, "output": output,
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id, "reasoning": {"effort": None, "summary": None},
        "store": body.store, "temperature": 1.0 if body.temperature is None else body.temperature,
        "text": {"format": msgspec.to_builtins(fmt) if fmt is not None else {"type": "text"}},
        "tool_choice": msgspec.to_builtins(choice) if choice is not None else ("auto" if body.tools else "none"),
        "tools": [msgspec.to_builtins(t) for t in body.tools or []],
        "top_p": 1.0 if body.top_p is None else body.top_p, "truncation": body.truncation or "disabled",
        "usage": _usage(out) if out is not None else None, "user": body.user, "metadata": body.metadata or {},
    }


# -- streaming ---------------------------------------------------------------------------------------------


class ItemStream:
    """The chat pipeline's streamed deltas as Responses output items and their events."""

    def __init__(self) -> None:
        self.items: list[dict[str, object]] = []
        self._open: dict[str, object] | None = None
        self._text = ""

    def feed(self, delta: DeltaMessage) -> list[dict[str, object]]:
        events: list[dict[str, object]] = []
        if delta.reasoning_content:
            events += self.open("reasoning")
            events.append(self._text_event("response.reasoning_text.delta", delta=delta.reasoning_content))
            self._text += delta.reasoning_content
        if delta.content:
            events += self.open("message")
            events.append(self._text_event("response.output_text.delta", delta=delta.content, logprobs=[]))
            self._text += delta.content
        for call in delta.tool_calls or []:
            if call.id is not None:  # a new call: its name first
                events += self.close()
                name = call.function.name if call.function is not None else ""
                events += self._start(_call_item(_new_id("fc"), call.id, name or "", "", "in_progress"))
            args = call.function.arguments if call.function is not None else None
            if args:
                events.append({"type": "response.function_call_arguments.delta", "item_id": self._open["id"],
                               "output_index": len(self.items) - 1, "delta": args})
                self._text += args
        return events

    def close(self) -> list[dict[str, object]]:
        item, self._open = self._open, None
        if item is None:
            return []
        index, text, self._text = len(self.items) - 1, self._text, ""
        where = {"item_id": item["id"], "output_index": index}
        events: list[dict[str, object]] = []
        if item["type"] == "message":
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            events += [{"type": "response.output_text.done", **where, "content_index": 0, "text": text, "logprobs": []},
                       {"type": "response.content_part.done", **where, "content_index": 0, "part": part}]
            self.items[index] = _message_item(item["id"], text)  # type: ignore[arg-type]
        elif item["type"] == "reasoning":
            events.append({"type": "response.reasoning_text.done", **where, "content_index": 0, "text": text})
            self.items[index] = _reasoning_item(item["id"], text)  # type: ignore[arg-type]
        else:
            events.append({"type": "response.function_call_arguments.done", **where, "name": item["name"],
                           "arguments": text})
            self.items[index] = _call_item(item["id"], item["call_id"], item["name"], text)  # type: ignore[arg-type]
        events.append({"type": "response.output_item.done", "output_index": index, "item": self.items[index]})
        return events

    def open(self, kind: str) -> list[dict[str, object]]:
        if self._open is not None and self._open["type"] == kind:
            return []
        events = self.close()
        if kind == "message":
            item = _message_item(_new_id("msg"), "", "in_progress")
            events += self._start(item)
            events.append({"type": "response.content_part.added", "item_id": item["id"],
                           "output_index": len(self.items) - 1, "content_index": 0,
                           "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}})
        else:
            events += self._start({"type": "reasoning", "id": _new_id("rs"), "summary": [], "content": [],
                                   "status": "in_progress"})
        return events

    def _start(self, item: dict[str, object]) -> list[dict[str, object]]:
        self._open = item
        self.items.append(item)
        return [{"type": "response.output_item.added", "output_index": len(self.items) - 1, "item": item}]

    def _text_event(self, kind: str, **fields: object) -> dict[str, object]:
        assert self._open is not None
        return {"type": kind, "item_id": self._open["id"], "output_index": len(self.items) - 1, "content_index": 0,
                **fields}


# -- routes ------------------------------------------------------------------------------------------------


def _store(request: Request) -> ResponseStore:
    return request.app.state.responses


async def create_response(request: Request) -> Response:
    state: ServerState = request.app.state.radix
    body = decode_body(await state.read_body(request), ResponsesRequest)
    if body.model is not None and body.model not in state.model_names:
        raise APIError(400, f"model {body.model!r} is not served here; available: {state.served_model_name!r}", "model")
    _refuse_unsupported(body)
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
    if prev is not None and prev.frame == _frame(body):
        turn_at = len(chat.messages) - len(new) - 1  # prev's output: the last message of the history
        ids = continuation_ids(state, prev, chat, turn_at)
        if ids is not None:
            plan.ids = ids
    rid = _new_id("resp")
    created = int(time.time())
    state.log_request(rid, body.input)
    if body.stream:
        stream = await stream_chat(state, plan)
        events = _events(state, store, rid, created, body, plan, history + new, stream)
        return StreamingResponse(_sse(events), media_type="text/event-stream")
    (out,) = await run_chat(state, plan)
    message, _ = final_message(plan, out)
    obj = response_object(state, rid, created, body, output_items(message), out)
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
                             output_ids=list(out.token_ids), frame=_frame(body), cache_salt=body.cache_salt))
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
