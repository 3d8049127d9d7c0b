"""/v1/embeddings through the real openai SDK, /v1/rerank and /v1/score over HTTP, against a tiny
model: the vectors and scores are the model's own (transformers as the oracle), documents of one
rerank share their query's prefix in the cache, and bad input is a 400 in OpenAI's shape."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import torch

from runtime import Engine
from server.pooling.rerank import Reranker
from tests.server.harness import RunningServer, serve

TEXTS = ["the cat sat on the mat", "a quick brown fox", "the cat sat on the hat and then some more"]


@pytest.fixture(scope="module")
def pooling_server(tiny_folder: Path) -> Iterator[RunningServer]:
    with Engine(model=str(tiny_folder), dtype="float32", kv_cache_tokens=4096) as engine:
        with serve(engine, served_model_name="tiny", rerank_tokens="y,n") as running:
            yield running


@pytest.fixture(scope="module")
def hf_model(tiny_folder: Path):  # noqa: ANN201 - a transformers model
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_folder), dtype=torch.float32).eval()


def _hidden_and_logits(model, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True)
    return out.hidden_states[-1][0], out.logits[0, -1]


def test_openai_sdk_embeddings_are_the_models_last_hidden_state(pooling_server: RunningServer, hf_model) -> None:  # noqa: ANN001
    client = openai.OpenAI(base_url=pooling_server.url + "/v1", api_key="x")
    got = client.embeddings.create(model="tiny", input=TEXTS)  # the SDK asks for base64 and decodes it
    assert [d.index for d in got.data] == [0, 1, 2] and got.model == "tiny"
    tokenizer = pooling_server.engine.tokenizer
    for text, item in zip(TEXTS, got.data):
        ids = tokenizer.encode(text)
        want = torch.nn.functional.normalize(_hidden_and_logits(hf_model, ids)[0][-1], dim=0)
        torch.testing.assert_close(torch.tensor(item.embedding), want, atol=2e-4, rtol=2e-4)
    assert got.usage.prompt_tokens == sum(len(tokenizer.encode(t)) for t in TEXTS) == got.usage.total_tokens
    # floats, token ids, and fewer dimensions (truncated, then unit length again)
    floats = client.embeddings.create(model="tiny", input=TEXTS[0], encoding_format="float")
    torch.testing.assert_close(torch.tensor(floats.data[0].embedding), torch.tensor(got.data[0].embedding))
    by_ids = client.embeddings.create(model="tiny", input=tokenizer.encode(TEXTS[1]), encoding_format="float")
    torch.testing.assert_close(torch.tensor(by_ids.data[0].embedding), torch.tensor(got.data[1].embedding))
    short = client.embeddings.create(model="tiny", input=TEXTS[0], dimensions=16).data[0].embedding
    assert len(short) == 16 and math.isclose(float(torch.tensor(short).norm()), 1.0, rel_tol=1e-5)
    torch.testing.assert_close(torch.tensor(short),
                               torch.nn.functional.normalize(torch.tensor(got.data[0].embedding)[:16], dim=0))


def test_embedding_of_a_cached_prefix_is_the_same_and_reports_the_hit(pooling_server: RunningServer) -> None:
    client = openai.OpenAI(base_url=pooling_server.url + "/v1", api_key="x")
    long = "instruct: find the passage about cats. query: " + TEXTS[2]
    first = client.embeddings.create(model="tiny", input=long, encoding_format="float")
    again = httpx.post(pooling_server.url + "/v1/embeddings", json={"input": long, "encoding_format": "float"}).json()
    assert again["usage"]["cached_tokens"] > 0
    torch.testing.assert_close(torch.tensor(again["data"][0]["embedding"]), torch.tensor(first.data[0].embedding))


def test_rerank_scores_by_the_yes_no_tokens_and_shares_the_query_prefix(pooling_server: RunningServer,
                                                                        hf_model) -> None:  # noqa: ANN001
    query = "which animal sat on the mat, and what did it do there all afternoon?"
    documents = ["the cat sat on the mat", "stock prices fell", {"text": "a dog ran"}, "the mat was red"]
    r = httpx.post(pooling_server.url + "/v1/rerank", json={"model": "tiny", "query": query, "documents": documents,
                                                            "top_n": 3})
    assert r.status_code == 200, r.text
    body = r.json()
    scores = [x["relevance_score"] for x in body["results"]]
    assert len(scores) == 3 and scores == sorted(scores, reverse=True)
    reranker = Reranker(tokens="y,n")
    engine = pooling_server.engine
    yes, no = reranker.token_ids(engine.tokenizer)
    texts = [d["text"] if isinstance(d, dict) else d for d in documents]
    for result in body["results"]:
        ids = engine.tokenizer.encode(reranker.prompt(query, texts[result["index"]]))
        logits = _hidden_and_logits(hf_model, ids)[1]
        want = torch.softmax(logits[[yes, no]], 0)[0].item()
        assert math.isclose(result["relevance_score"], want, rel_tol=1e-4, abs_tol=1e-6)
        assert result["document"]["text"] == texts[result["index"]]
    # Every document's prompt starts with the instruction and the query: computed once, hit by the rest.
    shared = len(engine.tokenizer.encode(reranker.prompt(query, "\0").split("\0")[0]))
    assert body["usage"]["cached_tokens"] >= (len(documents) - 1) * (shared - 2)
    # /rerank (no /v1) and /v1/score give the same numbers
    bare = httpx.post(pooling_server.url + "/rerank", json={"query": query, "documents": texts,
                                                            "return_documents": False}).json()
    assert all("document" not in x for x in bare["results"])
    scored = httpx.post(pooling_server.url + "/v1/score", json={"text_1": query, "text_2": texts}).json()
    by_index = {x["index"]: x["relevance_score"] for x in bare["results"]}
    assert [d["index"] for d in scored["data"]] == [0, 1, 2, 3]
    for d in scored["data"]:
        assert math.isclose(d["score"], by_index[d["index"]], rel_tol=1e-6)


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/embeddings", {"input": []}, "input"),
    ("/v1/embeddings", {"input": "x", "dimensions": 0}, "dimensions"),
    ("/v1/embeddings", {"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ("/v1/embeddings", {"input": [1, "x"]}, "input"),
    ("/v1/embeddings", {"input": [10**9]}, "input"),
    ("/v1/embeddings", {"input": "x", "model": "other"}, "model"),
    ("/v1/rerank", {"query": "q", "documents": []}, "documents"),
    ("/v1/rerank", {"query": "q", "documents": ["d"], "top_n": 0}, "top_n"),
    ("/v1/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_1"),
])
def test_bad_pooling_requests_are_400s_naming_the_field(pooling_server: RunningServer, path: str, body: dict,
                                                        param: str) -> None:
    r = httpx.post(pooling_server.url + path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert httpx.post(pooling_server.url + "/v1/embeddings", json={"input": "still serving"}).status_code == 200
    stats = pooling_server.engine.stats()
    assert stats["slots_free"] + stats["slots_cached"] + stats["slots_in_use"] == stats["slots_total"]


def test_a_reranker_token_the_model_cannot_spell_is_a_400(tiny_folder: Path) -> None:
    with Engine(model=str(tiny_folder), dtype="float32", kv_cache_tokens=512) as engine, serve(engine) as running:
        r = httpx.post(running.url + "/v1/rerank", json={"query": "q", "documents": ["d"]})  # yes,no: 3 bytes each
        assert r.status_code == 400 and "rerank_tokens" in r.json()["error"]["message"]
