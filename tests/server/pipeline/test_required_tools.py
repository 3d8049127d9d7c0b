"""tool_choice "required" as OpenAI, vLLM and SGLang take it (issue #41): parameters that use local
`$defs` / `$ref` (what pydantic writes for nested models), and one call or more (parallel calls)
unless parallel_tool_calls is false. The tiny model is random: the calls are valid because the
grammar holds them."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from server.parsers.tools.forced import RequiredParser
from server.pipeline.request import ChatCompletionRequest, Tool
from server.pipeline.structured import constraint_for, tool_specs
from tests.server.harness import RunningServer

# What pydantic's model_json_schema() gives for nested models: references into the schema's own $defs.
PLACE = {"type": "function", "function": {"name": "book", "parameters": {
    "type": "object",
    "properties": {"where": {"$ref": "#/$defs/Location"}, "nights": {"type": "integer", "minimum": 1, "maximum": 9}},
    "required": ["where", "nights"],
    "$defs": {"Location": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]},
                                                            "near": {"anyOf": [{"$ref": "#/$defs/Landmark"},
                                                                               {"type": "null"}]}},
                           "required": ["city", "near"], "additionalProperties": False},
              "Landmark": {"type": "object", "properties": {"name": {"enum": ["tower", "bridge"]}},
                           "required": ["name"], "additionalProperties": False}}}}}
PING = {"type": "function", "function": {"name": "ping", "parameters": {
    "type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 3}}, "required": ["n"],
    "additionalProperties": False}}}
MESSAGES = [{"role": "user", "content": "Book two nights in Rome."}]


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def _valid_place(args: dict) -> bool:
    where = args["where"]
    near = where["near"]
    return (where["city"] in ("Paris", "Rome") and (near is None or near["name"] in ("tower", "bridge"))
            and 1 <= args["nights"] <= 9)


def test_required_with_defs_and_refs(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=[PLACE, PING], max_tokens=200,
                                          tool_choice="required", temperature=0)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    for call in choice.message.tool_calls:
        args = json.loads(call.function.arguments)
        assert _valid_place(args) if call.function.name == "book" else 0 <= args["n"] <= 3


def test_required_streams_the_same_calls(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=[PLACE], max_tokens=200,
                                           tool_choice="required", temperature=0).choices[0].message.tool_calls
    chunks = list(client.chat.completions.create(model="tiny", messages=MESSAGES, tools=[PLACE], max_tokens=200,
                                                 tool_choice="required", temperature=0, stream=True))
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    streamed: dict[int, list[str]] = {}
    for tc in deltas:
        streamed.setdefault(tc.index, []).append(tc.function.arguments or "")
    assert ["".join(parts) for _, parts in sorted(streamed.items())] == [c.function.arguments for c in whole]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_parallel_tool_calls_false_is_one_call(client: openai.OpenAI) -> None:
    for seed in range(3):
        resp = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=[PLACE, PING], max_tokens=200,
                                              tool_choice="required", parallel_tool_calls=False, temperature=1.0,
                                              seed=seed)
        assert len(resp.choices[0].message.tool_calls) == 1


def test_the_constraint_allows_several_calls(server: RunningServer) -> None:
    """The required grammar takes a list of two calls (and, without parallel calls, refuses it);
    the parser reads both back."""
    body = ChatCompletionRequest(messages=[], tools=[Tool(**_tool(PLACE)), Tool(**_tool(PING))],
                                 tool_choice="required")
    two = json.dumps([{"name": "ping", "arguments": {"n": 2}},
                      {"name": "book", "arguments": {"where": {"city": "Rome", "near": {"name": "bridge"}},
                                                     "nights": 2}}])
    grammars = server.engine.grammars
    ids = server.engine.tokenizer.hf(two, add_special_tokens=False).input_ids

    def accepts(parallel: bool | None) -> bool:
        body.parallel_tool_calls = parallel
        matcher = grammars.matcher(grammars.compile("json_schema", constraint_for(body).params["json_schema"]))
        return all(matcher.accept_token(t) for t in ids)

    assert accepts(None) and accepts(True) and not accepts(False)
    parsed = RequiredParser(tool_specs(body)).parse(two, final=True)
    assert [c.name for c in parsed.calls] == ["ping", "book"] and parsed.content == ""


def test_bad_tool_schemas_stay_400(server: RunningServer) -> None:
    bad_ref = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"$ref": "#/$defs/Missing"}}}}}
    for body, param in [({"tools": [bad_ref], "tool_choice": "required"}, None),
                        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
                          "tool_choice": "required"}, "tools[0].function.parameters"),
                        ({"tools": [PING], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
                         "tool_choice")]:
        resp = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                          json={"model": "tiny", "messages": MESSAGES, "max_tokens": 4, **body})
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert error["type"] == "invalid_request_error" and error["message"]
        if param is not None:
            assert error["param"] == param


def _tool(spec: dict) -> dict:
    from server.pipeline.request import FunctionDef

    return {"type": "function", "function": FunctionDef(**spec["function"])}
