"""Native routes in SGLang's shape: /generate, /flush_cache, /abort_request, /get_model_info,
/get_server_info, /health and /health_generate.

/generate takes what SGLang's own client and router send (server/sglang/compat.py sorts SGLang's
field names) and answers in SGLang's shape: `text`, `output_ids`, `meta_info` with token counts,
`finish_reason` as {type, matched | length | message} and logprobs as [logprob, token id, text]
triples; streamed as `data: {...}` events with the text so far, then `data: [DONE]`.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from runtime import Output, SamplingParams
from runtime.output import Logprobs
from server.common.errors import APIError, bad_request
from server.common.state import ServerState, decode_body
from server.common.wire import json_response, sse
from server.pipeline.engine_client import PrimedStream, collect, run_request
from server.pipeline.retention import Retain, retain, retaining, retention_priority, retention_seconds
from server.sglang.compat import request_fields, sampling_fields
from server.sglang.protocol import AbortRequest, FinishReason, GenerateRequest, GenerateResponse, HealthStatus, MetaInfo

logger = logging.getLogger("radixserve.server")

T = TypeVar("T")


def _each(value: T | list[T] | None, count: int, name: str) -> list[T | None]:
    """A per-prompt field: one value for every prompt, or a list with one per prompt."""
    if not isinstance(value, list):
        return [value] * count
    if len(value) != count:
        raise APIError(400, f"{name}: one per prompt ({count}), or one for all", name)
    return list(value)


def _params(raw: dict[str, object] | None, top: dict[str, object]) -> SamplingParams:
    try:
        values = sampling_fields(raw)
        for key, value in top.items():  # the top-level logprob fields, as SGLang has them
            if value is not None:
                values.setdefault(key, value)
        return SamplingParams.from_dict(values)
    except (ValueError, TypeError) as exc:
        raise bad_request(ValueError(f"sampling_params.{exc}" if not str(exc).startswith("unknown")
                                     else f"sampling_params: {exc}")) from exc


def _decode_request(body: bytes) -> GenerateRequest:
    values = decode_body(body, dict[str, Any])
    try:
        values = request_fields(values)
    except ValueError as exc:
        raise bad_request(exc) from exc
    try:
        return msgspec.convert(values, GenerateRequest)
    except msgspec.ValidationError as exc:
        message = str(exc)
        param = message.split("at `$.", 1)[1].rstrip("`") if "at `$." in message else None
        raise APIError(400, f"invalid request: {message}", param) from exc


def _batch(body: GenerateRequest, state: ServerState) -> list[list[int]]:
    if (body.text is None) == (body.input_ids is None):
        raise APIError(400, "give exactly one of text or input_ids", "text")
    try:
        if body.text is not None:
            texts = [body.text] if isinstance(body.text, str) else body.text
            if not texts:
                raise ValueError("text: the batch is empty")
            return [state.engine.encode(t) for t in texts]
        ids = body.input_ids or []
        if not ids:
            raise ValueError("input_ids must not be empty")
        if all(isinstance(x, int) for x in ids):
            return [list(ids)]  # type: ignore[arg-type]
        if any(isinstance(x, int) for x in ids):
            raise ValueError("input_ids: give token ids or a list of token-id lists, not a mix")
        return [list(x) for x in ids]  # type: ignore[arg-type]
    except ValueError as exc:
        raise bad_request(exc) from exc


def _meta(state: ServerState, out: Output, with_text: bool = True, logprobs: bool = False) -> MetaInfo:
    reason = None
    if out.finish_reason is not None:
        reason = FinishReason(type=out.finish_reason, matched=out.matched_stop,
                              length=out.completion_tokens if out.finish_reason == "length" else None,
                              message=out.error)
    meta = MetaInfo(id=out.rid, prompt_tokens=out.prompt_tokens, completion_tokens=out.completion_tokens,
                    cached_tokens=out.cached_tokens, finish_reason=reason)
    lp = out.logprobs if out.logprobs is not None or not logprobs else Logprobs()
    if lp is not None:  # asked for: all four lists, empty where there is nothing (SGLang's client indexes them)
        text = state.token_text if with_text else (lambda token: None)
        meta.output_token_logprobs = [(v, t, text(t)) for v, t in lp.output_token_logprobs]
        meta.input_token_logprobs = [(v, t, text(t)) for v, t in lp.input_token_logprobs]
        meta.output_top_logprobs = [[(v, t, text(t)) for v, t in top] for top in lp.output_top_logprobs]
        meta.input_top_logprobs = [[(v, t, text(t)) for v, t in top] if top else None
                                   for top in lp.input_top_logprobs]
    return meta


def _response(state: ServerState, out: Output, with_text: bool = True, logprobs: bool = False) -> GenerateResponse:
    return GenerateResponse(text=out.text, output_ids=out.token_ids, meta_info=_meta(state, out, with_text, logprobs))


def _rids(rid: str | list[str] | None, count: int) -> list[str | None]:
    if isinstance(rid, str) and count > 1:
        return [f"{rid}_{i}" for i in range(count)]  # SGLang: a string is a prefix for a batch's ids
    return _each(rid, count, "rid")


def _salts(body: GenerateRequest, count: int) -> list[str | None]:
    """cache_salt and SGLang's extra_key both namespace the prefix cache; together, both do."""
    salts, keys = _each(body.cache_salt, count, "cache_salt"), _each(body.extra_key, count, "extra_key")
    return [None if s is None and k is None else f"{s or ''}\x00{k or ''}" if k is not None else s
            for s, k in zip(salts, keys)]


async def generate(request: Request) -> Response:
    state: ServerState = request.app.state.radix
    body = _decode_request(await state.read_body(request))
    prompts = _batch(body, state)
    count = len(prompts)
    raws = _each(body.sampling_params, count, "sampling_params")
    tops = zip(_each(body.return_logprob, count, "return_logprob"),
               _each(body.logprob_start_len, count, "logprob_start_len"),
               _each(body.top_logprobs_num, count, "top_logprobs_num"))
    params = [_params(r, {"return_logprob": a, "logprob_start_len": b, "top_logprobs_num": c})
              for r, (a, b, c) in zip(raws, tops)]
    rids, salts = _rids(body.rid, count), _salts(body, count)
    loras = [state.adapter_for(None, name) for name in _each(body.lora_path, count, "lora_path")]
    keeps = _retains(body, prompts)
    with_text = body.return_text_in_logprobs
    if body.stream:
        if count != 1 or params[0].n != 1:
            raise APIError(400, "stream: one prompt with n = 1 per streamed request", "stream")
        stream = PrimedStream(retaining(run_request(state.engine, state.metrics, prompts[0], params[0], rid=rids[0],
                                                    cache_salt=salts[0], stream=True, lora=loras[0]),
                                        state.engine, keeps[0], salts[0], loras[0]))
        await stream.prime()
        return StreamingResponse(sse(_events(state, stream, with_text, params[0].return_logprob)),
                                 media_type="text/event-stream")
    state.log_request("generate", body.text or body.input_ids)
    groups = await asyncio.gather(*(
        collect(state.engine, state.metrics, ids, p, rid=rids[i], cache_salt=salts[i], lora=loras[i])
        for i, (ids, p) in enumerate(zip(prompts, params))))
    for keep, salt, lora in zip(keeps, salts, loras):
        retain(state.engine, keep, salt, lora)
    outs = [_response(state, o, with_text, p.return_logprob) for group, p in zip(groups, params) for o in group]
    single = isinstance(body.text, str) or (body.input_ids and isinstance(body.input_ids[0], int))
    return json_response(outs[0] if single and len(outs) == 1 else outs)


def _retains(body: GenerateRequest, prompts: list[list[int]]) -> list[list[Retain]]:
    """Per prompt, what it asks to retain: the whole prompt, with retention_seconds."""
    seconds = _each(body.retention_seconds, len(prompts), "retention_seconds")
    priorities = _each(body.priority, len(prompts), "priority")
    out = []
    for ids, ttl, priority in zip(prompts, seconds, priorities):
        ttl_s = retention_seconds(ttl)
        out.append([Retain(ids, ttl_s, retention_priority(priority))] if ttl_s is not None else [])
    return out


async def _events(state: ServerState, stream: AsyncIterator[Output], with_text: bool,
                  logprobs: bool) -> AsyncIterator[bytes]:
    async for out in stream:
        if out.error:
            raise APIError(500, out.error)
        yield msgspec.json.encode(_response(state, out, with_text, logprobs))


async def flush_cache(request: Request) -> Response:
    state: ServerState = request.app.state.radix
    flushed = await asyncio.get_running_loop().run_in_executor(None, state.engine.flush_cache)
    message = "Cache flushed." if flushed else "Requests are running: only unused cache entries were dropped."
    return json_response({"success": flushed, "message": message})


async def abort_request(request: Request) -> Response:
    state: ServerState = request.app.state.radix
    body = decode_body(await state.read_body(request), AbortRequest)
    state.engine.abort(body.rid)
    return json_response({"success": True})


async def get_model_info(request: Request) -> Response:
    state: ServerState = request.app.state.radix
    engine = state.engine
    return json_response({
        "model_path": str(engine.model_path),
        "served_model_name": state.served_model_name,
        "architectures": list(getattr(engine.model_config, "architectures", []) or []),
        "context_length": engine.context_len,
        "vocab_size": engine.info.vocab_size,
        "dtype": engine.info.dtype,
        "is_generation": True,
        # SGLang's get_model_info fields (its RuntimeEndpoint reads model_path).
        "tokenizer_path": str(engine.model_path),
        "model_type": getattr(engine.model_config, "model_type", None),
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        # What a client-side interpreter (frontend_lang.RuntimeEndpoint) needs to render chat turns.
        "chat_template": engine.tokenizer.chat_template,
        "bos_token": engine.tokenizer.bos_token,
        "eos_token": engine.tokenizer.eos_token,
        "chat_stop_strings": engine.tokenizer.chat_stop_strings,
    })


class TokenizeRequest(msgspec.Struct, forbid_unknown_fields=True):
    text: str


async def tokenize(request: Request) -> Response:
    state: ServerState = request.app.state.radix
    body = decode_body(await state.read_body(request), TokenizeRequest)
    try:
        tokens = state.engine.encode(body.text)
    except ValueError as exc:
        raise bad_request(exc) from exc
    return json_response({"tokens": tokens, "count": len(tokens)})


async def get_server_info(request: Request) -> Response:
    state: ServerState = request.app.state.radix
    settings = {k: v for k, v in vars(state.settings).items() if k != "api_key"}
    engine = state.engine
    resolved = {**engine.info.as_dict(), "served_model_name": state.served_model_name}
    return json_response({**state.engine_args, **settings, **resolved, **state.parser_info, "stats": engine.stats(),
                          "version": "0.1.0"})


HEALTH_GENERATE_TIMEOUT_S = 20.0


async def health_generate(request: Request) -> Response:
    """Healthy only if one token comes out of the engine now (SGLang's deeper health check)."""
    state: ServerState = request.app.state.radix
    params = SamplingParams(max_new_tokens=1, temperature=0.0)
    try:
        await asyncio.wait_for(collect(state.engine, state.metrics, [0], params, rid=f"health-{uuid.uuid4().hex}"),
                               HEALTH_GENERATE_TIMEOUT_S)
    except (APIError, asyncio.TimeoutError) as exc:
        logger.warning("health_generate failed: %r", exc)
        return json_response(HealthStatus("unhealthy"), status=503)
    return json_response(HealthStatus("ok"))


async def health(request: Request) -> Response:
    state: ServerState = request.app.state.radix
    if state.engine.healthy:
        return json_response(HealthStatus("ok"))
    return json_response(HealthStatus("unhealthy"), status=503)

