"""Ollama requests -> the chat pipeline's protocol-free chat request.

`/api/chat` maps message for message (so a 400 about `messages[2]` names the message the client
sent); `/api/generate` is one user turn (with its `system`) through the chat template, or, with
`raw`, the prompt itself. `options` become the sampling fields, `format` the output constraint
("json" or a JSON schema, through the grammar), `think` the template's `enable_thinking`.
"""

from __future__ import annotations

import json

from server.common.errors import APIError
from server.ollama.protocol import ChatRequest, Common, GenerateRequest, Message, Options
from server.pipeline.request import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionDef,
    JsonSchemaFormat,
    ResponseFormat,
    Tool,
    ToolCall,
    ToolCallFunction,
)

ROLES = {"system", "user", "assistant", "tool"}


def chat_request(body: ChatRequest, context_len: int) -> ChatCompletionRequest:
    if not body.messages:
        raise APIError(400, "messages: at least one message is required", "messages")
    messages = [_message(m, f"messages[{i}]", i) for i, m in enumerate(body.messages)]
    return ChatCompletionRequest(messages=messages, tools=_tools(body), **common_fields(body, context_len))


def generate_request(body: GenerateRequest, context_len: int) -> ChatCompletionRequest:
    """/api/generate as one chat turn (`raw` prompts are run as they are: see routes.py)."""
    for name in ("suffix", "template"):
        if getattr(body, name):
            raise APIError(400, f"{name}: not supported (the model's own chat template is used)", name)
    if body.context:
        raise APIError(400, "context: not supported; send the conversation to /api/chat instead", "context")
    if body.images:
        raise APIError(400, "images: this server reads text only", "images")
    messages = [ChatMessage(role="system", content=body.system)] if body.system else []
    messages.append(ChatMessage(role="user", content=body.prompt or ""))
    return ChatCompletionRequest(messages=messages, **common_fields(body, context_len))


def common_fields(body: Common, context_len: int) -> dict[str, object]:
    """options, format and think as the chat request's fields."""
    fields = _options(body.options or Options(), context_len)
    fields["response_format"] = _format(body.format)
    if body.think is not None:
        if body.think not in (True, False, "low", "medium", "high"):
            raise APIError(400, f"think: must be true, false, low, medium or high, got {body.think!r}", "think")
        fields["chat_template_kwargs"] = {"enable_thinking": body.think is not False}
    return fields


def _options(options: Options, context_len: int) -> dict[str, object]:
    for name, neutral in (("mirostat", 0), ("typical_p", 1.0), ("tfs_z", 1.0)):
        value = getattr(options, name)
        if value is not None and value != neutral:
            raise APIError(400, f"options.{name}: not supported (leave it at {neutral})", f"options.{name}")
    if options.num_ctx is not None and options.num_ctx > context_len:
        raise APIError(400, f"options.num_ctx: {options.num_ctx} is more than this model's context length "
                            f"({context_len})", "options.num_ctx")
    predict = options.num_predict
    if predict is not None and predict < 0 and predict not in (-1, -2):
        raise APIError(400, f"options.num_predict: must be a number of tokens, -1 or -2, got {predict}",
                       "options.num_predict")
    return {"max_tokens": predict if predict is not None and predict >= 0 else None,  # -1 / -2: up to the context
            "temperature": options.temperature, "top_k": options.top_k, "top_p": options.top_p,
            "min_p": options.min_p, "seed": options.seed, "stop": options.stop,
            "repetition_penalty": options.repeat_penalty,
            "presence_penalty": options.presence_penalty or 0.0, "frequency_penalty": options.frequency_penalty or 0.0}


def _format(value: object) -> ResponseFormat | None:
    if value in (None, ""):
        return None
    if value == "json":
        return ResponseFormat(type="json_object")
    if isinstance(value, dict):
        return ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat(schema=value))
    raise APIError(400, f"format: must be \"json\" or a JSON schema, got {value!r}"[:200], "format")


def _message(message: Message, where: str, turn: int) -> ChatMessage:
    if message.role not in ROLES:
        raise APIError(400, f"{where}.role: unknown role {message.role!r}; use one of {sorted(ROLES)}",
                       f"{where}.role")
    if message.images:
        raise APIError(400, f"{where}.images: this server reads text only", f"{where}.images")
    calls = None
    if message.tool_calls:
        calls = [ToolCall(id=c.id or f"call_{turn}_{j}",  # the same ids every time: they render into the prompt
                          function=ToolCallFunction(c.function.name, _arguments(c.function.arguments)))
                 for j, c in enumerate(message.tool_calls)]
    content = message.content
    if content is None and not calls:
        content = ""
    return ChatMessage(role=message.role, content=content, tool_calls=calls, name=message.tool_name,
                       tool_call_id=message.tool_call_id,
                       reasoning_content=message.thinking if message.role == "assistant" else None)


def _arguments(arguments: object) -> str:
    if arguments is None:
        return "{}"
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def _tools(body: ChatRequest) -> list[Tool] | None:
    if not body.tools:
        return None
    tools = []
    for i, tool in enumerate(body.tools):
        if tool.type != "function":
            raise APIError(400, f"tools[{i}].type: must be function, got {tool.type!r}", f"tools[{i}].type")
        fn = tool.function
        tools.append(Tool(type="function", function=FunctionDef(name=fn.name, description=fn.description,
                                                                parameters=fn.parameters)))
    return tools
