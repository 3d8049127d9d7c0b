"""Reliability and security against the running server: bad input, body limits, overload with
disconnects, queue bounds, tenant isolation, private logs, faulty requests and a dead loop."""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from runtime import Engine
from tests.server.harness import RunningServer, serve


@pytest.fixture(scope="module")
def small_server(tiny_folder: Path) -> Iterator[RunningServer]:
    with Engine(model=str(tiny_folder), dtype="float32", kv_cache_tokens=2048, context_length=256) as engine:
        with serve(engine, max_request_body_bytes=64 * 1024) as running:
            yield running


def _ok(server: RunningServer) -> None:
    resp = httpx.post(server.url + "/v1/completions", json={"prompt": "still alive", "max_tokens": 2}, timeout=60)
    assert resp.status_code == 200, resp.text


def _assert_error(resp: httpx.Response, status: int, path: str = "") -> None:
    """An error in the shape of the protocol the path belongs to (OpenAI's unless Anthropic's or Ollama's)."""
    assert resp.status_code == status, (resp.status_code, resp.text[:300])
    if path.startswith("/v1/messages"):
        body = resp.json()
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
        return
    if path.startswith("/api/"):
        assert set(resp.json()) == {"error"} and isinstance(resp.json()["error"], str)
        return
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status


BAD_BODIES: list[tuple[str, object]] = [
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 5'),  # truncated
    ("/v1/completions", b"{prompt: x}"),  # malformed
    ("/v1/completions", b"\xff\xfe\x00garbage"),  # not UTF-8
    ("/v1/completions", b'{"prompt": "x", "temperature": NaN}'),
    ("/v1/completions", b'{"prompt": "x", "temperature": Infinity}'),
    ("/v1/completions", b"[1, 2, 3]"),
    ("/v1/completions", {"prompt": ["a", 3]}),
    ("/v1/completions", {"prompt": "x", "max_tokens": 10**30}),
    ("/v1/completions", {"prompt": "x", "max_tokens": -1}),
    ("/v1/completions", {"prompt": "x", "n": 0}),
    ("/v1/completions", {"prompt": "x", "n": 10**6}),
    ("/v1/completions", {"prompt": "x", "temperature": 1e308}),
    ("/v1/completions", {"prompt": "x", "top_p": -0.5}),
    ("/v1/completions", {"prompt": "x", "seed": 2**80}),
    ("/v1/completions", {"prompt": "   \n\t "}),
    ("/v1/completions", {"prompt": [[]]}),
    ("/v1/completions", {"prompt": [[1, -4]]}),
    ("/v1/completions", {"prompt": "word " * 400}),  # longer than the 256-token context
    ("/v1/completions", {"prompt": "x", "stop": ["s"] * 5000}),
    ("/v1/completions", {"prompt": "x", "logprobs": 99}),
    ("/v1/chat/completions", {"messages": [{"role": "alien", "content": "x"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}),
    ("/v1/chat/completions", {"messages": [{"content": "no role"}]}),
    ("/v1/chat/completions", {"messages": "not a list"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
    ("/generate", {"text": "x", "sampling_params": {"nucleus": 0.5}}),
    ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": "lots"}}),
    ("/generate", {"input_ids": [1, 2, 10**9]}),
    ("/generate", {"text": "x", "input_ids": [1]}),
    ("/generate", {}),
    ("/generate", {"text": "x", "unknown_field": 1}),
    ("/abort_request", {}),
    ("/v1/embeddings", {}),
    ("/v1/embeddings", {"input": [[]]}),
    ("/v1/embeddings", {"input": [[1, -4]]}),
    ("/v1/embeddings", {"input": "word " * 400}),  # longer than the 256-token context
    ("/v1/embeddings", {"input": "x", "dimensions": 10**9}),
    ("/v1/rerank", {"query": "q"}),
    ("/v1/rerank", {"query": "q", "documents": [{"txt": "d"}]}),
    ("/v1/score", {"text_1": [], "text_2": []}),
    ("/v1/messages", b'{"max_tokens": 4, "messages": ['),  # truncated
    ("/v1/messages", b"\xff\xfe\x00garbage"),
    ("/v1/messages", {"max_tokens": 4}),
    ("/v1/messages", {"max_tokens": 10**30, "messages": [{"role": "user", "content": "x"}]}),
    ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": "word " * 400}]}),
    ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "tool_use"}]}]}),
    ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": [{"text": "no type"}]}]}),
    ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "top_k": -5}),
    ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "stop_sequences": "s"}),
    ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
                      "tools": [{"name": "f", "type": "custom"}]}),
    ("/v1/messages/count_tokens", {"messages": "x"}),
    ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "options": {"top_p": -1}}),
    ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": "word " * 400}], "stream": False,
                   "options": {"num_predict": 4}}),
    ("/api/chat", {"model": "tiny", "messages": [{"role": "user"}], "format": {"type": "nonsense"}}),
    ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "tools": [{"function": {}}]}),
    ("/api/generate", {"model": "tiny", "prompt": "x", "options": {"num_predict": -7}}),
    ("/api/generate", {"model": "tiny", "prompt": "x", "raw": True, "options": {"temperature": "hot"}}),
    ("/api/generate", b"[1, 2, 3]"),
    ("/api/embed", {"model": "tiny", "input": []}),
    ("/api/embed", {"model": "tiny", "input": "x", "dimensions": 10**9}),
    ("/api/show", {}),
]


@pytest.mark.parametrize("path,body", BAD_BODIES, ids=[f"{p}-{i}" for i, (p, _) in enumerate(BAD_BODIES)])
def test_bad_input_is_4xx_and_the_next_request_works(small_server: RunningServer, path: str, body: object) -> None:
    if isinstance(body, bytes):
        resp = httpx.post(small_server.url + path, content=body, headers={"content-type": "application/json"})
    else:
        resp = httpx.post(small_server.url + path, json=body, timeout=60)
    assert 400 <= resp.status_code < 500, (resp.status_code, resp.text[:300])
    _assert_error(resp, resp.status_code, path)
    _ok(small_server)


def test_oversized_bodies_get_413(small_server: RunningServer) -> None:
    big = json.dumps({"prompt": "x" * (100 * 1024)}).encode()
    _assert_error(httpx.post(small_server.url + "/v1/completions", content=big,
                             headers={"content-type": "application/json"}), 413)

    def chunks() -> Iterator[bytes]:  # no content-length: the limit holds while streaming the body
        yield b'{"prompt": "'
        for _ in range(100):
            yield b"y" * 1024
        yield b'"}'

    _assert_error(httpx.post(small_server.url + "/v1/completions", content=chunks(),
                             headers={"content-type": "application/json"}), 413)
    _ok(small_server)


def test_openapi_schema_fuzzing_finds_no_5xx(small_server: RunningServer) -> None:
    import schemathesis
    from hypothesis import HealthCheck, given, settings

    schema = schemathesis.openapi.from_url(small_server.url + "/openapi.json")
    failures: list[tuple] = []
    statuses: list[int] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.path in ("/flush_cache", "/abort_request", "/metrics", "/get_server_info"):
            continue

        @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(case=operation.as_strategy())
        def check(case) -> None:  # noqa: ANN001
            if isinstance(case.body, dict):
                case.body.pop("max_tokens", None)  # keep generation short: 16 tokens by default
                if operation.path.startswith(("/api/", "/v1/messages")):  # the served model (Ollama needs one)
                    case.body["model"] = small_server.engine.args.model
                if operation.path.startswith("/api/"):  # Ollama's: a cap among the options
                    options = case.body.get("options")
                    case.body["options"] = {**(options if isinstance(options, dict) else {}), "num_predict": 4}
                else:
                    cap = {"/v1/responses": "max_output_tokens", "/v1/messages": "max_tokens"}.get(
                        operation.path, "max_completion_tokens")
                    case.body[cap] = 4
            response = case.call(base_url=small_server.url, timeout=120)
            statuses.append(response.status_code)
            if response.status_code >= 500:
                failures.append((operation.path, case.body, response.status_code, response.text[:200]))

        check()
    assert not failures, failures[:3]
    assert len(statuses) >= 20 and 200 in statuses and any(400 <= c < 500 for c in statuses)
    _ok(small_server)


def _stream_text(url: str, prompt: str, max_tokens: int, disconnect_after: int | None) -> asyncio.Future:
    async def run() -> str | None:
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
        text, events = [], 0
        async with httpx.AsyncClient(timeout=300) as client:
            async with client.stream("POST", url + "/v1/completions", json=body) as resp:
                assert resp.status_code == 200, await resp.aread()
                async for line in resp.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    events += 1
                    event = json.loads(line[6:])
                    assert "error" not in event, event
                    text.append(event["choices"][0]["text"])
                    if disconnect_after is not None and events >= disconnect_after:
                        return None  # leave mid-stream
        return "".join(text)

    return run()  # type: ignore[return-value]


def overload(tiny_folder: Path, clients: int, kv_tokens: int) -> None:
    rng = random.Random(0)
    prompts = [" ".join(rng.choice(["the", "cat", "sat", "on", "mat", "dog"]) for _ in range(rng.randint(5, 25)))
               for _ in range(clients)]
    max_tokens = 24
    with Engine(model=str(tiny_folder), dtype="float32", kv_cache_tokens=kv_tokens, max_running_requests=16) as engine:
        alone = {p: o.text for p, o in zip(prompts, engine.generate(
            prompts, sampling_params={"max_new_tokens": max_tokens, "temperature": 0, "ignore_eos": True}))}
        engine.flush_cache()
        with serve(engine) as srv:
            async def all_clients() -> list[str | None]:
                return await asyncio.gather(*(
                    _stream_text(srv.url, p, max_tokens, disconnect_after=3 if i % 5 == 0 else None)
                    for i, p in enumerate(prompts)))

            results = asyncio.run(all_clients())
            for i, (prompt, text) in enumerate(zip(prompts, results)):
                if i % 5:
                    assert text == alone[prompt], (i, text, alone[prompt])
            for _ in range(200):
                stats = engine.stats()
                if stats["num_running"] == 0 and stats["num_waiting"] == 0:
                    break
                asyncio.run(asyncio.sleep(0.05))
            stats = engine.stats()
            assert stats["slots_in_use"] == 0 and stats["num_running"] == 0
            assert stats["slots_free"] + stats["slots_cached"] + stats["slots_in_use"] == stats["slots_total"]
            assert stats["retractions_total"] > 0 or kv_tokens > clients * 50  # the budget really was short
            _ok(srv)


def test_overload_with_disconnects_small(tiny_folder: Path) -> None:
    # 60 streams of up to ~50 tokens each on 320 KV slots: several times too small.
    overload(tiny_folder, clients=60, kv_tokens=320)


@pytest.mark.slow
def test_overload_with_disconnects_full(tiny_folder: Path) -> None:
    overload(tiny_folder, clients=300, kv_tokens=640)


def test_queue_bound_answers_429_with_retry_after(tiny_folder: Path) -> None:
    with Engine(model=str(tiny_folder), dtype="float32", kv_cache_tokens=512, max_running_requests=1,
                max_queued_requests=2) as engine, serve(engine) as srv:
        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=120) as client:
                body = {"prompt": "cat", "max_tokens": 40, "ignore_eos": True}
                return await asyncio.gather(*(client.post(srv.url + "/v1/completions", json=body) for _ in range(12)))

        responses = asyncio.run(burst())
        codes = [r.status_code for r in responses]
        assert 429 in codes and 200 in codes, codes
        limited = next(r for r in responses if r.status_code == 429)
        assert limited.headers["retry-after"] == "1"
        _assert_error(limited, 429)


def test_cache_salt_isolates_tenants(small_server: RunningServer) -> None:
    prompt = "a shared system prompt for isolation " * 4

    def cached(salt: str) -> int:
        body = {"prompt": prompt, "max_tokens": 1, "cache_salt": salt}
        return httpx.post(small_server.url + "/v1/completions", json=body).json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert cached("tenant-a") == 0
    assert cached("tenant-b") == 0  # same prompt, other tenant: no hit
    assert cached("tenant-a") > 0
    native = httpx.post(small_server.url + "/generate", json={"text": prompt, "cache_salt": "tenant-c",
                                                              "sampling_params": {"max_new_tokens": 1}}).json()
    assert native["meta_info"]["cached_tokens"] == 0


def test_prompts_are_not_logged_by_default(small_server: RunningServer, caplog: pytest.LogCaptureFixture) -> None:
    secret = "my secret medical question"
    with caplog.at_level(logging.DEBUG):
        httpx.post(small_server.url + "/v1/completions", json={"prompt": secret, "max_tokens": 2})
    assert secret not in caplog.text


def test_a_faulty_request_fails_alone(tiny_folder: Path) -> None:
    poison = 250  # a token id no other prompt here contains
    with Engine(model=str(tiny_folder), dtype="float32", kv_cache_tokens=1024) as engine:
        forward = engine.runner.forward_rows  # every eager step's forward (ModelRunner.run)

        def faulty(batch):  # noqa: ANN001, ANN202
            if (batch.input_ids == poison).any():
                raise RuntimeError("simulated kernel fault")
            return forward(batch)

        engine.runner.forward_rows = faulty
        with serve(engine) as srv:
            async def mixed() -> list[httpx.Response]:
                async with httpx.AsyncClient(timeout=120) as client:
                    good = {"input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
                    bad = {"input_ids": [5, 6, poison, 8], "sampling_params": {"max_new_tokens": 4}}
                    return await asyncio.gather(client.post(srv.url + "/generate", json=good),
                                                client.post(srv.url + "/generate", json=bad),
                                                client.post(srv.url + "/generate", json=good))

            good1, bad, good2 = asyncio.run(mixed())
            assert good1.status_code == good2.status_code == 200
            _assert_error(bad, 500)
            assert "simulated kernel fault" in bad.json()["error"]["message"]
            assert httpx.get(srv.url + "/health").status_code == 200
            assert engine.stats()["slots_in_use"] == 0


def test_a_dead_loop_fails_health_instead_of_hanging(tiny_folder: Path) -> None:
    engine = Engine(model=str(tiny_folder), dtype="float32", kv_cache_tokens=512)
    try:
        with serve(engine) as srv:
            def broken() -> None:
                raise SystemError("scheduler state corrupted")

            engine.loop.scheduler.schedule = broken  # type: ignore[method-assign]
            resp = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=30)
            _assert_error(resp, 500)
            health = httpx.get(srv.url + "/health", timeout=5)
            assert health.status_code == 503 and health.json()["status"] == "unhealthy"
            _assert_error(httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=30), 503)
    finally:
        engine.shutdown()


def test_rid_on_an_openai_route_can_be_aborted(small_server: RunningServer) -> None:
    """SGLang's `rid` on the OpenAI routes names the engine request: /abort_request stops it."""
    body = {"prompt": "a b c", "max_tokens": 240, "temperature": 0, "ignore_eos": True, "stream": True,
            "rid": "stop-me"}
    reasons = []
    with httpx.stream("POST", small_server.url + "/v1/completions", json=body, timeout=120) as resp:
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[len("data: "):])["choices"]
            if choice and choice[0]["text"] and not reasons:
                reasons.append("streaming")
                assert httpx.post(small_server.url + "/abort_request", json={"rid": "stop-me"}).status_code == 200
            if choice and choice[0]["finish_reason"]:
                reasons.append(choice[0]["finish_reason"])
    assert reasons == ["streaming", "abort"]
    _ok(small_server)
