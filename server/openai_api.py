"""OpenAI-compatible routes: /v1/completions, /v1/chat/completions (both streaming) and /v1/models."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from runtime import Output, SamplingParams
from server.engine_client import PrimedStream, collect, run_request
from server.errors import APIError, bad_request, error_json
from server.protocol import (AssistantMessage, ChatChoice, ChatCompletionChunk, ChatCompletionRequest,
                             ChatCompletionResponse, ChatDeltaChoice, ChoiceLogprobs, CompletionChoice, DeltaMessage,
                             DeltaToolCall,
                             CompletionLogprobs, CompletionRequest, CompletionResponse, ModelCard, ModelList,
                             PromptTokensDetails, SamplingFields, TokenLogprobEntry, TopLogprob, Usage)
from server.state import ServerState, decode_body
from server.structured import Constraint, chat_tools, constraint_for, tool_calls

KNOWN_ROLES = {"system", "developer", "user", "assistant", "tool"}
MAX_COMPLETION_LOGPROBS = 5


def json_response(obj: object, status: int = 200) -> Response:
    return Response(msgspec.json.encode(obj), status_code=status, media_type="application/json")


# -- shared -------------------------------------------------------------------------------------------


def sampling_params(req: SamplingFields, default_max: int, extra_stop: Sequence[str] = (),
                    top_logprobs: int | None = None, constraint: Constraint | None = None) -> SamplingParams:
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    values: dict[str, object] = {
        "max_new_tokens": default_max if max_tokens is None else max_tokens,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "top_k": -1 if req.top_k is None else req.top_k,
        "min_p": 0.0 if req.min_p is None else req.min_p,
        "frequency_penalty": req.frequency_penalty,
        "presence_penalty": req.presence_penalty,
        "repetition_penalty": 1.0 if req.repetition_penalty is None else req.repetition_penalty,
        "stop": stop + [s for s in extra_stop if s not in stop],
        "stop_token_ids": list(req.stop_token_ids or []),
        "ignore_eos": req.ignore_eos,
        "n": req.n,
        "seed": req.seed,
        "skip_special_tokens": req.skip_special_tokens,
        "return_logprob": top_logprobs is not None,
        "top_logprobs_num": top_logprobs or 0,
        **(constraint.params if constraint is not None else {}),
    }
    try:
        params = SamplingParams.from_dict(values)
    except ValueError as exc:
        message = str(exc).replace("max_new_tokens", "max_tokens", 1)
        raise bad_request(ValueError(message)) from exc
    if max_tokens is not None and max_tokens < 1:
        raise APIError(400, f"max_tokens must be >= 1, got {max_tokens}", "max_tokens")
    return params


def check_context(state: ServerState, prompt_len: int, body: SamplingFields) -> None:
    """As OpenAI and vLLM do: an explicit max_tokens that cannot fit is an error, not a silent cut."""
    asked = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    room = state.engine.context_len - prompt_len
    if asked is not None and asked > room:
        raise APIError(400, f"max_tokens: {asked} tokens requested but this model's context length is "
                            f"{state.engine.context_len} and the prompt has {prompt_len} tokens", "max_tokens")


def usage(outs: Sequence[Output], prompts: Sequence[tuple[int, int]]) -> Usage:
    prompt_tokens = sum(p for p, _ in prompts)
    completion = sum(o.completion_tokens for o in outs)
    cached = sum(c for _, c in prompts)
    return Usage(prompt_tokens, completion, prompt_tokens + completion, PromptTokensDetails(cached))


def finish_reason(out: Output) -> str | None:
    if out.finish_reason == "abort":
        return "abort"
    return out.finish_reason


def check_model(state: ServerState, model: str | None) -> None:
    if model is not None and model not in state.model_names:
        raise APIError(400, f"model {model!r} is not served here; available: {state.served_model_name!r}", "model")


async def sse(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    try:
        async for event in events:
            yield b"data: " + event + b"\n\n"
    except APIError as exc:
        yield b"data: " + error_json(exc.status, exc.message, exc.param) + b"\n\n"
    yield b"data: [DONE]\n\n"


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
    if body.stream:
        streams = [run_request(engine, state.metrics, ids, params, cache_salt=body.cache_salt, stream=True)
                   for ids in prompts]
        streams = [PrimedStream(s) for s in streams]
        for stream in streams:  # submit now: bad input is a plain 400, not an error inside the event stream
            await stream.prime()
        return StreamingResponse(sse(_completion_events(state, rid, body, params.n, streams)),
                                 media_type="text/event-stream")
    results = await asyncio.gather(*(collect(engine, state.metrics, ids, params, cache_salt=body.cache_salt)
                                     for ids in prompts))
    choices, outs, prompt_usage = [], [], []
    for p, group in enumerate(results):
        prompt_usage.append((group[0].prompt_tokens, group[0].cached_tokens))
        for out in group:
            outs.append(out)
            choices.append(CompletionChoice(index=p * params.n + out.index, text=out.text,
                                            finish_reason=finish_reason(out),
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
        choice = CompletionChoice(index=p * n + out.index, text=out.delta_text, finish_reason=finish_reason(out))
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


def chat_messages(body: ChatCompletionRequest) -> list[dict[str, object]]:
    if not body.messages:
        raise APIError(400, "messages must not be empty", "messages")
    messages = []
    for i, message in enumerate(body.messages):
        if message.role not in KNOWN_ROLES:
            raise APIError(400, f"messages[{i}].role: unknown role {message.role!r}; use one of "
                                f"{sorted(KNOWN_ROLES)}", f"messages[{i}].role")
        content = message.content
        if message.tool_calls and message.role != "assistant":
            raise APIError(400, f"messages[{i}].tool_calls: only assistant messages call tools",
                           f"messages[{i}].tool_calls")
        if isinstance(content, list):
            parts = []
            for part in content:
                if part.type != "text" or part.text is None:
                    raise APIError(400, f"messages[{i}].content: only text parts are supported", f"messages[{i}].content")
                parts.append(part.text)
            content = "".join(parts)
        entry: dict[str, object] = {"role": "system" if message.role == "developer" else message.role}
        if message.tool_calls:
            calls = [{"type": "function", "id": c.id,
                      "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments, i)}}
                     for c in message.tool_calls]
            entry["tool_calls"] = calls
            # Templates that do not render tool calls still show the model what was called.
            content = content if content is not None else json.dumps([c["function"] for c in calls])
        if message.tool_call_id is not None:
            entry["tool_call_id"] = message.tool_call_id
        if content is None:
            raise APIError(400, f"messages[{i}].content is required", f"messages[{i}].content")
        entry["content"] = content
        messages.append(entry)
    return messages


def _arguments(text: str, i: int) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise APIError(400, f"messages[{i}].tool_calls: arguments must be JSON text", f"messages[{i}].tool_calls") \
            from exc


async def chat_completions(request: Request) -> Response:
    state: ServerState = request.app.state.radix
    body = decode_body(await state.read_body(request), ChatCompletionRequest)
    check_model(state, body.model)
    engine = state.engine
    constraint = constraint_for(body)
    try:
        ids = engine.tokenizer.encode_chat(chat_messages(body), body.add_generation_prompt, chat_tools(body))
    except ValueError as exc:
        raise bad_request(exc) from exc
    if body.top_logprobs is not None and not 0 <= body.top_logprobs <= 20:
        raise APIError(400, "top_logprobs must be in [0, 20]", "top_logprobs")
    top = (body.top_logprobs or 0) if body.logprobs else None
    params = sampling_params(body, default_max=max(engine.context_len - len(ids), 1),
                             extra_stop=engine.tokenizer.chat_stop_strings, top_logprobs=top, constraint=constraint)
    check_context(state, len(ids), body)
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    state.log_request(rid, body.messages)
    if body.stream:
        stream = PrimedStream(run_request(engine, state.metrics, ids, params, cache_salt=body.cache_salt, stream=True))
        await stream.prime()
        return StreamingResponse(sse(_chat_events(state, rid, body, stream, constraint)),
                                 media_type="text/event-stream")
    outs = await collect(engine, state.metrics, ids, params, cache_salt=body.cache_salt)
    choices = []
    for o in outs:
        message, reason = _chat_message(constraint, o)
        choices.append(ChatChoice(index=o.index, message=message, finish_reason=reason,
                                  logprobs=_chat_logprobs(state, o) if body.logprobs else None))
    state.log_response(rid, [o.text for o in outs])
    return json_response(ChatCompletionResponse(id=rid, created=int(time.time()), model=state.served_model_name,
                                                choices=choices,
                                                usage=usage(outs, [(outs[0].prompt_tokens, outs[0].cached_tokens)])))


def _chat_message(constraint: Constraint, out: Output) -> tuple[AssistantMessage, str | None]:
    """The assistant message of a finished output: text, or the tool call a tool constraint produced."""
    if constraint.tool is not None and out.finish_reason == "stop":
        calls = tool_calls(constraint, out.text)
        if calls is not None:
            return AssistantMessage(content=None, tool_calls=calls), "tool_calls"
    return AssistantMessage(content=out.text), finish_reason(out)


async def _chat_events(state: ServerState, rid: str, body: ChatCompletionRequest,
                       stream: AsyncIterator[Output], constraint: Constraint) -> AsyncIterator[bytes]:
    created = int(time.time())
    model = state.served_model_name
    started: set[int] = set()
    finals: list[Output] = []
    async for out in stream:
        if out.error:
            raise APIError(500, out.error)
        if out.index not in started:
            started.add(out.index)
            first = ChatDeltaChoice(index=out.index, delta=DeltaMessage(role="assistant", content=""))
            yield msgspec.json.encode(ChatCompletionChunk(id=rid, created=created, model=model, choices=[first]))
        if out.finished:
            finals.append(out)
        if constraint.tool is not None:  # a tool call is sent whole, once its JSON is complete
            if not out.finished:
                continue
            message, reason = _chat_message(constraint, out)
            calls = [DeltaToolCall(index=j, id=c.id, function=c.function) for j, c in enumerate(message.tool_calls or [])]
            delta = DeltaMessage(tool_calls=calls) if calls else DeltaMessage(content=out.text)
            choice = ChatDeltaChoice(index=out.index, delta=delta, finish_reason=reason)
            yield msgspec.json.encode(ChatCompletionChunk(id=rid, created=created, model=model, choices=[choice]))
            continue
        if not out.delta_text and not out.finished:
            continue
        delta = DeltaMessage(content=out.delta_text) if out.delta_text else DeltaMessage()
        choice = ChatDeltaChoice(index=out.index, delta=delta, finish_reason=finish_reason(out))
        yield msgspec.json.encode(ChatCompletionChunk(id=rid, created=created, model=model, choices=[choice]))
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
