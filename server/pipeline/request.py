"""The chat request every protocol room translates into, and the message shapes the pipeline
hands back, as msgspec Structs. It is OpenAI's Chat Completions request, the most general of the
shapes we speak (with vLLM's and SGLang's extensions); the Responses room builds one from its own
body. Unknown top-level fields are ignored, as vLLM does.
"""

from __future__ import annotations

from typing import Any

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
    stop_regex: str | list[str] | None = None  # SGLang's: stop where the text matches one of these
    no_stop_trim: bool = False  # SGLang's: keep the matched stop in the text
    include_stop_str_in_output: bool = False  # vLLM's name for the same
    skip_special_tokens: bool = True
    cache_salt: str | None = None
    rid: str | None = None
    # Output constraints (server/pipeline/structured.py), and fields that would change the answer if ignored.
    response_format: ResponseFormat | None = None
    regex: str | None = None  # SGLang's extensions on its OpenAI routes
    ebnf: str | None = None
    # Declared so they are sorted (server/pipeline/fields.py: ignored, or refused when set).
    logit_bias: dict[str, float] | None = None
    functions: list[Any] | None = None  # the deprecated form of tools
    function_call: Any = None
    guided_json: Any = None  # vLLM's old names; use response_format / regex / ebnf
    guided_regex: Any = None
    guided_grammar: Any = None
    guided_choice: Any = None
    use_beam_search: Any = None
    prompt_logprobs: Any = None
    allowed_token_ids: Any = None
    bad_words: Any = None
    truncate_prompt_tokens: Any = None
    priority: Any = None
    request_id: Any = None
    lora_path: Any = None
    return_hidden_states: Any = None


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


class TextPart(msgspec.Struct):
    type: str
    text: str | None = None
    cache_control: dict[str, Any] | None = None  # Anthropic's retention mark (server/pipeline/retention.py)


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
    cache_control: dict[str, Any] | None = None  # retain the prompt up to this message (server/pipeline/retention.py)


class ChatCompletionRequest(SamplingFields, kw_only=True):
    messages: list[ChatMessage]
    tools: list[Tool] | None = None
    tool_choice: str | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    # vLLM / SGLang: the last (assistant) message is an unfinished prefix the model goes on from
    # (its turn is left open: no end-of-turn, no new generation prompt).
    continue_final_message: bool = False
    # vLLM / SGLang extensions: variables for the chat template (e.g. {"enable_thinking": false}),
    # and this request's tool-call / reasoning parser instead of the server's (a name or "none").
    chat_template_kwargs: dict[str, Any] | None = None
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    # Declared so they are sorted (server/pipeline/fields.py: ignored, or refused when set).
    metadata: Any = None
    store: Any = None
    service_tier: Any = None
    prompt_cache_key: Any = None
    safety_identifier: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    modalities: Any = None
    audio: Any = None
    web_search_options: Any = None
    separate_reasoning: Any = None
    stream_reasoning: Any = None
    chat_template: Any = None
    documents: Any = None


class AssistantMessage(msgspec.Struct):
    role: str = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None  # a thinking model's reasoning (server/parsers/reasoning.py)


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

