"""The Responses request as the chat pipeline's request: `input` items -> chat messages, tools,
tool_choice and text.format -> their chat shapes (server/pipeline/request.py); and the exact
continuation of a stored turn with its own token ids (see server/responses/routes.py)."""

from __future__ import annotations

import json

import msgspec

from server.common.errors import APIError
from server.common.state import ServerState
from server.pipeline.fields import refuse_set
from server.pipeline.messages import chat_messages
from server.pipeline.request import (
    ChatCompletionRequest,
    ChatMessage,
    JsonSchemaFormat,
    NamedFunction,
    NamedToolChoice,
    ResponseFormat,
    Tool,
    ToolCall,
    ToolCallFunction,
)
from server.pipeline.structured import chat_tools
from server.responses.fields import RESPONSES_REFUSED
from server.responses.protocol import ContentPart, InputItem, ResponsesRequest
from server.responses.store import StoredResponse
from server.responses.tool_kinds import chat_tools as responses_tools

MESSAGE_ROLES = {"user", "system", "developer", "assistant"}
# Stands for the stored turn's output while the template renders what follows it.
_TURN_MARK = "RADIXSERVE_TURN_7f3a9c"


# -- request -> chat request ------------------------------------------------------------------------


def refuse_unsupported(body: ResponsesRequest) -> None:
    refuse_set(body, RESPONSES_REFUSED)
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
        elif kind == "custom_tool_call":  # a custom tool's free-form input, as the model's one argument
            arguments = json.dumps({"input": item.input if item.input is not None else ""})
            messages_append_call(messages, msgspec.structs.replace(item, arguments=arguments), where)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            if not item.call_id:
                raise APIError(400, f"{where}.call_id is required", f"{where}.call_id")
            output = item.output if item.output is not None else ""
            messages.append(ChatMessage(role="tool", tool_call_id=item.call_id, content=_text(output, f"{where}.output")))
        elif kind == "reasoning":
            continue  # the model's earlier reasoning: not shown to it again (templates drop it too)
        else:
            raise APIError(400, f"{where}.type: unsupported input item type {kind!r} (message, function_call, "
                                "function_call_output, custom_tool_call, custom_tool_call_output and reasoning are)",
                           f"{where}.type")
    if not messages:
        raise APIError(400, "input must hold at least one message or function call output", "input")
    return messages


def messages_append_call(messages: list[ChatMessage], item: InputItem, where: str) -> None:
    for name in ("call_id", "name", "arguments"):
        if not isinstance(getattr(item, name), str) or (name != "arguments" and not getattr(item, name)):
            raise APIError(400, f"{where}.{name} is required", f"{where}.{name}")
    name = f"{item.namespace}.{item.name}" if item.namespace else item.name or ""  # as tool_kinds.py names it
    call = ToolCall(id=item.call_id or "", function=ToolCallFunction(name, item.arguments or ""))
    last = messages[-1] if messages else None
    if last is not None and last.role == "assistant":
        last.tool_calls = [*(last.tool_calls or []), call]
    else:
        messages.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))


def _tools(body: ResponsesRequest) -> list[Tool] | None:
    """Function, custom and namespace tools as chat functions; hosted ones left out (tool_kinds.py)."""
    return responses_tools(body.tools)[0]


def _tool_choice(body: ResponsesRequest) -> str | NamedToolChoice | None:
    choice = body.tool_choice
    if choice == "auto" and not body.tools:
        return None  # the Responses API's default: with no tools it asks for nothing (OpenAI answers it)
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


def frame(body: ResponsesRequest) -> str:
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

