"""The request fields of /v1/responses (server/responses/protocol.py), sorted as the chat
routes' are (server/pipeline/fields.py): whose each is, which are accepted and ignored, and which
are refused when set. docs/apis.md's table is generated from these lists (server/field_table.py)."""

from __future__ import annotations

from server.pipeline.fields import OPENAI, PEERS, SGLANG, VLLM

RESPONSES_ORIGIN: dict[str, str] = {
    "model": OPENAI, "input": OPENAI, "instructions": OPENAI, "tools": OPENAI, "tool_choice": OPENAI,
    "parallel_tool_calls": OPENAI, "max_output_tokens": OPENAI, "temperature": OPENAI, "top_p": OPENAI,
    "stream": OPENAI, "previous_response_id": OPENAI, "store": OPENAI, "text": OPENAI, "metadata": OPENAI,
    "user": OPENAI, "include": OPENAI, "reasoning": OPENAI, "truncation": OPENAI, "background": OPENAI,
    "conversation": OPENAI, "prompt": OPENAI, "top_logprobs": OPENAI, "max_tool_calls": OPENAI,
    "service_tier": OPENAI, "prompt_cache_key": OPENAI, "safety_identifier": OPENAI, "stream_options": OPENAI,
    # the chat routes' extensions, on this route too
    "seed": PEERS, "top_k": PEERS, "min_p": PEERS, "frequency_penalty": PEERS, "presence_penalty": PEERS,
    "repetition_penalty": PEERS, "stop": PEERS, "cache_salt": VLLM, "chat_template_kwargs": PEERS,
    "tool_call_parser": SGLANG, "reasoning_parser": SGLANG,
}

RESPONSES_IGNORED: dict[str, str] = {
    "metadata": "echoed back in the response, nothing else",
    "user": "echoed back in the response, nothing else",
    "include": "the items we return are always whole",
    "reasoning": "how much a model reasons is its chat template's business (chat_template_kwargs)",
    "service_tier": "a billing and latency tier",
    "prompt_cache_key": "a routing hint for OpenAI's cache; the radix cache needs none",
    "safety_identifier": "an end-user id for abuse monitoring",
    "stream_options": "stream obfuscation; events are sent as they are",
}

RESPONSES_REFUSED: dict[str, str] = {
    "background": "background is not supported",
    "conversation": "conversation is not supported; use previous_response_id",
    "prompt": "prompt (a stored prompt template) is not supported",
    "top_logprobs": "top_logprobs is not supported on /v1/responses; use /v1/chat/completions",
    "max_tool_calls": "max_tool_calls is not supported",
}
