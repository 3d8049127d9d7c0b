"""OpenAI-compatible routes: /v1/completions, /v1/chat/completions (both streaming), /v1/models and
/v1/models/{model}."""

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
from server.openai.fields import COMPLETION_REFUSED
from server.openai.protocol import (
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    ChatDeltaChoice,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
    PromptTokensDetails,
    Usage,
)
from server.openai.logprobs import LogprobCursor, chat_logprobs, completion_logprobs, entries
from server.openai.stops import asked_stops, stop_fields
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
from server.pipeline.fields import refuse_set
from server.pipeline.request import ChatCompletionRequest, DeltaMessage
from server.pipeline.structured import constraint_for

MAX_COMPLETION_LOGPROBS = 5


# -- shared -------------------------------------------------------------------------------------------


def usage(outs: Sequence[Output], prompts: Sequence[tuple[int, int]]) -> Usage:
    prompt_tokens = sum(p for p, _ in prompts)
    completion = sum(o.completion_tokens for o in outs)
    cached = sum(c for _, c in prompts)
    return Usage(prompt_tokens, completion, prompt_tokens + completion, PromptTokensDetails(cached))


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


def _card(state: ServerState) -> ModelCard:
    return ModelCard(id=state.served_model_name, created=state.started, max_model_len=state.engine.context_len)


def _adapter_cards(state: ServerState) -> list[ModelCard]:
    """The loaded LoRA adapters, each a model whose `parent` is the base (as vLLM lists them)."""
    lora = state.engine.lora
    return [msgspec.structs.replace(_card(state), id=a.name, root=a.path, parent=state.served_model_name)
            for a in (lora.describe() if lora is not None else [])]


async def list_models(request: Request) -> Response:
    state: ServerState = request.app.state.radix
    return json_response(ModelList(data=[_card(state), *_adapter_cards(state)]))


async def retrieve_model(request: Request) -> Response:
    """GET /v1/models/{model} (the openai SDK's models.retrieve): the card, under any served name."""
    state: ServerState = request.app.state.radix
    name = request.path_params["model"]
    adapter = next((card for card in _adapter_cards(state) if card.id == name), None)
    if adapter is not None:
        return json_response(adapter)
    if name not in state.model_names:
        raise APIError(404, f"The model {name!r} does not exist; available: {state.served_model_name!r}", "model")
    return json_response(msgspec.structs.replace(_card(state), id=name))


def _reported(state: ServerState, body: object) -> str:
    """The `model` a response names: the LoRA adapter the request ran through (as vLLM answers), else
    the served name. (The route has already checked that a name other than the base's is an adapter.)"""
    lora_path, model = getattr(body, "lora_path", None), getattr(body, "model", None)
    if isinstance(lora_path, str) and lora_path:
        return lora_path
    return model if model is not None and model not in state.model_names else state.served_model_name


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


def _check_completion(body: CompletionRequest) -> int:
    """Refuse what we do not do (naming the field); the number of samples to draw per prompt."""
    refuse_set(body, COMPLETION_REFUSED)
    if body.logprobs is not None and not 0 <= body.logprobs <= MAX_COMPLETION_LOGPROBS:
        raise APIError(400, f"logprobs must be in [0, {MAX_COMPLETION_LOGPROBS}]", "logprobs")
    best_of = body.n if body.best_of is None else body.best_of
    if best_of < body.n:
        raise APIError(400, f"best_of must be >= n ({body.n}), got {best_of}", "best_of")
    if best_of > body.n and body.stream:
        raise APIError(400, "best_of cannot be streamed (the best samples are known only at the end)", "best_of")
    return best_of


async def completions(request: Request) -> Response:
    state: ServerState = request.app.state.radix
    body = decode_body(await state.read_body(request), CompletionRequest)
    lora = state.adapter_for(body.model, body.lora_path)
    best_of = _check_completion(body)
    engine = state.engine
    try:
        given = prompt_list(body.prompt)
        prompts = [engine.encode(p) if isinstance(p, str) else list(p) for p in given]
    except ValueError as exc:
        raise bad_request(ValueError(f"prompt: {exc}")) from exc
    if body.echo:  # echo decodes the ids before they are submitted (and checked there): check them first
        try:
            for ids in prompts:
                engine.check_token_ids(ids)
        except ValueError as exc:
            raise bad_request(exc) from exc  # param "input_ids", as the engine's own check says
    # echo with logprobs scores the prompt itself (how evaluation harnesses score choices): logprobs
    # of every prompt position, so the cached prefix is recomputed up to its first token.
    overrides: dict[str, object] = {"logprob_start_len": 0} if body.echo and body.logprobs is not None else {}
    if best_of > body.n:
        overrides["n"] = best_of  # ranked by their summed logprobs: asked for even when not returned
    top = body.logprobs if body.logprobs is not None else (0 if best_of > body.n else None)
    params = sampling_params(body, default_max=16, top_logprobs=top, constraint=constraint_for(body),
                             overrides=overrides, min_tokens=0 if body.echo else 1)
    for ids in prompts:
        check_context(state, len(ids), body)
    echoes = [_echo_text(state, p, ids) if body.echo else "" for p, ids in zip(given, prompts)]
    rid = f"cmpl-{uuid.uuid4().hex}"
    state.log_request(rid, body.prompt)
    # SGLang's `rid`: the engine's request id, so /abort_request can stop it (prompt i of several: rid.p<i>).
    rids = [body.rid if body.rid is None or len(prompts) == 1 else f"{body.rid}.p{i}" for i in range(len(prompts))]
    if body.stream:
        streams = [run_request(engine, state.metrics, ids, params, rid=r, cache_salt=body.cache_salt, stream=True,
                               lora=lora) for ids, r in zip(prompts, rids)]
        streams = [PrimedStream(s) for s in streams]
        for stream in streams:  # submit now: bad input is a plain 400, not an error inside the event stream
            await stream.prime()
        return StreamingResponse(sse(_completion_events(state, rid, body, echoes, streams)),
                                 media_type="text/event-stream")
    results = await asyncio.gather(*(collect(engine, state.metrics, ids, params, rid=r, cache_salt=body.cache_salt,
                                             lora=lora) for ids, r in zip(prompts, rids)))
    asked = asked_stops(body)
    choices, outs, prompt_usage = [], [], []
    for p, group in enumerate(results):
        prompt_usage.append((group[0].prompt_tokens, group[0].cached_tokens))
        outs.extend(group)  # usage counts every sample drawn, best_of's unreturned ones too (as OpenAI)
        for i, out in enumerate(_best(group, body.n)):
            matched, reason = stop_fields(out, asked)
            choices.append(CompletionChoice(
                index=p * body.n + i, text=echoes[p] + out.text, finish_reason=out.finish_reason,
                logprobs=completion_logprobs(state, entries(out, body.echo)) if body.logprobs is not None else None,
                matched_stop=matched, stop_reason=reason))
    state.log_response(rid, [c.text for c in choices])
    return json_response(CompletionResponse(id=rid, created=int(time.time()), model=_reported(state, body),
                                            choices=choices, usage=usage(outs, prompt_usage)))


def _echo_text(state: ServerState, given: str | list[int], ids: list[int]) -> str:
    """The prompt as echoed: the text as sent, or token ids decoded."""
    return given if isinstance(given, str) else state.engine.tokenizer.decode(ids, skip_special_tokens=True)


def _best(group: list[Output], n: int) -> list[Output]:
    """best_of: the n samples with the highest summed logprob (all of them when best_of is n)."""
    if len(group) <= n:
        return group

    def score(out: Output) -> float:
        lp = out.logprobs
        return sum(v for v, _ in lp.output_token_logprobs) if lp is not None else float("-inf")

    return sorted(group, key=score, reverse=True)[:n]


async def _completion_events(state: ServerState, rid: str, body: CompletionRequest, echoes: list[str],
                             streams: list[AsyncIterator[Output]]) -> AsyncIterator[bytes]:
    created = int(time.time())
    finals: list[Output] = []
    prompt_usage: dict[int, tuple[int, int]] = {}
    cursors: dict[int, LogprobCursor] = {}
    asked = asked_stops(body)
    async for p, out in merged(streams):
        if out.error:
            raise APIError(500, out.error)
        prompt_usage[p] = (out.prompt_tokens, out.cached_tokens)
        if out.finished:
            finals.append(out)
        index = p * body.n + out.index
        text = out.delta_text
        if index not in cursors:  # the choice's first chunk: the echoed prompt leads it
            cursors[index] = LogprobCursor()
            text = echoes[p] + text
        logprobs = cursors[index].take(state, out, body.echo) if body.logprobs is not None else None
        if not text and not out.finished and not (logprobs is not None and logprobs.tokens):
            continue
        matched, reason = stop_fields(out, asked)
        choice = CompletionChoice(index=index, text=text, finish_reason=out.finish_reason, logprobs=logprobs,
                                  matched_stop=matched, stop_reason=reason)
        yield msgspec.json.encode(CompletionResponse(id=rid, created=created, model=_reported(state, body),
                                                     choices=[choice]))
    if body.stream_options is not None and body.stream_options.include_usage:
        yield msgspec.json.encode(CompletionResponse(id=rid, created=created, model=_reported(state, body),
                                                     choices=[], usage=usage(finals, list(prompt_usage.values()))))


# -- /v1/chat/completions -------------------------------------------------------------------------------


async def chat_completions(request: Request) -> Response:
    state: ServerState = request.app.state.radix
    body = decode_body(await state.read_body(request), ChatCompletionRequest)
    lora = state.adapter_for(body.model, body.lora_path)
    if body.top_logprobs is not None and not 0 <= body.top_logprobs <= 20:
        raise APIError(400, "top_logprobs must be in [0, 20]", "top_logprobs")
    plan = plan_chat(state, body, top_logprobs=(body.top_logprobs or 0) if body.logprobs else None)
    plan.lora = lora
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    state.log_request(rid, body.messages)
    if body.stream:
        stream = await stream_chat(state, plan)
        return StreamingResponse(sse(_chat_events(state, rid, body, stream, plan)), media_type="text/event-stream")
    outs = await run_chat(state, plan)
    choices = []
    asked = asked_stops(body)
    for o in outs:
        message, finish = final_message(plan, o)
        matched, reason = stop_fields(o, asked)
        choices.append(ChatChoice(index=o.index, message=message, finish_reason=finish,
                                  logprobs=chat_logprobs(state, o) if body.logprobs else None,
                                  matched_stop=matched, stop_reason=reason))
    state.log_response(rid, [o.text for o in outs])
    return json_response(ChatCompletionResponse(id=rid, created=int(time.time()), model=_reported(state, body),
                                                choices=choices,
                                                usage=usage(outs, [(outs[0].prompt_tokens, outs[0].cached_tokens)])))


async def _chat_events(state: ServerState, rid: str, body: ChatCompletionRequest,
                       stream: AsyncIterator[Output], plan: ChatPlan) -> AsyncIterator[bytes]:
    created = int(time.time())
    model = _reported(state, body)
    choices: dict[int, ChoiceStream] = {}
    finals: list[Output] = []
    asked = asked_stops(body)

    def chunk(index: int, delta: DeltaMessage, final: Output | None = None) -> bytes:
        choice = ChatDeltaChoice(index=index, delta=ChatDelta.of(delta))
        if final is not None:
            choice.finish_reason = choices[index].finish_reason(final)
            choice.matched_stop, choice.stop_reason = stop_fields(final, asked)
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
            yield chunk(out.index, DeltaMessage(), out)
    if body.stream_options is not None and body.stream_options.include_usage and finals:
        u = usage(finals, [(finals[0].prompt_tokens, finals[0].cached_tokens)])
        yield msgspec.json.encode(ChatCompletionChunk(id=rid, created=created, model=model, choices=[], usage=u))
