"""Bodies of SGLang's native routes (/generate, /abort_request, /health), as msgspec Structs.
On /generate unknown fields are an error, and so are unknown sampling parameters (they are
checked by runtime.SamplingParams)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

# A JSON value whose shape runtime.SamplingParams checks (it names any bad field itself).
JsonValue = Any


class GenerateRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """SGLang's GenerateReqInput, the fields we implement (server/sglang/compat.py sorts the rest).

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
    lora_path: str | list[str | None] | None = None  # a loaded LoRA adapter's name (SGLang's), or one per prompt
    # Keep the prompt cached this many seconds (server/pipeline/retention.py); priority: higher is released later.
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

