"""Bodies of the Anthropic Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`) as msgspec
Structs. Content blocks are one open Struct checked by type in translate.py (a 400 naming the block),
so a block type we do not take is refused by name rather than by a decoder's message. Unknown
top-level fields are ignored, as on the other routes (Claude Code sends several we have no use for).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec


class ContentBlock(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None  # text
    cache_control: dict[str, Any] | None = None
    id: str | None = None  # tool_use
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None  # tool_result
    content: str | list[ContentBlock] | None = None
    is_error: bool | None = None
    thinking: str | None = None  # thinking (an earlier turn's, sent back)
    signature: str | None = None
    data: str | None = None  # redacted_thinking
    citations: Any = None


class Message(msgspec.Struct, kw_only=True):
    # user and assistant; a system (or developer) message inside `messages` is taken too, as
    # Claude Code sends one (translate.py keeps it where it was sent).
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentBlock]


class ToolDef(msgspec.Struct, kw_only=True):
    name: str
    type: str | None = None  # "custom" (or absent) for a client tool; Anthropic-defined tools carry a version
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    cache_control: dict[str, Any] | None = None


class ToolChoice(msgspec.Struct, kw_only=True):
    type: str  # auto / any / tool / none
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(msgspec.Struct, kw_only=True):
    type: str  # enabled / disabled / adaptive / between_tools
    budget_tokens: int | None = None
    display: str | None = None


class OutputFormat(msgspec.Struct, kw_only=True):
    type: str  # json_schema
    schema: dict[str, Any] | None = None


class OutputConfig(msgspec.Struct, kw_only=True):
    effort: str | None = None  # accepted; a local model has one effort
    format: OutputFormat | None = None


class Metadata(msgspec.Struct, kw_only=True):
    user_id: str | None = None


class CountTokensRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    messages: Annotated[list[Message], msgspec.Meta(min_length=1)]
    system: str | list[ContentBlock] | None = None
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    cache_control: dict[str, Any] | None = None  # automatic caching: a mark on the last block
    output_config: OutputConfig | None = None


class MessagesRequest(CountTokensRequest, kw_only=True):
    max_tokens: int
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: Metadata | None = None


# -- what goes back (for /openapi.json; the routes build the same shapes as dicts) ------------------------


class CacheCreation(msgspec.Struct, kw_only=True):
    ephemeral_5m_input_tokens: int = 0
    ephemeral_1h_input_tokens: int = 0


class Usage(msgspec.Struct, kw_only=True):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation: CacheCreation | None = None


class MessageResponse(msgspec.Struct, kw_only=True):
    id: str
    type: str = "message"
    role: str = "assistant"
    model: str
    content: list[dict[str, Any]]
    stop_reason: str | None
    stop_sequence: str | None = None
    usage: Usage


class TokenCount(msgspec.Struct, kw_only=True):
    input_tokens: int


class AnthropicErrorBody(msgspec.Struct, kw_only=True):
    type: str
    message: str


class AnthropicError(msgspec.Struct, kw_only=True):
    error: AnthropicErrorBody
    type: str = "error"
