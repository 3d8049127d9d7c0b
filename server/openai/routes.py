"""OpenAI-compatible routes: /v1/completions, /v1/chat/completions (both streaming) and /v1/models."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Sequence

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from runtime import Output
from server.common.errors import APIError, bad_request
from server.common.state import ServerState, decode_body
from server.common.wire import json_response, sse
from server.openai.protocol import (
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDeltaChoice,
    ChoiceLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
    PromptTokensDetails,
    TokenLogprobEntry,
    TopLogprob,
    Usage,
)
from server.pipeline.chat import (
    ChatPlan,
    ChoiceStream,
    check_context,
    final_message,
    plan_chat,
    run_chat,
    sampling_params,
    stream_chat,
)
from server.pipeline.engine_client import PrimedStream, collect, run_request
from server.pipeline.request import ChatCompletionRequest, DeltaMessage
from server.pipeline.structured import constraint_for

MAX_COMPLETION_LOGPROBS = 5


# -- shared -------------------------------------------------------------------------------------------


def usage(outs: Sequence[Output], prompts: Sequence[tuple[int, int]]) -> Usage:
    prompt_tokens = sum(p for p, _ in prompts)
    completion = sum(o.completion_tokens for o in outs)
    cached = sum(c for _, c in prompts)
    return Usage(prompt_tokens, completion, prompt_tokens + completion, PromptTokensDetails(cached))


def check_model(state: ServerState, model: str | None) -> None:
    if model is not None and model not in state.model_names:
        raise APIError(400, f"model {model!r} is not served here; available: {state.served_model_name!r}", "model")


async def merged(streams: list[AsyncIterator[Output]]) -> AsyncIterator[tuple[int, Output]]:
    """Interleave several prompts' output streams; yields (prompt index, output)."""
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
        return
    queue: asyncio.Queue[tuple[int, Output] | tuple[int, BaseException] | None] = asyncio.Queue()

    async def pump(i: int, stream: AsyncIterator[Output]) -> None:
        try:
            async for out in stream:
                await queue.put((i, out))
        except BaseException as exc:  # noqa: BLE001 - forwarded to the consumer
            await queue.put((i, exc))
        finally:
            await queue.put(None)

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        done = 0
        while done < len(tasks):
            item = await queue.get()
            if item is None:
                done += 1
            elif isinstance(item[1], BaseException):
                raise item[1]
            else:
                yield item  # type: ignore[misc]
    finally:
        for task in tasks:
            task.cancel()


# -- /v1/models -----------------------------------------------------------------------------------------


async def list_models(request: Request) -> Response:
    state: ServerState = request.app.state.radix
    card = ModelCard(id=state.served_model_name, created=state.started, max_model_len=state.engine.context_len)
    return json_response(ModelList(data=[card]))


# -- /v1/completions ------------------------------------------------------------------------------------


def prompt_list(prompt: str | list) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise APIError(400, "prompt must not be empty", "prompt")
    if all(isinstance(p, int) for p in prompt):
        return [prompt]
    if any(isinstance(p, int) for p in prompt):
        raise APIError(400, "prompt: mix of token ids and texts; send token ids or a list of prompts", "prompt")
    return list(prompt)


async def completions(request: Request) -> Response:
    state: ServerState = request.app.state.radix
    body = decode_body(await state.read_body(request), CompletionRequest)
    check_model(state, body.model)
    if body.echo or body.suffix is not None or (body.best_of or 1) > 1:
        raise APIError(400, "echo, suffix and best_of are not supported", "echo")
    if body.logprobs is not None and not 0 <= body.logprobs <= MAX_COMPLETION_LOGPROBS:
        raise APIError(400, f"logprobs must be in [0, {MAX_COMPLETION_LOGPROBS}]", "logprobs")
    engine = state.engine
    try:
        prompts = [engine.encode(p) if isinstance(p, str) else list(p) for p in prompt_list(body.prompt)]
    except ValueError as exc:
        raise bad_request(ValueError(f"prompt: {exc}")) from exc
    params = sampling_params(body, default_max=16, top_logprobs=body.logprobs, constraint=constraint_for(body))
    for ids in prompts:
        check_context(state, len(ids), body)
    rid = f"cmpl-{uuid.uuid4().hex}"
    state.log_request(rid, body.prompt)
    # SGLang's `rid`: the engine's request id, so /abort_request can stop it (prompt i of several: rid.p<i>).
    rids = [body.rid if body.rid is None or len(prompts) == 1 else f"{body.rid}.p{i}" for i in range(len(prompts))]
    if body.stream:
        streams = [run_request(engine, state.metrics, ids, params, rid=r, cache_salt=body.cache_salt, stream=True)
                   for ids, r in zip(prompts, rids)]
        streams = [PrimedStream(s) for s in streams]
        for stream in streams:  # submit now: bad input is a plain 400, not an error inside the event stream
            await stream.prime()
        return StreamingResponse(sse(_completion_events(state, rid, body, params.n, streams)),
                                 media_type="text/event-stream")
    results = await asyncio.gather(*(collect(engine, state.metrics, ids, params, rid=r, cache_salt=body.cache_salt)
                                     for ids, r in zip(prompts, rids)))
    choices, outs, prompt_usage = [], [], []
    for p, group in enumerate(results):
        prompt_usage.append((group[0].prompt_tokens, group[0].cached_tokens))
        for out in group:
            outs.append(out)
            choices.append(CompletionChoice(index=p * params.n + out.index, text=out.text,
                                            finish_reason=out.finish_reason,
                                            logprobs=_completion_logprobs(state, out) if body.logprobs is not None else None))
    state.log_response(rid, [c.text for c in choices])
    return json_response(CompletionResponse(id=rid, created=int(time.time()), model=state.served_model_name,
                                            choices=choices, usage=usage(outs, prompt_usage)))


async def _completion_events(state: ServerState, rid: str, body: CompletionRequest, n: int,
                             streams: list[AsyncIterator[Output]]) -> AsyncIterator[bytes]:
    created = int(time.time())
    finals: list[Output] = []
    prompt_usage: dict[int, tuple[int, int]] = {}
    async for p, out in merged(streams):
        if out.error:
            raise APIError(500, out.error)
        prompt_usage[p] = (out.prompt_tokens, out.cached_tokens)
        if out.finished:
            finals.append(out)
        if not out.delta_text and not out.finished:
            continue
        choice = CompletionChoice(index=p * n + out.index, text=out.delta_text, finish_reason=out.finish_reason)
        yield msgspec.json.encode(CompletionResponse(id=rid, created=created, model=state.served_model_name,
                                                     choices=[choice]))
    if body.stream_options is not None and body.stream_options.include_usage:
        yield msgspec.json.encode(CompletionResponse(id=rid, created=created, model=state.served_model_name,
                                                     choices=[], usage=usage(finals, list(prompt_usage.values()))))


def _completion_logprobs(state: ServerState, out: Output) -> CompletionLogprobs:
    lp = out.logprobs
    entries = lp.output_token_logprobs if lp else []
    tokens = [state.token_text(t) for _, t in entries]
    offsets, pos = [], 0
    for text in tokens:
        offsets.append(pos)
        pos += len(text)
    tops: list[dict[str, float] | None] = []
    for i in range(len(entries)):
        top = lp.output_top_logprobs[i] if lp and i < len(lp.output_top_logprobs) else []
        tops.append({state.token_text(t): v for v, t in top} if top else None)
    return CompletionLogprobs(tokens=tokens, token_logprobs=[v for v, _ in entries], top_logprobs=tops,
                              text_offset=offsets)


# -- /v1/chat/completions -------------------------------------------------------------------------------


async def chat_completions(request: Request) -> Response:
    state: ServerState = request.app.state.radix
    body = decode_body(await state.read_body(request), ChatCompletionRequest)
    check_model(state, body.model)
    if body.top_logprobs is not None and not 0 <= body.top_logprobs <= 20:
        raise APIError(400, "top_logprobs must be in [0, 20]", "top_logprobs")
    plan = plan_chat(state, body, top_logprobs=(body.top_logprobs or 0) if body.logprobs else None)
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    state.log_request(rid, body.messages)
    if body.stream:
        stream = await stream_chat(state, plan)
        return StreamingResponse(sse(_chat_events(state, rid, body, stream, plan)), media_type="text/event-stream")
    outs = await run_chat(state, plan)
    choices = []
    for o in outs:
        message, reason = final_message(plan, o)
        choices.append(ChatChoice(index=o.index, message=message, finish_reason=reason,
                                  logprobs=_chat_logprobs(state, o) if body.logprobs else None))
    state.log_response(rid, [o.text for o in outs])
    return json_response(ChatCompletionResponse(id=rid, created=int(time.time()), model=state.served_model_name,
                                                choices=choices,
                                                usage=usage(outs, [(outs[0].prompt_tokens, outs[0].cached_tokens)])))


async def _chat_events(state: ServerState, rid: str, body: ChatCompletionRequest,
                       stream: AsyncIterator[Output], plan: ChatPlan) -> AsyncIterator[bytes]:
    created = int(time.time())
    model = state.served_model_name
    choices: dict[int, ChoiceStream] = {}
    finals: list[Output] = []

    def chunk(index: int, delta: DeltaMessage, reason: str | None = None) -> bytes:
        choice = ChatDeltaChoice(index=index, delta=delta, finish_reason=reason)
        return msgspec.json.encode(ChatCompletionChunk(id=rid, created=created, model=model, choices=[choice]))

    async for out in stream:
        if out.error:
            raise APIError(500, out.error)
        if out.index not in choices:
            choices[out.index] = ChoiceStream(plan)
            yield chunk(out.index, DeltaMessage(role="assistant", content=""))
        parser = choices[out.index]
        for delta in parser.feed(out.delta_text, final=out.finished):
            yield chunk(out.index, delta)
        if out.finished:
            finals.append(out)
            yield chunk(out.index, DeltaMessage(), parser.finish_reason(out))
    if body.stream_options is not None and body.stream_options.include_usage and finals:
        u = usage(finals, [(finals[0].prompt_tokens, finals[0].cached_tokens)])
        yield msgspec.json.encode(ChatCompletionChunk(id=rid, created=created, model=model, choices=[], usage=u))


def _chat_logprobs(state: ServerState, out: Output) -> ChoiceLogprobs:
    lp = out.logprobs
    content = []
    for i, (value, token) in enumerate(lp.output_token_logprobs if lp else []):
        text = state.token_text(token)
        top = lp.output_top_logprobs[i] if lp and i < len(lp.output_top_logprobs) else []
        content.append(TokenLogprobEntry(token=text, logprob=value, bytes=list(text.encode()),
                                         top_logprobs=[TopLogprob(state.token_text(t), v,
                                                                  list(state.token_text(t).encode()))
                                                       for v, t in top]))
    return ChoiceLogprobs(content=content)
