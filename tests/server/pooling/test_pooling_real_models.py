"""/v1/embeddings and /v1/rerank through the openai SDK and httpx on the real default model, behind
`python -m server` as a user starts it (slow): one vector per text of the model's width, unit
length, the same when its prefix was cached; rerank's documents share the query's prefix."""

from __future__ import annotations

import math
from pathlib import Path

import httpx
import openai
import pytest

from tests.server.harness import server_process

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def test_embeddings_and_rerank_on_the_default_model(tmp_path: Path) -> None:
    with server_process("--model", "default", "--log-level", "warning", log=tmp_path / "server.log") as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
        texts = ["Paris is the capital of France.", "The mitochondria is the powerhouse of the cell."]
        got = client.embeddings.create(model="gemma-3-270m", input=texts)
        assert len(got.data) == 2 and all(len(d.embedding) == 640 for d in got.data)
        assert all(math.isclose(math.fsum(x * x for x in d.embedding), 1.0, rel_tol=1e-3) for d in got.data)
        again = client.embeddings.create(model="gemma-3-270m", input=texts[0])
        assert max(abs(a - b) for a, b in zip(again.data[0].embedding, got.data[0].embedding)) < 5e-2
        body = {"query": "What is the capital of France?", "top_n": 2,
                "documents": ["Berlin is in Germany.", "Paris is the capital of France.", "Cells have mitochondria."]}
        r = httpx.post(url + "/v1/rerank", json=body, timeout=300)
        assert r.status_code == 200, r.text
        scores = [x["relevance_score"] for x in r.json()["results"]]
        assert len(scores) == 2 and scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
        assert r.json()["usage"]["cached_tokens"] > 0  # the instruction and query, computed once
