"""Tools on a model whose chat template has no tool format (the tiny llama's): served the way
llama.cpp's generic handler serves them (server/pipeline/generic_tools.py), never a 400, through
/v1/chat/completions, /v1/messages and /api/chat with each protocol's own client."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import httpx
import msgspec
import ollama
import openai
import pytest

from runtime import Engine
from server.parsers.tools import ToolSpec
from server.parsers.tools.base import StreamingToolParser
from server.parsers.tools.generic import GenericParser
from server.pipeline import generic_tools
from server.pipeline.request import ChatCompletionRequest
from tests.server.harness import RunningServer, serve
from tests.tiny_models import save_tiny_model

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
                   "required": ["city"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALLED = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """The tiny llama (its template knows no tools), with room for the tools' description."""
    folder = save_tiny_model("llama", tmp_path_factory.mktemp("no-tool-format"))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 2048}))
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=8192) as engine:
        with serve(engine, served_model_name="tiny") as running:
            yield running


@pytest.mark.parametrize("text,content,calls", [
    ('{"response": "sunny \\u00e9 \\ud83d\\ude00"}', "sunny é 😀", []),
    ('{ "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}] }', "", [("get_weather", "Paris")]),
    ('{"response": "cut sh', "cut sh", []),  # max_tokens ends the string: what was said is the content
    ("not json at all", "not json at all", []),  # no grammar held it: nothing is dropped
])
def test_the_reply_reads_into_content_or_calls_streamed_or_not(text: str, content: str, calls: list) -> None:
    parser = GenericParser([ToolSpec("get_weather", WEATHER["function"]["parameters"])])
    parsed = parser.parse(text, final=True)
    assert parsed.content == content
    assert [(c.name, json.loads(c.arguments)["city"]) for c in parsed.calls] == calls
    stream = StreamingToolParser(parser)
    events = [e for ch in text for e in stream.feed(ch)] + stream.finish()
    assert "".join(getattr(e, "text", "") for e in events if type(e).__name__ == "ContentDelta") == content


def test_earlier_turns_render_in_the_reply_shape_and_the_guide_joins_the_system_message() -> None:
    body = msgspec.convert({"messages": [{"role": "system", "content": "be brief"}, *CALLED], "tools": [WEATHER],
                            "parallel_tool_calls": False}, ChatCompletionRequest)
    adapted, constraint, _ = generic_tools.adapt(body)
    roles = [m.role for m in adapted.messages]
    assert roles == ["system", "user", "assistant", "user"]
    assert adapted.messages[0].content.startswith("be brief\n\n") and "get_weather" in adapted.messages[0].content
    assert json.loads(adapted.messages[2].content) == {"tool_calls": [{"name": "get_weather",
                                                                         "arguments": {"city": "Paris"}}]}
    assert json.loads(adapted.messages[3].content) == {"tool_response": {"name": "get_weather",
                                                                         "content": "sunny, 21 C"}}
    schema = json.loads(constraint.params["json_schema"])
    assert schema["anyOf"][0]["properties"]["tool_calls"]["maxItems"] == 1
    assert generic_tools.adapt(body)[0] == adapted  # the same request renders the same prompt every time


def _check_reply(message: object) -> None:
    calls = getattr(message, "tool_calls", None) or []
    for call in calls:
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments)["city"] in ("Paris", "Tokyo")
    assert calls or isinstance(message.content, str)  # type: ignore[attr-defined]


def test_openai_chat_serves_tools_on_a_model_without_a_tool_format(server: RunningServer) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    info = httpx.get(server.url + "/get_server_info", timeout=30).json()
    assert info["tool_call_parser_resolved"] is None
    for temperature in (0, 1, 1, 1):
        resp = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], max_tokens=40,
                                              temperature=temperature)
        choice = resp.choices[0]
        assert choice.finish_reason in ("stop", "length", "tool_calls")
        if choice.finish_reason != "length":
            _check_reply(choice.message)
            assert (choice.finish_reason == "tool_calls") == bool(choice.message.tool_calls)
    plain = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], max_tokens=40, temperature=0)
    chunks = list(client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], max_tokens=40,
                                                 temperature=0, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert text == (plain.choices[0].message.content or "")
    assert len([tc for tc in calls if tc.id]) == len(plain.choices[0].message.tool_calls or [])
    after = client.chat.completions.create(model="tiny", messages=CALLED, tools=[WEATHER], max_tokens=8)
    assert after.usage.prompt_tokens_details.cached_tokens > 0  # the earlier turn's prompt: the same prefix


def test_anthropic_and_ollama_get_the_same_on_that_model(server: RunningServer) -> None:
    tool = {"name": "get_weather", "description": "The weather in a city.",
            "input_schema": WEATHER["function"]["parameters"]}
    msg = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0).messages.create(
        model="tiny", max_tokens=40, messages=ASK, tools=[tool])
    assert msg.stop_reason in ("tool_use", "end_turn", "max_tokens")
    if msg.stop_reason == "tool_use":
        assert msg.content[-1].type == "tool_use" and msg.content[-1].input["city"] in ("Paris", "Tokyo")
    reply = ollama.Client(host=server.url).chat(model="tiny", messages=ASK, tools=[WEATHER],
                                                options={"num_predict": 40})
    assert reply.done
    for call in reply.message.tool_calls or []:
        assert call.function.arguments["city"] in ("Paris", "Tokyo")


def test_the_responses_api_gets_it_too(server: RunningServer) -> None:
    tool = {"type": "function", **WEATHER["function"]}
    resp = httpx.post(server.url + "/v1/responses", timeout=120, json={
        "model": "tiny", "input": "What is the weather in Paris?", "tools": [tool], "max_output_tokens": 40})
    assert resp.status_code == 200, resp.text
    for item in resp.json()["output"]:
        assert item["type"] in ("message", "function_call")
        if item["type"] == "function_call":
            assert item["name"] == "get_weather" and json.loads(item["arguments"])["city"] in ("Paris", "Tokyo")
