"""Bodies of Ollama's API (`/api/chat`, `/api/generate`, `/api/show`, `/api/embed`) as msgspec Structs.
Unknown fields (top-level and in `options`) are ignored, as Ollama does."""

from __future__ import annotations

from typing import Any

import msgspec


class CallFunction(msgspec.Struct, kw_only=True):
    name: str
    arguments: dict[str, Any] | str | None = None


class ToolCall(msgspec.Struct, kw_only=True):
    function: CallFunction
    id: str | None = None


class Message(msgspec.Struct, kw_only=True):
    role: str
    content: str | None = None
    thinking: str | None = None
    images: list[Any] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None  # a tool's answer names the tool it comes from
    tool_call_id: str | None = None


class Function(msgspec.Struct, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(msgspec.Struct, kw_only=True):
    function: Function
    type: str = "function"


class Options(msgspec.Struct, kw_only=True):
    """The options that decide the answer; the ones about hardware and loading (num_gpu, num_thread,
    use_mmap, ...) are accepted and ignored, as unknown ones are by Ollama."""

    num_predict: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: list[str] | None = None
    num_ctx: int | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    # Samplers we do not have: refused unless they are left at their no-op values.
    mirostat: int | None = None
    typical_p: float | None = None
    tfs_z: float | None = None


class Common(msgspec.Struct, kw_only=True):
    model: str | None = None
    stream: bool = True  # Ollama streams unless told not to
    format: str | dict[str, Any] | None = None  # "json" or a JSON schema
    options: Options | None = None
    keep_alive: float | str | None = None  # accepted: the one model stays loaded for the server's life
    think: bool | str | None = None


class ChatRequest(Common, kw_only=True):
    messages: list[Message] | None = None
    tools: list[Tool] | None = None


class GenerateRequest(Common, kw_only=True):
    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool = False
    images: list[Any] | None = None


class ShowRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    name: str | None = None  # the older spelling
    verbose: bool = False


class EmbedRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    input: str | list[str] | None = None
    truncate: bool = True
    dimensions: int | None = None
    options: Options | None = None
    keep_alive: float | str | None = None


class EmbeddingsRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    prompt: str | None = None
    options: Options | None = None
    keep_alive: float | str | None = None


class ErrorBody(msgspec.Struct):
    error: str
