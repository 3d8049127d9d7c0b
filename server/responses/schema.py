"""The shapes `/v1/responses` answers with, as msgspec Structs, for /openapi.json only: the server
builds them as plain dicts (server/responses/items.py, `response_object` and `output_items`); a test
checks that a real answer fits these."""

from __future__ import annotations

from typing import Any

import msgspec


class OutputContent(msgspec.Struct, kw_only=True):
    type: str  # output_text / reasoning_text
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class OutputItem(msgspec.Struct, kw_only=True):
    """A message, a function_call or a reasoning item (the fields of the other kinds are absent)."""

    type: str
    id: str
    status: str
    role: str | None = None  # message
    content: list[OutputContent] | None = None  # message, reasoning
    call_id: str | None = None  # function_call
    name: str | None = None
    arguments: str | None = None
    summary: list[Any] | None = None  # reasoning


class InputTokensDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int


class OutputTokensDetails(msgspec.Struct, kw_only=True):
    reasoning_tokens: int


class ResponseUsage(msgspec.Struct, kw_only=True):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int
    prompt_tokens: int  # the same counts under the Chat Completions names (SGLang's clients read them)
    completion_tokens: int


class ResponseObject(msgspec.Struct, kw_only=True):
    id: str
    object: str  # "response"
    created_at: int
    status: str  # completed / incomplete / in_progress
    model: str
    output: list[OutputItem]
    background: bool = False
    error: dict[str, Any] | None = None
    incomplete_details: dict[str, Any] | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None
    store: bool = True
    temperature: float | None = None
    text: dict[str, Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    tools: list[dict[str, Any]] = []
    top_p: float | None = None
    truncation: str | None = None
    usage: ResponseUsage | None = None
    user: str | None = None
    metadata: dict[str, Any] = {}


class ResponseDeleted(msgspec.Struct, kw_only=True):
    id: str
    object: str  # "response"
    deleted: bool
