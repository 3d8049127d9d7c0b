"""The Responses API's other kinds of tool, as OpenAI's Codex CLI sends them: `namespace` groups of
functions, `custom` free-form tools (held to their regex), and hosted tools accepted and left out.
Calls come back as `function_call` with `namespace`, or `custom_tool_call` with `input`, streamed
or not; later turns send them back as input items. The model is tiny and random: calls are made
certain by tool_choice "required" (grammar-constrained), never by luck."""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest

from server.responses.tool_kinds import ToolNames, chat_tools
from server.responses.protocol import FunctionTool
from tests.server.harness import RunningServer

STRING_ARG = {"type": "object", "properties": {"x": {"type": "string", "enum": ["a", "b"]}}, "required": ["x"],
              "additionalProperties": False}
NAMESPACE = {"type": "namespace", "name": "agents", "description": "sub-agents",
             "tools": [{"type": "function", "name": "spawn", "description": "start one", "parameters": STRING_ARG}]}
PATCH = {"type": "custom", "name": "apply_patch", "description": "a patch",
         "format": {"type": "grammar", "syntax": "regex", "definition": "PATCH [0-9]{3}"}}
HOSTED = {"type": "web_search", "external_web_access": False}


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none")


def _post(server: RunningServer, body: dict) -> httpx.Response:
    return httpx.post(server.url + "/v1/responses", json={"model": "tiny", "max_output_tokens": 160, **body}, timeout=120)


def test_a_namespaced_function_is_called_by_its_name_and_namespace(server: RunningServer) -> None:
    r = _post(server, {"input": "go", "tools": [NAMESPACE, HOSTED], "tool_choice": "required",
                       "parallel_tool_calls": False})
    assert r.status_code == 200, r.text
    (call,) = [item for item in r.json()["output"] if item["type"] == "function_call"]
    assert call["name"] == "spawn" and call["namespace"] == "agents"
    assert json.loads(call["arguments"])["x"] in ("a", "b")


def test_a_custom_tool_call_carries_its_free_form_input_streamed_or_not(server: RunningServer,
                                                                        client: openai.OpenAI) -> None:
    body = {"input": "patch it", "tools": [PATCH], "tool_choice": "required", "parallel_tool_calls": False}
    r = _post(server, body)
    assert r.status_code == 200, r.text
    (call,) = [item for item in r.json()["output"] if item["type"] != "message"]
    assert call["type"] == "custom_tool_call" and call["name"] == "apply_patch"
    assert re.fullmatch(r"PATCH [0-9]{3}", call["input"]), call
    with client.responses.stream(model="tiny", max_output_tokens=160, **body) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    assert "response.custom_tool_call_input.done" in kinds and "response.function_call_arguments.delta" not in kinds
    done = [e for e in events if e.type == "response.output_item.done" and e.item.type == "custom_tool_call"]
    assert done and re.fullmatch(r"PATCH [0-9]{3}", done[0].item.input)
    final = events[-1].response.output
    assert any(item.type == "custom_tool_call" for item in final)


def test_later_turns_send_the_calls_back_as_input_items(server: RunningServer) -> None:
    history = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "do both"}]},
        {"type": "function_call", "call_id": "c1", "name": "spawn", "namespace": "agents", "arguments": '{"x": "a"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "started"},
        {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "PATCH 123"},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "applied"},
    ]
    # (tool_choice none: the tiny model's 512-token context has no room for the tools described)
    r = _post(server, {"input": history, "tools": [NAMESPACE, PATCH, HOSTED], "tool_choice": "none",
                       "max_output_tokens": 4, "store": False,
                       "include": ["reasoning.encrypted_content"], "reasoning": {"summary": "auto"},
                       "prompt_cache_key": "k", "client_metadata": {"x": "y"}})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(("tools", "param"), [
    ([{"type": "namespace", "tools": []}], "tools[0].name"),
    ([{"type": "namespace", "name": "n", "tools": [HOSTED]}], "tools[0].tools[0].type"),
    ([NAMESPACE, {**NAMESPACE}], "tools"),
    ([{"type": "custom"}], "tools[0].name"),
    ([{"type": "rocket_launcher"}], "tools[0].type"),
])
def test_bad_tools_are_400s_naming_the_field(server: RunningServer, tools: list, param: str) -> None:
    r = _post(server, {"input": "x", "tools": tools})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_names_map_back_and_hosted_tools_are_left_out() -> None:
    tools = [FunctionTool(type=t["type"], name=t.get("name"), description=t.get("description"),
                          tools=[FunctionTool(**m) for m in t.get("tools", [])] or None, format=t.get("format"))
             for t in (NAMESPACE, PATCH, HOSTED)]
    functions, names = chat_tools(tools)
    assert [f.function.name for f in functions] == ["agents.spawn", "apply_patch"]
    assert functions[1].function.parameters["properties"]["input"]["pattern"] == "PATCH [0-9]{3}"
    item = {"type": "function_call", "id": "fc_1", "call_id": "c", "name": "agents.spawn", "arguments": "{}",
            "status": "completed"}
    assert names.qualify(item) == {**item, "name": "spawn", "namespace": "agents"}
    custom = names.qualify({**item, "name": "apply_patch", "arguments": '{"input": "PATCH 007"}'})
    assert custom["type"] == "custom_tool_call" and custom["input"] == "PATCH 007" and "arguments" not in custom
    assert ToolNames().qualify(item) == item  # a plain function stays as it is
