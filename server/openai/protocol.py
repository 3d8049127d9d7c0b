"""Bodies only OpenAI's Completions, Chat Completions and Models routes have, as msgspec Structs
(the chat request itself is the pipeline's: server/pipeline/request.py)."""

from __future__ import annotations

import msgspec

from server.pipeline.request import AssistantMessage, DeltaMessage, DeltaToolCall, SamplingFields


class CompletionRequest(SamplingFields, kw_only=True):
    prompt: str | list[str | int | list[int]]  # a text, token ids, or a batch of either
    logprobs: int | None = None
    echo: bool = False  # the prompt (and with logprobs, its tokens' logprobs) before the completion
    suffix: str | None = None  # refused: no fill-in-the-middle
    best_of: int | None = None  # best_of samples, the n with the highest summed logprob returned


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
    # What ended the text: SGLang's matched_stop (a stop string or regex, or the stop or EOS
    # token id) and vLLM's stop_reason (the same, but null for EOS: only what the request asked).
    matched_stop: str | int | None = None
    stop_reason: str | int | None = None


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


class ChatChoice(msgspec.Struct):
    index: int
    message: AssistantMessage
    finish_reason: str | None
    logprobs: ChoiceLogprobs | None = None
    # What ended the text: SGLang's matched_stop (a stop string or regex, or the stop or EOS
    # token id) and vLLM's stop_reason (the same, but null for EOS: only what the request asked).
    matched_stop: str | int | None = None
    stop_reason: str | int | None = None


class ChatCompletionResponse(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    object: str = "chat.completion"


class ChatDelta(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A streamed chat delta on the wire: `reasoning_content` always there (null when none), as
    vLLM and SGLang send it, so clients that read the attribute find it; the rest as OpenAI."""

    role: str | None = None
    content: str | None = None
    reasoning_content: str | None
    tool_calls: list[DeltaToolCall] | None = None

    @classmethod
    def of(cls, delta: DeltaMessage) -> ChatDelta:
        return cls(role=delta.role, content=delta.content, reasoning_content=delta.reasoning_content,
                   tool_calls=delta.tool_calls)


class ChatDeltaChoice(msgspec.Struct):
    index: int
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: ChoiceLogprobs | None = None
    matched_stop: str | int | None = None
    stop_reason: str | int | None = None


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
    root: str | None = None  # vLLM's: what the model was loaded from (an adapter's folder)
    parent: str | None = None  # a LoRA adapter's base model (vLLM's field); None for the base itself


class ModelList(msgspec.Struct):
    data: list[ModelCard]
    object: str = "list"

