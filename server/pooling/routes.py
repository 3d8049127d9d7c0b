"""Pooling routes: /v1/embeddings (OpenAI), /v1/rerank (Cohere/Jina), /v1/score (vLLM).

All three run on the model that generates, through the same engine and radix cache: an
embedding is the final hidden state of its text (runtime/sampling/pooling.py), a rerank score the
reranker's yes/no judgement (server/pooling/rerank.py). A request's prompts are submitted together,
so prompts sharing a prefix (a rerank's instruction and query, an embedding's task prefix) compute
it once.
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from collections.abc import Sequence

import torch
from starlette.requests import Request
from starlette.responses import Response

from runtime import Output, PoolingParams, SamplingParams
from server.common.errors import APIError, bad_request
from server.common.state import ServerState, decode_body
from server.common.wire import json_response
from server.pipeline.engine_client import collect
from server.pooling.protocol import (
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
    PoolingUsage,
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RerankResult,
    ScoreData,
    ScoreRequest,
    ScoreResponse,
)
from server.pooling.rerank import relevance

MAX_INPUTS = 2048  # prompts in one request (OpenAI's limit for embeddings)
NO_TOKENS = SamplingParams(max_new_tokens=0)


async def pooled(state: ServerState, prompts: Sequence[str | list[int]], pooling: PoolingParams, field: str,
                 cache_salt: str | None) -> list[Output]:
    """Run every prompt as a pooling request, all at once; their finished Outputs in order."""
    if not prompts:
        raise APIError(400, f"{field} must not be empty", field)
    if len(prompts) > MAX_INPUTS:
        raise APIError(400, f"{field}: at most {MAX_INPUTS} inputs per request, got {len(prompts)}", field)
    engine = state.engine
    try:
        encoded = [engine.encode(p) if isinstance(p, str) else list(p) for p in prompts]
    except ValueError as exc:
        raise bad_request(ValueError(f"{field}: {exc}")) from exc
    for ids in encoded:
        if len(ids) >= engine.context_len:
            raise APIError(400, f"{field}: an input has {len(ids)} tokens; this model's context length is "
                           f"{engine.context_len}", field)
    runs = [collect(engine, state.metrics, ids, NO_TOKENS, cache_salt=cache_salt, pooling=pooling) for ids in encoded]
    try:
        return [outs[0] for outs in await asyncio.gather(*runs)]
    except APIError as exc:
        if exc.param == "input_ids":  # a token id out of the vocabulary: name the field this route calls it
            raise APIError(exc.status, f"{field}: {exc.message}", field) from exc
        raise


def _usage(outs: Sequence[Output]) -> PoolingUsage:
    prompt = sum(o.prompt_tokens for o in outs)
    return PoolingUsage(prompt_tokens=prompt, total_tokens=prompt, cached_tokens=sum(o.cached_tokens for o in outs))


# -- /v1/embeddings ---------------------------------------------------------------------------------


def _inputs(value: str | list) -> list[str | list[int]]:
    if isinstance(value, str):
        return [value]
    if value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return [list(value)]
    if all(isinstance(v, str) for v in value) or all(
            isinstance(v, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in v) for v in value):
        return list(value)
    raise APIError(400, "input must be a string, a list of strings, a list of token ids or a list of such lists",
                   "input")


def _encode(vector: torch.Tensor, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":  # what the openai SDK asks for by default: float32, little-endian
        return base64.b64encode(vector.to(torch.float32).numpy().astype("<f4").tobytes()).decode()
    return vector.tolist()


async def embeddings(request: Request) -> Response:
    state: ServerState = request.app.state.radix
    body = decode_body(await state.read_body(request), EmbeddingRequest)
    state.check_model(body.model)
    if body.encoding_format not in ("float", "base64"):
        raise APIError(400, f"encoding_format must be float or base64, got {body.encoding_format!r}", "encoding_format")
    hidden = state.engine.model_config.hidden_size  # type: ignore[attr-defined]
    if body.dimensions is not None and not 1 <= body.dimensions <= hidden:
        raise APIError(400, f"dimensions must be in [1, {hidden}], got {body.dimensions}", "dimensions")
    pooling = PoolingParams("embed", state.engine.args.embedding_pooling, normalize=True)
    outs = await pooled(state, _inputs(body.input), pooling, "input", body.cache_salt)
    data = []
    for i, out in enumerate(outs):
        vector = torch.tensor(out.embedding)
        if body.dimensions is not None:  # truncate, then renormalise (as OpenAI's text-embedding-3 does)
            vector = torch.nn.functional.normalize(vector[: body.dimensions], dim=0)
        data.append(EmbeddingData(index=i, embedding=_encode(vector, body.encoding_format)))
    return json_response(EmbeddingResponse(data=data, model=state.served_model_name, usage=_usage(outs)))


# -- /v1/rerank and /v1/score -------------------------------------------------------------------------


async def _scores(state: ServerState, pairs: list[tuple[str, str]], instruction: str | None,
                  cache_salt: str | None, field: str) -> tuple[list[float], list[Output]]:
    reranker = state.reranker
    try:
        token_ids = reranker.token_ids(state.engine.tokenizer)
    except ValueError as exc:
        raise bad_request(exc) from exc
    prompts = [reranker.prompt(query, document, instruction) for query, document in pairs]
    outs = await pooled(state, prompts, PoolingParams("next_token", token_ids=token_ids), field, cache_salt)
    return [relevance(out.token_logits or []) for out in outs], outs


async def rerank(request: Request) -> Response:
    state: ServerState = request.app.state.radix
    body = decode_body(await state.read_body(request), RerankRequest)
    state.check_model(body.model)
    if body.top_n is not None and body.top_n < 1:
        raise APIError(400, f"top_n must be >= 1, got {body.top_n}", "top_n")
    texts = [d.text if isinstance(d, RerankDocument) else d for d in body.documents]
    scores, outs = await _scores(state, [(body.query, t) for t in texts], body.instruction, body.cache_salt,
                                 "documents")
    order = sorted(range(len(texts)), key=lambda i: -scores[i])[: body.top_n]
    results = [RerankResult(index=i, relevance_score=scores[i],
                            document=RerankDocument(texts[i]) if body.return_documents else None) for i in order]
    return json_response(RerankResponse(id=f"rerank-{uuid.uuid4().hex}", model=state.served_model_name,
                                        results=results, usage=_usage(outs)))


async def score(request: Request) -> Response:
    state: ServerState = request.app.state.radix
    body = decode_body(await state.read_body(request), ScoreRequest)
    state.check_model(body.model)
    firsts = [body.text_1] if isinstance(body.text_1, str) else body.text_1
    seconds = [body.text_2] if isinstance(body.text_2, str) else body.text_2
    if len(firsts) == 1:
        firsts = firsts * len(seconds)
    if len(firsts) != len(seconds):
        raise APIError(400, f"text_1 has {len(firsts)} texts and text_2 {len(seconds)}: give one text_1, or one "
                       "per text_2", "text_1")
    scores, outs = await _scores(state, list(zip(firsts, seconds)), body.instruction, body.cache_salt, "text_2")
    data = [ScoreData(index=i, score=s) for i, s in enumerate(scores)]
    return json_response(ScoreResponse(id=f"score-{uuid.uuid4().hex}", created=int(time.time()),
                                       model=state.served_model_name, data=data, usage=_usage(outs)))
