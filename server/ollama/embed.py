"""Ollama's `/api/embed` (normalised embeddings of one text or many) and its older `/api/embeddings`
(one prompt, the vector as pooled, not normalised: as Ollama answers each). Both run on the served
model and its radix cache (runtime/sampling/pooling.py), as /v1/embeddings does."""

from __future__ import annotations

import asyncio
import time

import torch

from runtime import Output, PoolingParams, SamplingParams
from server.common.errors import APIError, bad_request
from server.common.state import ServerState
from server.pipeline.engine_client import collect

MAX_INPUTS = 2048
NO_TOKENS = SamplingParams(max_new_tokens=0)


async def embeddings_of(state: ServerState, texts: list[str], normalize: bool, truncate: bool) -> list[Output]:
    """Each text's pooled final hidden state, all submitted together; `truncate` cuts a text to the
    context (Ollama's default) instead of refusing it."""
    if len(texts) > MAX_INPUTS:
        raise APIError(400, f"input: at most {MAX_INPUTS} texts per request, got {len(texts)}", "input")
    engine = state.engine
    try:
        encoded = [engine.encode(text) for text in texts]
    except ValueError as exc:
        raise bad_request(ValueError(f"input: {exc}")) from exc
    room = engine.context_len - 1
    for i, ids in enumerate(encoded):
        if len(ids) > room:
            if not truncate:
                raise APIError(400, f"input: text {i} has {len(ids)} tokens; this model's context length is "
                                    f"{engine.context_len} (send truncate: true to cut it)", "input")
            encoded[i] = ids[:room]
    pooling = PoolingParams("embed", engine.args.embedding_pooling, normalize)
    runs = [collect(engine, state.metrics, ids, NO_TOKENS, pooling=pooling) for ids in encoded]
    return [outs[0] for outs in await asyncio.gather(*runs)]


def vector(out: Output, dimensions: int | None) -> list[float]:
    pooled = torch.tensor(out.embedding)
    if dimensions is not None:  # truncated, then normalised again
        pooled = torch.nn.functional.normalize(pooled[:dimensions], dim=0)
    return pooled.tolist()


def check_dimensions(state: ServerState, dimensions: int | None) -> None:
    hidden = getattr(state.engine.model_config, "hidden_size", None)
    if dimensions is not None and hidden is not None and not 1 <= dimensions <= hidden:
        raise APIError(400, f"dimensions: must be in [1, {hidden}], got {dimensions}", "dimensions")


def now_ns() -> int:
    return time.perf_counter_ns()
