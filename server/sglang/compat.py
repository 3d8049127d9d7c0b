"""SGLang's /generate fields, sorted into what we do, what we accept as a hint, and what we refuse.

SGLang's own client (`sglang.RuntimeEndpoint`) and router send fields of SGLang's
`GenerateReqInput` and `SamplingParams` that a plain radixserve request never has. Every name
SGLang defines lands in one of three places here, so a body SGLang accepts is never refused for
a name alone:

- implemented: passed on (sampling parameters go to runtime.SamplingParams, the rest are
  GenerateRequest fields in server/sglang/protocol.py);
- hints: performance, routing, logging or bookkeeping fields that cannot change the answer on
  one replica: accepted and dropped;
- refused: fields that would change the answer (multimodal inputs, LoRA, beam search,
  watermarks, sessions...): accepted while unset (null, false, empty), a 400 naming the field
  when set. Anything else is an unknown field, also a 400.
"""

from __future__ import annotations

from typing import Any

# SamplingParams: SGLang's spelling -> ours, same meaning.
SAMPLING_ALIASES = {"sampling_seed": "seed", "stop_strs": "stop", "stop_regex_strs": "stop_regex"}
SAMPLING_HINTS = frozenset({
    "stream_interval",  # how often SGLang's server flushes stream chunks; we send every token
    "custom_params",  # read only by a custom_logit_processor, which we refuse
    # SGLang-internal fields of its SamplingParams, filled in by its own normalize()
    "stop_str_max_len", "stop_regex_max_len", "is_normalized", "ebnf_full_assistant",
})
SAMPLING_REFUSED = {"beam_width": "beam search", "watermark": "watermarking"}
UNLIMITED_NEW_TOKENS = 2**31 - 1  # SGLang's max_new_tokens=null: until the context is full

REQUEST_HINTS = frozenset({
    "model",  # the SGLang router adds its model id
    "session_id", "conversation_id", "routing_key", "custom_labels", "log_metrics", "no_logs",
    "received_time", "external_trace_header", "http_worker_ipc", "kv_hints", "routed_dp_rank",
    "data_parallel_rank", "disagg_prefill_dp_rank", "routed_experts_start_len", "modalities",
})
REQUEST_REFUSED = {
    "image_data": "image input", "video_data": "video input", "audio_data": "audio input",
    "input_embeds": "embedding input", "mm_hashes": "multimodal input", "mm_content_hashes": "multimodal input",
    "use_audio_in_video": "multimodal input", "video_config": "multimodal input", "images_config": "multimodal input",
    "mm_processor_kwargs": "multimodal input", "max_dynamic_patch": "multimodal input",
    "min_dynamic_patch": "multimodal input", "image_max_dynamic_patch": "multimodal input",
    "video_max_dynamic_patch": "multimodal input", "need_wait_for_mm_inputs": "multimodal input",
    "num_items_assigned": "multimodal input", "encoder_urls": "multimodal input",
    "positional_embed_overrides": "embedding overrides",
    "lora_id": "LoRA adapters by SGLang's internal id (name one by lora_path)",
    "custom_logit_processor": "custom logit processors", "watermark": "watermarking",
    "session_params": "sessions (open_session)", "token_ids_logprob": "logprobs of chosen token ids",
    "return_sampling_mask": "sampling masks", "sampling_logprobs_mode": "sampling masks",
    "return_flat_raw_top_logprobs": "flat logprob arrays", "return_flat_raw_output_top_logprobs": "flat logprob arrays",
    "return_flat_raw_top_logprobs_b64": "flat logprob arrays",
    "return_hidden_states": "hidden states", "return_routed_experts": "routed experts",
    "return_indexer_topk": "indexer top-k", "return_entropy": "entropy", "return_bytes": "bytes output",
    "return_prompt_token_ids": "prompt token ids", "background": "background requests",
    "require_reasoning": "hybrid reasoning", "max_thinking_tokens": "thinking budgets",
    "multi_item_delimiter_indices": "multi-item scoring", "token_indices_to_pool": "pooled scoring",
    "bootstrap_host": "disaggregated serving", "bootstrap_port": "disaggregated serving",
    "bootstrap_room": "disaggregated serving", "bootstrap_pair_key": "disaggregated serving",
    "decode_tp_size": "disaggregated serving",
}


def is_set(value: Any) -> bool:
    """SGLang's unset spellings: null, false, 0-length; everything else asks for the feature."""
    return value is not None and value is not False and value != [] and value != {} and value != ""


def request_fields(body: dict[str, Any]) -> dict[str, Any]:
    """The body without its hints. ValueError naming the first refused field that is set."""
    out = {}
    for key, value in body.items():
        if key in REQUEST_HINTS:
            continue
        if key in REQUEST_REFUSED:
            if is_set(value):
                raise ValueError(f"{key}: {REQUEST_REFUSED[key]} not supported by radixserve")
            continue
        out[key] = value
    return out


def sampling_fields(raw: dict[str, Any] | None) -> dict[str, Any]:
    """SGLang's sampling_params as runtime.SamplingParams.from_dict takes them.

    null means the default, as in SGLang (max_new_tokens null: until the context is full).
    """
    out: dict[str, Any] = {}
    for key, value in (raw or {}).items():
        if key in SAMPLING_HINTS:
            continue
        if key in SAMPLING_REFUSED:
            if is_set(value) and not (key == "beam_width" and value == 1):
                raise ValueError(f"{key}: {SAMPLING_REFUSED[key]} not supported by radixserve")
            continue
        if key in SAMPLING_ALIASES:
            key = SAMPLING_ALIASES[key]
            if key in raw:  # type: ignore[operator] - the canonical name wins
                continue
        if value is None:
            if key == "max_new_tokens":
                out[key] = UNLIMITED_NEW_TOKENS
            continue
        out[key] = value
    return out
