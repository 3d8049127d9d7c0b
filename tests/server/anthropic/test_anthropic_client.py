"""The official `anthropic` SDK against /v1/messages on the real server over HTTP: plain, streamed,
stop sequences, count_tokens, cache_control and usage, and errors in Anthropic's shape."""

from __future__ import annotations

from pathlib import Path

import anthropic
import httpx
import pytest

from runtime import Engine
from tests.server.anthropic.helpers import client_for
from tests.server.harness import RunningServer, serve

ASK = [{"role": "user", "content": "the cat sat on the mat and then"}]
GREEDY = {"temperature": 0}  # the SDK's create() no longer takes sampling fields: they go as extra_body


def _native(server: RunningServer, text: str, max_new_tokens: int) -> str:
    body = {"text": text, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}}
    return httpx.post(server.url + "/generate", json=body, timeout=60).json()["text"]


def test_a_message_is_the_chat_pipelines_answer(server: RunningServer) -> None:
    msg = client_for(server).messages.create(model="tiny", max_tokens=10, messages=ASK, extra_body=GREEDY)
    prompt = "user: the cat sat on the mat and then\nassistant:"  # the tiny template, after its BOS
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    assert msg.model == "tiny" and len(msg.content) == 1 and msg.content[0].type == "text"
    assert msg.content[0].text == _native(server, prompt, 10)
    assert msg.stop_reason == "max_tokens" and msg.stop_sequence is None
    usage = msg.usage
    assert usage.output_tokens == 10
    chat = httpx.post(server.url + "/v1/chat/completions", json={"messages": ASK, "max_tokens": 1}, timeout=60).json()
    assert usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens == \
        chat["usage"]["prompt_tokens"]


def test_system_string_or_blocks_and_multi_turn(server: RunningServer) -> None:
    client = client_for(server)
    turns = [*ASK, {"role": "assistant", "content": "it slept"}, {"role": "user", "content": "and then?"}]
    as_string = client.messages.create(model="tiny", max_tokens=6, system="be brief", messages=turns,
                                       extra_body=GREEDY)
    as_blocks = client.messages.create(model="tiny", max_tokens=6, messages=turns, extra_body=GREEDY,
                                       system=[{"type": "text", "text": "be brief"}])
    assert as_string.content[0].text == as_blocks.content[0].text
    assert as_blocks.usage.cache_read_input_tokens > 0  # the same prompt, sent again


def test_streamed_events_build_the_same_message(server: RunningServer) -> None:
    client = client_for(server)
    plain = client.messages.create(model="tiny", max_tokens=12, messages=ASK, extra_body=GREEDY)
    with client.messages.stream(model="tiny", max_tokens=12, messages=ASK, extra_body=GREEDY) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert final.content[0].text == plain.content[0].text and final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 12
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 1
    assert "message_delta" in kinds and "text" in kinds


def test_raw_event_stream_is_anthropics_wire_format(server: RunningServer) -> None:
    body = {"model": "tiny", "max_tokens": 4, "messages": ASK, "stream": True}
    with httpx.stream("POST", server.url + "/v1/messages", json=body, timeout=60) as resp:
        lines = [line for line in resp.iter_lines() if line]
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert len(names) == sum(line.startswith("data: ") for line in lines)


def test_stop_sequences_end_the_turn_and_say_which(server: RunningServer) -> None:
    client = client_for(server)
    text = client.messages.create(model="tiny", max_tokens=12, messages=ASK, extra_body=GREEDY).content[0].text
    stop = text[4:6]
    assert stop and stop not in text[:4]  # the random model's text, stopped two characters in
    msg = client.messages.create(model="tiny", max_tokens=12, messages=ASK, stop_sequences=["zzz", stop],
                                 extra_body=GREEDY)
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == stop
    assert msg.content[0].text == text[:4]


def test_count_tokens_counts_the_prompt_a_message_would_run(server: RunningServer) -> None:
    client = client_for(server)
    counted = client.messages.count_tokens(model="tiny", messages=ASK, system="be brief")
    msg = client.messages.create(model="tiny", max_tokens=2, messages=ASK, system="be brief")
    usage = msg.usage
    prompt = usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
    assert counted.input_tokens == prompt


def test_cache_control_retains_and_usage_says_created_then_read(server: RunningServer) -> None:
    httpx.post(server.url + "/flush_cache", timeout=30)
    client = client_for(server)
    system = [{"type": "text", "text": "a long and stable system prompt " * 4, "cache_control": {"type": "ephemeral"}}]
    first = client.messages.create(model="tiny", max_tokens=2, system=system, messages=ASK)
    assert first.usage.cache_creation_input_tokens > 100 and first.usage.cache_read_input_tokens <= 1
    assert first.usage.cache_creation.ephemeral_5m_input_tokens == first.usage.cache_creation_input_tokens
    page = httpx.get(server.url + "/cache", params={"limit": 1000}, timeout=30).json()
    assert page["retention"]["pins"] >= 1
    other = [{"role": "user", "content": "something else"}]
    second = client.messages.create(model="tiny", max_tokens=2, system=system, messages=other)
    assert second.usage.cache_read_input_tokens >= first.usage.cache_creation_input_tokens - 1
    assert second.usage.cache_creation_input_tokens == 0
    hour = [{**system[0], "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    httpx.post(server.url + "/flush_cache", timeout=30)
    third = client.messages.create(model="tiny", max_tokens=2, system=hour, messages=other)
    assert third.usage.cache_creation.ephemeral_1h_input_tokens > 100


def test_the_billing_nonce_does_not_change_the_prompt(server: RunningServer) -> None:
    client = client_for(server)
    counts, outs = [], []
    for nonce in ("36ee5", "0aaa9"):
        header = f"x-anthropic-billing-header: cc_version=2.1.177.01c; cc_entrypoint=sdk-cli; cch={nonce};"
        system = [{"type": "text", "text": header}, {"type": "text", "text": "You are a coding agent."}]
        counts.append(client.messages.count_tokens(model="tiny", system=system, messages=ASK).input_tokens)
        outs.append(client.messages.create(model="tiny", max_tokens=2, system=system, messages=ASK))
    plain = client.messages.count_tokens(model="tiny", system="You are a coding agent.", messages=ASK)
    assert counts == [plain.input_tokens] * 2
    assert outs[1].usage.cache_read_input_tokens == plain.input_tokens  # all of it, the second time


def _error(resp: httpx.Response, status: int, kind: str) -> str:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == kind
    return body["error"]["message"]


@pytest.mark.parametrize("body,field", [
    ({"messages": ASK}, "max_tokens"),
    ({"max_tokens": 4, "messages": [{"role": "alien", "content": "x"}]}, "messages[0].role"),
    ({"max_tokens": 4, "messages": []}, "messages"),
    ({"max_tokens": 0, "messages": ASK}, "max_tokens"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "messages[0].content[0].type"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_nope", "content": "x"}]}]}, "messages[0].content[0].tool_use_id"),
    ({"max_tokens": 4, "messages": [*ASK, {"role": "assistant", "content": "prefill"}]}, "messages"),
    ({"max_tokens": 4, "messages": ASK,
      "system": [{"type": "text", "text": "x", "cache_control": {"type": "lasting"}}]},
     "system[0].cache_control.type"),
    ({"max_tokens": 4, "messages": ASK, "thinking": {"type": "enabled", "budget_tokens": 9}}, "thinking.budget_tokens"),
    ({"max_tokens": 4, "messages": ASK, "tool_choice": {"type": "tool", "name": "missing"}}, "tool_choice.name"),
    ({"max_tokens": 4, "messages": ASK, "tools": [{"name": "f", "input_schema": {"type": "string"}}]},
     "tools[0].input_schema"),
    ({"max_tokens": 4, "messages": ASK, "temperature": -1}, "temperature"),
])
def test_bad_requests_are_400_in_anthropics_shape_naming_the_field(server: RunningServer, body: dict,
                                                                    field: str) -> None:
    resp = httpx.post(server.url + "/v1/messages", json={"model": "tiny", **body}, timeout=60)
    assert field in _error(resp, 400, "invalid_request_error")


def test_sdk_raises_its_own_exceptions(server: RunningServer) -> None:
    client = client_for(server)
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model="tiny", max_tokens=4, messages=[{"role": "alien", "content": "x"}])
    assert bad.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.NotFoundError, match="not served here"):
        client.messages.create(model="claude-sonnet-4-5", max_tokens=4, messages=ASK)
    with pytest.raises(anthropic.BadRequestError):
        client.messages.count_tokens(model="tiny", messages=[])


def test_errors_before_the_route_are_in_anthropics_shape_too(server: RunningServer) -> None:
    _error(httpx.post(server.url + "/v1/messages", content=b"{not json", timeout=30), 400, "invalid_request_error")
    _error(httpx.get(server.url + "/v1/messages", timeout=30), 405, "invalid_request_error")
    _error(httpx.post(server.url + "/v1/messages/batches", json={}, timeout=30), 404, "not_found_error")


def test_api_key_in_anthropics_header_and_401_in_its_shape(tiny_folder: Path) -> None:
    with Engine(model=str(tiny_folder), dtype="float32", kv_cache_tokens=512) as engine:
        with serve(engine, api_key="sesame", served_model_name="tiny") as srv:
            client = anthropic.Anthropic(base_url=srv.url, api_key="sesame", max_retries=0)  # sends x-api-key
            assert client.messages.create(model="tiny", max_tokens=2, messages=ASK).content
            with pytest.raises(anthropic.AuthenticationError):
                anthropic.Anthropic(base_url=srv.url, api_key="wrong", max_retries=0).messages.create(
                    model="tiny", max_tokens=2, messages=ASK)
            _error(httpx.post(srv.url + "/v1/messages", json={}, timeout=30), 401, "authentication_error")
            assert httpx.get(srv.url + "/v1/models", headers={"x-api-key": "sesame"}).status_code == 200


def test_max_tokens_past_the_context_window_stops_at_the_window(server: RunningServer) -> None:
    # Claude Code asks for 32,000 whatever the model: as Anthropic's newer models do, not an error.
    with client_for(server).messages.stream(model="tiny", max_tokens=100_000, messages=ASK,
                                            extra_body={"temperature": 0, "ignore_eos": True}) as stream:
        msg = stream.get_final_message()  # the SDK streams what may be long
    usage = msg.usage
    prompt = usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
    assert msg.stop_reason == "model_context_window_exceeded" and prompt + usage.output_tokens == 512
