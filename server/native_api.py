"""Native routes in SGLang's shape: /generate, /flush_cache, /abort_request, /get_model_info,
/get_server_info and /health."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from runtime import Output, SamplingParams
from server.engine_client import PrimedStream, collect, run_request
from server.errors import APIError, bad_request
from server.openai_api import json_response, sse
from server.protocol import AbortRequest, FinishReason, GenerateRequest, GenerateResponse, HealthStatus, MetaInfo
from server.state import ServerState, decode_body


def _params(raw: dict[str, object] | None, body: GenerateRequest) -> SamplingParams:
    values = dict(raw or {})
    values.setdefault("return_logprob", body.return_logprob)
    values.setdefault("logprob_start_len", body.logprob_start_len)
    values.setdefault("top_logprobs_num", body.top_logprobs_num)
    try:
        return SamplingParams.from_dict(values)
    except (ValueError, TypeError) as exc:
        raise bad_request(ValueError(f"sampling_params.{exc}" if not str(exc).startswith("unknown")
                                     else f"sampling_params: {exc}")) from exc


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


def _meta(state: ServerState, out: Output) -> MetaInfo:
    reason = None
    if out.finish_reason is not None:
        reason = FinishReason(type=out.finish_reason, matched=out.matched_stop,
                              length=out.completion_tokens if out.finish_reason == "length" else None,
                              message=out.error)
    meta = MetaInfo(id=out.rid, prompt_tokens=out.prompt_tokens, completion_tokens=out.completion_tokens,
                    cached_tokens=out.cached_tokens, finish_reason=reason)
    lp = out.logprobs
    if lp is not None:
        text = state.token_text
        meta.output_token_logprobs = [(v, t, text(t)) for v, t in lp.output_token_logprobs]
        meta.input_token_logprobs = [(v, t, text(t)) for v, t in lp.input_token_logprobs]
        meta.output_top_logprobs = [[(v, t, text(t)) for v, t in top] for top in lp.output_top_logprobs]
        meta.input_top_logprobs = [[(v, t, text(t)) for v, t in top] if top else None
                                   for top in lp.input_top_logprobs]
    return meta


def _response(state: ServerState, out: Output) -> GenerateResponse:
    return GenerateResponse(text=out.text, output_ids=out.token_ids, meta_info=_meta(state, out))


async def generate(request: Request) -> Response:
    state: ServerState = request.app.state.radix
    body = decode_body(await state.read_body(request), GenerateRequest)
    for name in ("return_hidden_states", "return_entropy", "return_bytes", "background"):
        if getattr(body, name):
            raise APIError(400, f"{name} is not supported", name)
    prompts = _batch(body, state)
    raw = body.sampling_params
    raws = raw if isinstance(raw, list) else [raw] * len(prompts)
    if len(raws) != len(prompts):
        raise APIError(400, "sampling_params: one per prompt, or one for all", "sampling_params")
    params = [_params(r, body) for r in raws]
    rids = body.rid if isinstance(body.rid, list) else [body.rid] * len(prompts) if body.rid else None
    if rids is not None and len(rids) != len(prompts):
        raise APIError(400, "rid: one per prompt", "rid")
    if body.stream:
        if len(prompts) != 1 or params[0].n != 1:
            raise APIError(400, "stream: one prompt with n = 1 per streamed request", "stream")
        stream = PrimedStream(run_request(state.engine, state.metrics, prompts[0], params[0],
                                     rid=rids[0] if rids else None, cache_salt=body.cache_salt, stream=True))
        await stream.prime()
        return StreamingResponse(sse(_events(state, stream)), media_type="text/event-stream")
    state.log_request("generate", body.text or body.input_ids)
    groups = await asyncio.gather(*(
        collect(state.engine, state.metrics, ids, p, rid=rids[i] if rids else None, cache_salt=body.cache_salt)
        for i, (ids, p) in enumerate(zip(prompts, params))))
    outs = [_response(state, o) for group in groups for o in group]
    single = isinstance(body.text, str) or (body.input_ids and isinstance(body.input_ids[0], int))
    return json_response(outs[0] if single and len(outs) == 1 else outs)


async def _events(state: ServerState, stream: AsyncIterator[Output]) -> AsyncIterator[bytes]:
    async for out in stream:
        if out.error:
            raise APIError(500, out.error)
        yield msgspec.json.encode(_response(state, out))


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
        "vocab_size": engine.runner.vocab_size,
        "dtype": str(engine.runner.dtype).removeprefix("torch."),
        "is_generation": True,
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
    resolved = {"model_path": str(engine.model_path), "served_model_name": state.served_model_name,
                "device": str(engine.device), "dtype": str(engine.runner.dtype).removeprefix("torch."),
                "kv_cache_tokens": engine.runner.num_slots, "context_length": engine.context_len,
                "attention_backend": engine.runner.backend.name,
                "cuda_graph_batch_sizes": engine.runner.graphs.sizes if engine.runner.graphs else [],
                "overlap_schedule_on": engine.loop.overlap, "dtype_choice": engine.runner.precision.reason}
    return json_response({**state.engine_args, **settings, **resolved, "stats": engine.stats(), "version": "0.1.0"})


async def health(request: Request) -> Response:
    state: ServerState = request.app.state.radix
    if state.engine.healthy:
        return json_response(HealthStatus("ok"))
    return json_response(HealthStatus("unhealthy"), status=503)

