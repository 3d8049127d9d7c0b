"""Loading and unloading LoRA adapters while serving (runtime/lora/registry.py).

SGLang's routes answer `{success, error_message, loaded_adapters}` (400 on failure, as SGLang
does); vLLM's answer a line of text on success and an OpenAI-shaped error otherwise (400 for bad
files or a name in use, 404 for an unknown name). Reading an adapter's files runs off the event
loop. Unloading takes the name away at once; requests already running through the adapter keep
it until they end (never unloaded under a running request).
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from runtime.lora import AdapterBusy, AdapterNotFound
from server.common.errors import APIError
from server.common.state import ServerState, decode_body
from server.common.wire import json_response
from server.lora.protocol import LoadLoraRequest, LoraResult, UnloadLoraRequest


async def _load(state: ServerState, body: LoadLoraRequest) -> None:
    engine = state.engine

    def run() -> None:
        if body.load_inplace and body.lora_name in state.adapter_names():
            engine.unload_lora_adapter(body.lora_name)
        engine.load_lora_adapter(body.lora_name, body.lora_path)

    await asyncio.get_running_loop().run_in_executor(None, run)


def _loaded(state: ServerState) -> dict[str, str]:
    lora = state.engine.lora
    return {a.name: a.path for a in lora.describe()} if lora is not None else {}


async def sglang_load(request: Request) -> Response:
    state: ServerState = request.app.state.radix
    body = decode_body(await state.read_body(request), LoadLoraRequest)
    try:
        await _load(state, body)
    except (ValueError, LookupError, RuntimeError) as exc:
        return json_response(LoraResult(False, str(exc), _loaded(state)), status=400)
    return json_response(LoraResult(True, None, _loaded(state)))


async def sglang_unload(request: Request) -> Response:
    state: ServerState = request.app.state.radix
    body = decode_body(await state.read_body(request), UnloadLoraRequest)
    try:
        state.engine.unload_lora_adapter(body.lora_name)
    except (ValueError, LookupError) as exc:
        return json_response(LoraResult(False, str(exc), _loaded(state)), status=400)
    return json_response(LoraResult(True, None, _loaded(state)))


async def vllm_load(request: Request) -> Response:
    state: ServerState = request.app.state.radix
    body = decode_body(await state.read_body(request), LoadLoraRequest)
    try:
        await _load(state, body)
    except AdapterBusy as exc:
        raise APIError(503, str(exc)) from exc
    except (ValueError, LookupError) as exc:
        raise APIError(400, str(exc), "lora_path" if "lora_path" in str(exc) else "lora_name") from exc
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


async def vllm_unload(request: Request) -> Response:
    state: ServerState = request.app.state.radix
    body = decode_body(await state.read_body(request), UnloadLoraRequest)
    try:
        state.engine.unload_lora_adapter(body.lora_name)
    except AdapterNotFound as exc:
        raise APIError(404, str(exc), "lora_name") from exc
    except ValueError as exc:
        raise APIError(400, str(exc), "lora_name") from exc
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
