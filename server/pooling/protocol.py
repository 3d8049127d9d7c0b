"""Request and response shapes of the pooling routes: OpenAI's /v1/embeddings, the Cohere/Jina
/v1/rerank that RAG frameworks call, and vLLM's /v1/score."""

from __future__ import annotations

import msgspec

# A text, several texts, one prompt of token ids, or several (OpenAI's four `input` forms; msgspec
# takes one list type in a union, so the routes tell them apart).
EmbeddingInput = str | list[str | int | list[int]]


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    input: EmbeddingInput
    model: str | None = None
    encoding_format: str = "float"  # or "base64": the float32 vector's little-endian bytes
    dimensions: int | None = None  # keep the first N, renormalised (Matryoshka-style truncation)
    user: str | None = None
    cache_salt: str | None = None  # namespaces the prefix cache, as on the other routes


class EmbeddingData(msgspec.Struct):
    index: int
    embedding: list[float] | str
    object: str = "embedding"


class PoolingUsage(msgspec.Struct):
    prompt_tokens: int
    total_tokens: int
    cached_tokens: int = 0  # of the prompt tokens, how many came from the prefix cache


class EmbeddingResponse(msgspec.Struct):
    data: list[EmbeddingData]
    model: str
    usage: PoolingUsage
    object: str = "list"


class RerankDocument(msgspec.Struct):
    text: str


class RerankRequest(msgspec.Struct, kw_only=True):
    query: str
    documents: list[str | RerankDocument]
    model: str | None = None
    top_n: int | None = None
    return_documents: bool = True
    instruction: str | None = None  # the reranker's task line (default: --rerank-instruction)
    cache_salt: str | None = None


class RerankResult(msgspec.Struct, omit_defaults=True):
    index: int
    relevance_score: float
    document: RerankDocument | None = None


class RerankResponse(msgspec.Struct):
    id: str
    model: str
    results: list[RerankResult]
    usage: PoolingUsage


class ScoreRequest(msgspec.Struct, kw_only=True):
    text_1: str | list[str]  # the query (one, or one per text_2)
    text_2: str | list[str]  # the documents
    model: str | None = None
    instruction: str | None = None
    cache_salt: str | None = None


class ScoreData(msgspec.Struct):
    index: int
    score: float
    object: str = "score"


class ScoreResponse(msgspec.Struct):
    id: str
    created: int
    model: str
    data: list[ScoreData]
    usage: PoolingUsage
    object: str = "list"
