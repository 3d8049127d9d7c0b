"""The request and response shapes of the adapter routes: SGLang's (/load_lora_adapter,
/unload_lora_adapter) and vLLM's (/v1/load_lora_adapter, /v1/unload_lora_adapter)."""

from __future__ import annotations

import msgspec


class LoadLoraRequest(msgspec.Struct, kw_only=True):
    """Both peers' load body: SGLang adds `pinned` (kept in memory: every adapter held here is), vLLM
    `load_inplace` (replace a loaded adapter of that name: a new identity, so a new cache namespace)."""

    lora_name: str
    lora_path: str
    pinned: bool = False
    load_inplace: bool = False


class UnloadLoraRequest(msgspec.Struct, kw_only=True):
    lora_name: str
    lora_int_id: int | None = None  # vLLM's; the name decides


class LoraResult(msgspec.Struct):
    """SGLang's answer (LoadLoRAAdapterReqOutput): success, the error, and every loaded adapter's path."""

    success: bool
    error_message: str | None = None
    loaded_adapters: dict[str, str] = msgspec.field(default_factory=dict)
