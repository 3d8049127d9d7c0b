"""The request fields of /v1/chat/completions and /v1/completions (server/pipeline/request.py),
sorted as server/sglang/compat.py sorts /generate's: where each comes from (OpenAI, vLLM or
SGLang), which are accepted and ignored, and which are refused when set.

- accepted: every declared field that is neither ignored nor refused, and does what its API says;
- ignored: bookkeeping, routing or billing fields that cannot change the answer here (or whose
  effect belongs to the chat template): decoded and dropped;
- refused: fields that would change the answer and are not implemented: accepted while unset
  (null, false, empty), a 400 naming the field when set (`refuse_set`).

Fields no list names are unknown and ignored, as vLLM does. docs/apis.md's table of fields is
generated from these lists (server/field_table.py), and a test keeps it and them in step.
"""

from __future__ import annotations

from typing import Any

from server.common.errors import APIError

OPENAI, VLLM, SGLANG, PEERS = "OpenAI", "vLLM", "SGLang", "vLLM, SGLang"

# Every field of SamplingFields (both routes) and of ChatCompletionRequest, and whose it is.
ORIGIN: dict[str, str] = {
    # SamplingFields
    "model": OPENAI, "max_tokens": OPENAI, "max_completion_tokens": OPENAI, "temperature": OPENAI,
    "top_p": OPENAI, "n": OPENAI, "stream": OPENAI, "stream_options": OPENAI, "stop": OPENAI, "seed": OPENAI,
    "frequency_penalty": OPENAI, "presence_penalty": OPENAI, "user": OPENAI, "logit_bias": OPENAI,
    "response_format": OPENAI, "functions": OPENAI, "function_call": OPENAI,
    "top_k": PEERS, "min_p": PEERS, "repetition_penalty": PEERS, "ignore_eos": PEERS, "min_tokens": PEERS,
    "stop_token_ids": PEERS, "skip_special_tokens": PEERS, "cache_salt": VLLM, "rid": SGLANG,
    "regex": SGLANG, "ebnf": SGLANG, "stop_regex": SGLANG, "no_stop_trim": SGLANG,
    "include_stop_str_in_output": VLLM, "guided_json": VLLM, "guided_regex": VLLM, "guided_grammar": VLLM,
    "guided_choice": VLLM, "use_beam_search": VLLM, "prompt_logprobs": VLLM, "allowed_token_ids": VLLM,
    "bad_words": VLLM, "truncate_prompt_tokens": VLLM, "priority": VLLM, "request_id": VLLM,
    "lora_path": SGLANG, "return_hidden_states": SGLANG,
    # ChatCompletionRequest
    "messages": OPENAI, "tools": OPENAI, "tool_choice": OPENAI, "parallel_tool_calls": OPENAI,
    "logprobs": OPENAI, "top_logprobs": OPENAI, "metadata": OPENAI, "store": OPENAI, "service_tier": OPENAI,
    "prompt_cache_key": OPENAI, "safety_identifier": OPENAI, "prediction": OPENAI, "reasoning_effort": OPENAI,
    "verbosity": OPENAI, "modalities": OPENAI, "audio": OPENAI, "web_search_options": OPENAI,
    "add_generation_prompt": PEERS, "continue_final_message": PEERS, "chat_template_kwargs": PEERS,
    "tool_call_parser": SGLANG, "reasoning_parser": SGLANG, "separate_reasoning": SGLANG,
    "stream_reasoning": SGLANG, "chat_template": VLLM, "documents": VLLM,
}

IGNORED: dict[str, str] = {
    "user": "an end-user id for abuse monitoring",
    "metadata": "tags for OpenAI's dashboard",
    "store": "OpenAI's storage for evals and distillation",
    "service_tier": "a billing and latency tier",
    "prompt_cache_key": "a routing hint for OpenAI's cache; the radix cache needs none",
    "safety_identifier": "an end-user id for abuse monitoring",
    "prediction": "predicted output, a speed hint only",
    "reasoning_effort": "how much a model reasons is its chat template's business (chat_template_kwargs)",
    "verbosity": "a hint to OpenAI's models",
    "modalities": "text is the only output",
    "priority": "vLLM's scheduling priority",
    "request_id": "vLLM's request id (SGLang's rid names the engine request)",
    "separate_reasoning": "reasoning is always separated when a reasoning parser applies",
    "stream_reasoning": "reasoning is always streamed as reasoning_content",
}

REFUSED: dict[str, str] = {
    "logit_bias": "logit_bias is not supported",
    "functions": "functions is not supported; use tools and tool_choice",
    "function_call": "function_call is not supported; use tools and tool_choice",
    "guided_json": "guided_json is not supported; use response_format, regex or ebnf",
    "guided_regex": "guided_regex is not supported; use response_format, regex or ebnf",
    "guided_grammar": "guided_grammar is not supported; use response_format, regex or ebnf",
    "guided_choice": "guided_choice is not supported; use response_format, regex or ebnf",
    "use_beam_search": "use_beam_search: beam search is not supported",
    "prompt_logprobs": "prompt_logprobs is not supported; use /v1/completions with echo and logprobs",
    "allowed_token_ids": "allowed_token_ids is not supported; use regex or ebnf",
    "bad_words": "bad_words is not supported",
    "truncate_prompt_tokens": "truncate_prompt_tokens is not supported (a prompt that does not fit is a 400)",
    "return_hidden_states": "return_hidden_states is not supported; use /v1/embeddings",
    "audio": "audio output is not supported",
    "web_search_options": "web search is not supported",
    "chat_template": "chat_template: a per-request chat template is not supported (chat_template_kwargs is)",
    "documents": "documents: RAG documents for the chat template are not supported; put them in messages",
}


def is_set(value: Any) -> bool:
    """The unset spellings: null, false, empty; everything else asks for the feature."""
    return value is not None and value is not False and value != [] and value != {} and value != ""


def refuse_set(body: object, refused: dict[str, str]) -> None:
    """A 400 naming the first refused field the body sets."""
    for name, message in refused.items():
        if is_set(getattr(body, name, None)):
            raise APIError(400, message, name)
