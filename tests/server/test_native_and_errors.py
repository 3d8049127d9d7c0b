"""Native routes, error shapes, metrics, disconnects and the API key, over real HTTP."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from runtime import Engine
from tests.server.harness import RunningServer, serve


def _post(server: RunningServer, path: str, body: object, **kw: object) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60, **kw)


def _assert_error(resp: httpx.Response, status: int, param: str | None = None) -> None:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param, err


def test_generate_single_batch_and_logprobs(server: RunningServer) -> None:
    one = _post(server, "/generate", {"text": "hello world", "sampling_params": {"max_new_tokens": 5, "temperature": 0}}).json()
    assert set(one) == {"text", "output_ids", "meta_info"} and one["meta_info"]["completion_tokens"] == 5
    assert one["meta_info"]["finish_reason"]["type"] in ("length", "stop")
    batch = _post(server, "/generate", {"text": ["a b c", "hello world"],
                                        "sampling_params": {"max_new_tokens": 5, "temperature": 0}}).json()
    assert len(batch) == 2 and batch[1]["text"] == one["text"]
    ids = _post(server, "/generate", {"input_ids": [5, 6, 7, 8, 9, 10], "return_logprob": True, "logprob_start_len": 2,
                                      "top_logprobs_num": 2, "sampling_params": {"max_new_tokens": 3, "temperature": 0}}).json()
    meta = ids["meta_info"]
    assert [t for _, t, _ in meta["input_token_logprobs"]] == [7, 8, 9, 10]
    assert len(meta["output_token_logprobs"]) == 3 and len(meta["output_top_logprobs"][0]) == 2


def test_generate_stream(server: RunningServer) -> None:
    body = {"text": "hello world", "stream": True, "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
    events = []
    with httpx.stream("POST", server.url + "/generate", json=body, timeout=60) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["meta_info"]["finish_reason"] is not None and len(events) >= 3


def test_info_routes_and_cache_flush(server: RunningServer) -> None:
    info = httpx.get(server.url + "/get_server_info").json()
    for key in ("num_running", "num_waiting", "cache_hit_rate", "prompt_tokens_total", "cached_tokens_total",
                "generated_tokens_total", "slots_free", "slots_cached", "slots_in_use", "slots_total"):
        assert key in info["stats"]
    assert info["model"] and "api_key" not in info
    assert info["device"] == "cpu" and info["dtype"] == "float32"  # resolved, not "auto"
    assert info["kv_cache_tokens"] == server.engine.runner.num_slots
    model = httpx.get(server.url + "/get_model_info").json()
    assert model["architectures"] == ["LlamaForCausalLM"]
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    assert _post(server, "/flush_cache", {}).status_code == 200
    spec = httpx.get(server.url + "/openapi.json").json()
    assert {"/v1/completions", "/v1/chat/completions", "/generate", "/v1/responses",
            "/v1/responses/{response_id}"} <= set(spec["paths"])
    assert set(spec["paths"]["/v1/responses/{response_id}"]) == {"get", "delete"}


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", b'{"prompt": "x", "max_tokens": ', None),
    ("/v1/completions", b"", None),
    ("/v1/completions", {"prompt": 5}, "prompt"),
    ("/v1/completions", {"prompt": "x", "max_tokens": "ten"}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "top_p": 7}, "top_p"),
    ("/v1/completions", {"prompt": ""}, "prompt"),
    ("/v1/completions", {"prompt": "x", "model": "gpt-9"}, "model"),
    ("/v1/completions", {"prompt": [[5, 999999]]}, "input_ids"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, "messages[0].content"),
    ("/generate", {"text": "x", "sampling_params": {"warp_speed": 9}}, "sampling_params"),
    ("/generate", {"text": "x", "sampling_params": {"temperature": -2}}, "sampling_params.temperature"),
    ("/generate", {"input_ids": [1] * 5000}, None),
])
def test_bad_requests_are_400_in_openai_shape(server: RunningServer, path: str, body: object, param: str | None) -> None:
    if isinstance(body, bytes):
        resp = httpx.post(server.url + path, content=body, headers={"content-type": "application/json"})
    else:
        resp = _post(server, path, body)
    _assert_error(resp, 400, param)
    # and the server keeps serving
    assert _post(server, "/generate", {"text": "ok", "sampling_params": {"max_new_tokens": 1}}).status_code == 200


def test_unknown_route_is_404_in_error_shape(server: RunningServer) -> None:
    _assert_error(httpx.get(server.url + "/v1/nothing"), 404)


def test_metrics_parse_and_move(server: RunningServer) -> None:
    def sample(name: str) -> float:
        text = httpx.get(server.url + "/metrics").text
        families = {f.name: f for f in text_string_to_metric_families(text)}
        return sum(s.value for s in families[name].samples if s.name.endswith(("_total", "_count")) or s.name == name)

    before = sample("radixserve_generation_tokens")
    ttft_before = sample("radixserve_time_to_first_token_seconds")
    _post(server, "/v1/completions", {"prompt": "metrics please", "max_tokens": 4, "temperature": 0, "ignore_eos": True})
    assert sample("radixserve_generation_tokens") == before + 4
    assert sample("radixserve_time_to_first_token_seconds") == ttft_before + 1
    text = httpx.get(server.url + "/metrics").text
    for name in ("radixserve_kv_slots", "radixserve_cache_hit_rate", "radixserve_num_running_requests",
                 "radixserve_inter_token_latency_seconds", "radixserve_e2e_request_latency_seconds",
                 "radixserve_prompt_tokens", "radixserve_cached_tokens"):
        assert name in text


def test_client_disconnect_mid_stream_frees_slots(server: RunningServer) -> None:
    body = {"prompt": "a long story", "max_tokens": 3000, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as resp:
        for i, _ in enumerate(resp.iter_lines()):
            if i > 6:
                break
    deadline = time.time() + 20
    while time.time() < deadline and server.engine.stats()["num_running"]:
        time.sleep(0.05)
    stats = server.engine.stats()
    assert stats["num_running"] == 0 and stats["slots_in_use"] == 0
    assert stats["slots_free"] + stats["slots_cached"] == stats["slots_total"]


def test_api_key_guards_everything_but_health(tiny_folder) -> None:  # noqa: ANN001
    with Engine(model=str(tiny_folder), dtype="float32", kv_cache_tokens=512) as engine:
        with serve(engine, api_key="sesame") as srv:
            assert httpx.get(srv.url + "/health").status_code == 200
            _assert_error(httpx.get(srv.url + "/v1/models"), 401)
            _assert_error(httpx.get(srv.url + "/metrics", headers={"Authorization": "Bearer wrong"}), 401)
            ok = httpx.get(srv.url + "/v1/models", headers={"Authorization": "Bearer sesame"})
            assert ok.status_code == 200
