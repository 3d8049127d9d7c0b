"""Bodies of the OpenAI Responses API (`POST /v1/responses`), as msgspec Structs.

The request side is decoded (unknown fields ignored, as on the other OpenAI routes); the response
side (the Response object, its output items and the streaming events) is built as plain dicts in
server/responses/items.py, since its items and events are many small tagged shapes.
"""

from __future__ import annotations

from typing import Any

import msgspec


class ContentPart(msgspec.Struct, kw_only=True):
    type: str  # input_text / output_text (text parts); anything else is refused
    text: str | None = None


class InputItem(msgspec.Struct, kw_only=True):
    """One item of `input`: a message, a function_call, a function_call_output, or a reasoning item."""

    type: str | None = None  # "message" when absent and a role is given
    role: str | None = None
    content: str | list[ContentPart] | None = None
    id: str | None = None
    status: str | None = None
    call_id: str | None = None  # function_call / function_call_output
    name: str | None = None
    arguments: str | None = None
    output: str | list[ContentPart] | None = None
    namespace: str | None = None  # a function_call of a namespace's tool (server/responses/tool_kinds.py)
    input: str | None = None  # custom_tool_call: the free-form input


class FunctionTool(msgspec.Struct, kw_only=True):
    """A tool of any kind: function, custom, namespace (with its own `tools`), or a hosted one."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    tools: list[FunctionTool] | None = None  # namespace: its function and custom tools
    format: dict[str, Any] | None = None  # custom: {"type": "text"} or a grammar


class ToolChoiceFunction(msgspec.Struct, kw_only=True):
    type: str
    name: str | None = None


class TextFormat(msgspec.Struct, kw_only=True):
    type: str = "text"
    name: str | None = None
    description: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None


class TextConfig(msgspec.Struct, kw_only=True):
    format: TextFormat | None = None
    verbosity: str | None = None


class ResponsesRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    input: str | list[InputItem] | None = None
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: str | ToolChoiceFunction | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    previous_response_id: str | None = None
    store: bool = True
    text: TextConfig | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    include: list[str] | None = None
    reasoning: Any = None  # accepted: how much a model reasons is its chat template's business here
    truncation: str | None = None
    # Extensions, as on our chat route.
    seed: int | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float | None = None
    stop: str | list[str] | None = None
    cache_salt: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    # Ignored (server/responses/fields.py).
    service_tier: Any = None
    prompt_cache_key: Any = None
    safety_identifier: Any = None
    stream_options: Any = None
    # Refused when set (they would change the answer and are not implemented).
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
    top_logprobs: int | None = None
    max_tool_calls: int | None = None
