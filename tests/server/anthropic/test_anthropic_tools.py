"""Tools and thinking through /v1/messages with the `anthropic` SDK, on the tiny tool-calling model
(tests/server/agent_model.py: its template opens a call after the user's turn, so the grammar makes
the call valid; after a tool result the model answers in text)."""

from __future__ import annotations

import json

import httpx

from tests.server.anthropic.helpers import client_for
from tests.server.harness import RunningServer

WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
                            "required": ["city"], "additionalProperties": False}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
ONE_CALL = {"type": "auto", "disable_parallel_tool_use": True}


def test_a_tool_round_trip(tools_server: RunningServer) -> None:
    client = client_for(tools_server)
    first = client.messages.create(model="tiny", max_tokens=96, messages=ASK, tools=[WEATHER], tool_choice=ONE_CALL)
    assert first.stop_reason == "tool_use"
    (call,) = [b for b in first.content if b.type == "tool_use"]
    assert call.id.startswith("toolu_") and call.name == "get_weather" and call.input["city"] in ("Paris", "Tokyo")
    history = [*ASK, {"role": "assistant", "content": first.content},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                             "content": [{"type": "text", "text": "sunny, 21 C"}]}]}]
    answer = client.messages.create(model="tiny", max_tokens=8, messages=history, tools=[WEATHER])
    assert answer.stop_reason in ("end_turn", "max_tokens") and answer.content[0].type == "text"
    assert answer.usage.cache_read_input_tokens > 0  # the first turn's prompt, still cached
    failed = [*history[:2], {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                           "content": "no such city", "is_error": True}]}]
    assert client.messages.create(model="tiny", max_tokens=4, messages=failed, tools=[WEATHER]).content


def test_a_streamed_call_arrives_as_input_json_deltas(tools_server: RunningServer) -> None:
    client = client_for(tools_server)
    with client.messages.stream(model="tiny", max_tokens=96, messages=ASK, tools=[WEATHER],
                                tool_choice=ONE_CALL) as stream:
        events = list(stream)
        final = stream.get_final_message()
    fragments = [e.delta.partial_json for e in events if e.type == "content_block_delta"
                 and e.delta.type == "input_json_delta"]
    starts = [e.content_block for e in events if e.type == "content_block_start"]
    assert [b.type for b in starts] == ["tool_use"] and starts[0].name == "get_weather"
    assert len(fragments) > 1 and json.loads("".join(fragments))["city"] in ("Paris", "Tokyo")
    assert final.stop_reason == "tool_use" and final.content[0].input == json.loads("".join(fragments))


def test_tool_choice_any_tool_and_none(tools_server: RunningServer) -> None:
    client = client_for(tools_server)
    other = {"name": "get_time", "input_schema": {"type": "object", "properties": {"zone": {"type": "string"}}}}
    tools = [WEATHER, other]
    named = client.messages.create(model="tiny", max_tokens=48, messages=ASK, tools=tools,
                                   tool_choice={"type": "tool", "name": "get_time"})
    assert named.stop_reason == "tool_use" and [b.name for b in named.content] == ["get_time"]
    forced = client.messages.create(model="tiny", max_tokens=96, messages=ASK, tools=tools,
                                    tool_choice={"type": "any"})
    assert forced.stop_reason == "tool_use" and forced.content[0].name in ("get_weather", "get_time")
    plain = client.messages.create(model="tiny", max_tokens=6, messages=ASK, tools=tools,
                                   tool_choice={"type": "none"})
    assert [b.type for b in plain.content] == ["text"] and plain.stop_reason in ("end_turn", "max_tokens")


def test_thinking_comes_back_as_thinking_blocks(tools_server: RunningServer) -> None:
    client = client_for(tools_server)
    thinking = {"type": "enabled", "budget_tokens": 6}
    greedy = {"temperature": 0}
    msg = client.messages.create(model="tiny", max_tokens=8, messages=ASK, thinking=thinking, extra_body=greedy)
    assert msg.content[0].type == "thinking" and msg.content[0].thinking  # a random model never closes </think>
    with client.messages.stream(model="tiny", max_tokens=8, messages=ASK, thinking=thinking,
                                extra_body=greedy) as stream:
        deltas = [e.delta.thinking for e in stream
                  if e.type == "content_block_delta" and e.delta.type == "thinking_delta"]
    assert "".join(deltas) == msg.content[0].thinking
    off = client.messages.create(model="tiny", max_tokens=4, messages=ASK, thinking={"type": "disabled"})
    assert all(b.type != "thinking" for b in off.content)
    omitted = {"type": "adaptive", "display": "omitted"}  # what Claude Code sends
    hidden = client.messages.create(model="tiny", max_tokens=8, messages=ASK, thinking=omitted, extra_body=greedy)
    assert hidden.content[0].type == "thinking" and hidden.content[0].thinking == ""
    with client.messages.stream(model="tiny", max_tokens=8, messages=ASK, thinking=omitted,
                                extra_body=greedy) as stream:
        kinds = [e.delta.type for e in stream if e.type == "content_block_delta"]
        assert "thinking_delta" not in kinds and stream.get_final_message().content[0].type == "thinking"


def test_output_config_format_constrains_the_text_to_the_schema(tools_server: RunningServer) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    body = {"model": "tiny", "max_tokens": 32, "messages": ASK,
            "output_config": {"format": {"type": "json_schema", "schema": schema}}}
    msg = httpx.post(tools_server.url + "/v1/messages", json=body, timeout=60).json()
    assert msg["stop_reason"] == "end_turn", msg
    assert isinstance(json.loads(msg["content"][0]["text"])["ok"], bool)


def test_a_system_message_inside_messages_is_accepted(tools_server: RunningServer) -> None:
    client = client_for(tools_server)
    turns = [*ASK, {"role": "system", "content": "Available agent types: general-purpose."}]
    msg = client.messages.create(model="tiny", max_tokens=96, messages=turns, tools=[WEATHER], tool_choice=ONE_CALL)
    assert msg.stop_reason == "tool_use"
