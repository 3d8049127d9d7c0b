"""Request and response bodies of the HTTP API, as msgspec Structs (OpenAI's and SGLang's shapes).

Unknown top-level fields are ignored on the OpenAI routes, as vLLM does; on /generate unknown
sampling parameters are an error (they are checked by runtime.SamplingParams).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

# A JSON value whose shape runtime.SamplingParams checks (it names any bad field itself).
JsonValue = Any


class StreamOptions(msgspec.Struct, omit_defaults=True):
    include_usage: bool = False


class JsonSchemaFormat(msgspec.Struct, kw_only=True):
    name: str | None = None
    description: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None


class ResponseFormat(msgspec.Struct, kw_only=True):
    type: str
    json_schema: JsonSchemaFormat | None = None


class SamplingFields(msgspec.Struct, kw_only=True):
    """Fields shared by /v1/completions and /v1/chat/completions (OpenAI's plus vLLM/SGLang extensions)."""

    model: str | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    user: str | None = None
    # extensions
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    min_tokens: int = 0  # vLLM's / SGLang's: no EOS, stop token or stop string before this many tokens
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    cache_salt: str | None = None
    rid: str | None = None
    # Output constraints (server/structured.py), and fields that would change the answer if ignored.
    response_format: ResponseFormat | None = None
    regex: str | None = None  # SGLang's extensions on its OpenAI routes
    ebnf: str | None = None
    logit_bias: dict[str, float] | None = None  # refused: not implemented
    functions: list[Any] | None = None  # refused: the deprecated form of tools
    function_call: Any = None
    guided_json: Any = None  # refused: vLLM's old names; use response_format / regex / ebnf
    guided_regex: Any = None
    guided_grammar: Any = None
    guided_choice: Any = None


class FunctionDef(msgspec.Struct, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(msgspec.Struct, kw_only=True):
    type: str
    function: FunctionDef


class NamedFunction(msgspec.Struct):
    name: str


class NamedToolChoice(msgspec.Struct, kw_only=True):
    type: str
    function: NamedFunction


class CompletionRequest(SamplingFields, kw_only=True):
    prompt: str | list[str | int | list[int]]  # a text, token ids, or a batch of either
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


class TextPart(msgspec.Struct):
    type: str
    text: str | None = None
    cache_control: dict[str, Any] | None = None  # Anthropic's retention mark (server/retention.py)


class ToolCallFunction(msgspec.Struct):
    name: str
    arguments: str  # JSON text, as OpenAI returns it


class ToolCall(msgspec.Struct, kw_only=True):
    id: str
    function: ToolCallFunction
    type: str = "function"


class ChatMessage(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an earlier assistant turn that called tools
    tool_call_id: str | None = None  # a "tool" message answers this call
    reasoning_content: str | None = None  # an earlier assistant turn's reasoning (templates may show it)
    cache_control: dict[str, Any] | None = None  # retain the prompt up to this message (server/retention.py)


class ChatCompletionRequest(SamplingFields, kw_only=True):
    messages: list[ChatMessage]
    tools: list[Tool] | None = None
    tool_choice: str | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    # vLLM / SGLang extensions: variables for the chat template (e.g. {"enable_thinking": false}),
    # and this request's tool-call / reasoning parser instead of the server's (a name or "none").
    chat_template_kwargs: dict[str, Any] | None = None
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None


class PromptTokensDetails(msgspec.Struct):
    cached_tokens: int


class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class CompletionLogprobs(msgspec.Struct):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(msgspec.Struct):
    index: int
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None


class CompletionResponse(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    object: str = "text_completion"


class TopLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprobEntry(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(msgspec.Struct):
    content: list[TokenLogprobEntry]


class AssistantMessage(msgspec.Struct):
    role: str = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None  # a thinking model's reasoning (server/reasoning_parser.py)


class DeltaFunction(msgspec.Struct, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A streamed call: the first delta has id, type and name (arguments ""), the next ones
    only argument fragments, all with the call's index (as OpenAI streams them)."""

    index: int
    id: str | None = None
    type: str | None = None
    function: DeltaFunction | None = None


class DeltaMessage(msgspec.Struct, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatChoice(msgspec.Struct):
    index: int
    message: AssistantMessage
    finish_reason: str | None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionResponse(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    object: str = "chat.completion"


class ChatDeltaChoice(msgspec.Struct):
    index: int
    delta: DeltaMessage
    finish_reason: str | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChatDeltaChoice]
    usage: Usage | None = None
    object: str = "chat.completion.chunk"


class ModelCard(msgspec.Struct):
    id: str
    created: int
    owned_by: str = "radixserve"
    object: str = "model"
    max_model_len: int | None = None


class ModelList(msgspec.Struct):
    data: list[ModelCard]
    object: str = "list"


class ErrorBody(msgspec.Struct):
    message: str
    type: str
    param: str | None = None
    code: int | None = None


class ErrorResponse(msgspec.Struct):
    error: ErrorBody


# -- native (SGLang-shaped) ---------------------------------------------------------------------


class GenerateRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """SGLang's GenerateReqInput, the fields we implement (server/sglang_compat.py sorts the rest).

    Per-prompt fields take one value for the whole batch or a list with one per prompt.
    """

    text: str | list[str] | None = None
    input_ids: list[int | list[int]] | None = None  # token ids, or a batch of them
    sampling_params: dict[str, JsonValue] | list[dict[str, JsonValue]] | None = None
    stream: bool = False
    return_logprob: bool | list[bool] | None = None
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = None
    return_text_in_logprobs: bool = False  # token texts in the logprob triples (else null, as SGLang)
    rid: str | list[str] | None = None
    cache_salt: str | list[str] | None = None
    extra_key: str | list[str] | None = None  # SGLang's other cache namespace; joined with cache_salt
    # Keep the prompt cached this many seconds (server/retention.py); priority: higher is released later.
    retention_seconds: float | list[float | None] | None = None
    priority: int | list[int | None] | None = None


class FinishReason(msgspec.Struct, omit_defaults=True):
    type: str
    matched: str | int | None = None
    length: int | None = None
    message: str | None = None


class MetaInfo(msgspec.Struct, omit_defaults=True):
    id: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: FinishReason | None = None
    input_token_logprobs: list[tuple[float | None, int, str | None]] | None = None
    output_token_logprobs: list[tuple[float, int, str | None]] | None = None
    input_top_logprobs: list[list[tuple[float, int, str | None]] | None] | None = None
    output_top_logprobs: list[list[tuple[float, int, str | None]] | None] | None = None


class GenerateResponse(msgspec.Struct):
    text: str
    output_ids: list[int]
    meta_info: MetaInfo


class AbortRequest(msgspec.Struct, forbid_unknown_fields=True):
    rid: str


class HealthStatus(msgspec.Struct):
    status: Literal["ok", "unhealthy"]
