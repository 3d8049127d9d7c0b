"""Structured output over HTTP on a tiny random model: only a constrained decoder makes these pass.

A random model's greedy text is noise; every JSON, regex and tool-call assertion below holds
because the grammar masks the logits. Outputs cut by max_tokens must still be prefixes of the
language (checked by feeding their token ids to a fresh xgrammar matcher).
"""

from __future__ import annotations

import json
import re
from typing import Literal

import httpx
import openai
import pytest
from pydantic import BaseModel, Field

from tests.server.harness import RunningServer

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
                                                    "unit": {"type": "string", "enum": ["C", "F"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "integer", "minimum": -12,
                                                                                 "maximum": 12}},
                                       "required": ["zone"]}}}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


class City(BaseModel):
    name: Literal["Paris", "Rome", "Oslo"]
    capital: bool
    rank: int = Field(ge=0, le=999)


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none")


def _is_prefix(server: RunningServer, kind: str, source: str, token_ids: list[int]) -> bool:
    """Every token of the output is accepted by a fresh matcher of the same constraint."""
    grammars = server.engine.grammars
    matcher = grammars.matcher(grammars.compile(kind, source))
    return all(matcher.accept_token(t) for t in token_ids if t not in server.engine.tokenizer.eos_token_ids)


def test_sdk_parse_with_a_pydantic_model(client: openai.OpenAI) -> None:
    completion = client.chat.completions.parse(model="tiny", messages=MESSAGES, response_format=City,
                                               max_tokens=80, temperature=0)
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, City)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_and_n_samples(client: openai.OpenAI, temperature: float) -> None:
    schema = City.model_json_schema()
    resp = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=80, temperature=temperature, n=3, seed=5,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}})
    for choice in resp.choices:
        assert choice.finish_reason == "stop"
        City.model_validate_json(choice.message.content)
        assert "\n" not in choice.message.content and "  " not in choice.message.content  # no free whitespace


def test_json_object_is_an_object(server: RunningServer, client: openai.OpenAI) -> None:
    resp = client.completions.create(model="tiny", prompt="hello there", max_tokens=60, temperature=0,
                                     extra_body={"response_format": {"type": "json_object"}})
    text = resp.choices[0].text
    assert text.startswith("{")
    if resp.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:
        ids = server.engine.encode(text)
        assert _is_prefix(server, "json_schema", '{"type": "object"}', ids)


def test_named_tool_call(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=[WEATHER, TIME], max_tokens=150,
                                          tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                          temperature=0)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    assert args["city"] in ("Paris", "Rome", "Oslo") and args["unit"] in ("C", "F")
    # The tool's answer goes back in the next turn, and the model may be asked again.
    follow = MESSAGES + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                         {"role": "tool", "tool_call_id": call.id, "content": "21 C, sunny"}]
    again = client.chat.completions.create(model="tiny", messages=follow, max_tokens=5, temperature=0)
    assert again.choices[0].message.content is not None


def test_required_tool_choice_and_streaming(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=[WEATHER, TIME], max_tokens=150,
                                          tool_choice="required", temperature=0)
    for call in resp.choices[0].message.tool_calls:  # one call or more (parallel calls)
        assert call.function.name in ("get_weather", "get_time")
        json.loads(call.function.arguments)
    chunks = list(client.chat.completions.create(model="tiny", messages=MESSAGES, tools=[WEATHER], max_tokens=150,
                                                 tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                                 temperature=0, stream=True))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    # As OpenAI streams a call: id, type and name first (arguments ""), then argument fragments.
    assert calls[0].id and calls[0].type == "function" and calls[0].function.name == "get_weather"
    assert calls[0].function.arguments == "" and all(tc.index == 0 and tc.id is None for tc in calls[1:])
    json.loads("".join(tc.function.arguments for tc in calls))
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_generate_with_regex_json_schema_and_a_cut(server: RunningServer) -> None:
    def generate(params: dict) -> dict:
        resp = httpx.post(server.url + "/generate", json={"text": "hello", "sampling_params": params}, timeout=60)
        assert resp.status_code == 200, resp.text
        return resp.json()

    out = generate({"regex": r"(yes|no), [0-9]{1,3}\.", "max_new_tokens": 20, "temperature": 0})
    assert re.fullmatch(r"(yes|no), [0-9]{1,3}\.", out["text"])
    out = generate({"json_schema": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
                    "max_new_tokens": 20, "temperature": 0})
    assert isinstance(json.loads(out["text"])["ok"], bool)
    out = generate({"ebnf": 'root ::= "a" | "b" "c"', "max_new_tokens": 5, "temperature": 0})
    assert out["text"] in ("a", "bc")
    cut = generate({"regex": r"[a-z]{20,30}", "max_new_tokens": 4, "temperature": 0})
    assert cut["meta_info"]["finish_reason"]["type"] == "length"
    assert re.fullmatch(r"[a-z]*", cut["text"]) and _is_prefix(server, "regex", r"[a-z]{20,30}", cut["output_ids"])


@pytest.mark.parametrize("body,param", [
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema.schema"),
    ({"tools": [WEATHER], "tool_call_parser": "nonexistent"}, "tool_call_parser"),  # auto with an unknown format
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"regex": "(unclosed"}, None),
    ({"response_format": {"type": "json_object"}, "regex": "a+"}, "regex"),
    ({"logit_bias": {"5": 10}}, "logit_bias"),
    ({"guided_json": {"type": "object"}}, "guided_json"),
])
def test_bad_constraints_are_400_and_the_server_goes_on(server: RunningServer, body: dict, param: str | None) -> None:
    resp = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                      json={"model": "tiny", "messages": MESSAGES, "max_tokens": 4, **body})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    if param is not None:
        assert error["param"] == param
    bad = httpx.post(server.url + "/generate", json={"text": "x", "sampling_params": {"json_schema": "{nope"}})
    assert bad.status_code == 400 and "json_schema" in bad.json()["error"]["message"]
    ok = httpx.post(server.url + "/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 2}})
    assert ok.status_code == 200
    assert server.engine.stats()["slots_in_use"] == 0
