"""The built-in Qwen2.5-Coder-1.5B-Instruct calling tools through `python -m server`, as a user runs it.

Slow (needs the `coder-model` extra; the first run converts the GGUF once): the server is started
with `--model qwen2.5-coder-1.5b-instruct` and the openai SDK asks it, greedy, for one tool call
and for a two-step chain whose second call takes the first one's result.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.runtime.loading.test_coder_model import needs_coder_model
from tests.server.harness import server_process

pytestmark = [pytest.mark.slow, needs_coder_model]

MODEL = "qwen2.5-coder-1.5b-instruct"
SYSTEM = "You are a helpful assistant. Use a tool when one can answer the question."


def _tool(name: str, description: str, argument: str) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {argument: {"type": "string"}}, "required": [argument]}}}


TOOLS = [_tool("calculator", "Evaluate an arithmetic expression and return the number", "expression"),
         _tool("get_capital", "Look up the capital city of a country", "country"),
         _tool("get_weather", "Current weather in a city", "city")]


@pytest.fixture(scope="module")
def client() -> Iterator[object]:
    from openai import OpenAI

    with server_process("--model", MODEL, "--log-level", "warning", timeout=900) as url:
        yield OpenAI(base_url=url + "/v1", api_key="none", timeout=900)


def _calls(client, messages: list[dict]) -> tuple[str | None, list]:  # noqa: ANN001 - an openai.OpenAI
    reply = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="auto",
                                           temperature=0, max_tokens=96)
    return reply.choices[0].finish_reason, reply.choices[0].message.tool_calls or []


def test_one_call_through_the_openai_sdk(client) -> None:  # noqa: ANN001
    finish, calls = _calls(client, [{"role": "system", "content": SYSTEM},
                                    {"role": "user", "content": "What is 37 times 41?"}])
    assert finish == "tool_calls" and [c.function.name for c in calls] == ["calculator"]
    assert json.loads(calls[0].function.arguments)["expression"].replace(" ", "") == "37*41"


def test_a_two_step_chain_uses_the_first_result(client) -> None:  # noqa: ANN001
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "First look up the capital of Australia, then get the weather in that city."}]
    _, first = _calls(client, messages)
    assert [(c.function.name, json.loads(c.function.arguments)) for c in first][:1] == \
        [("get_capital", {"country": "Australia"})]
    call = first[0]
    messages += [{"role": "assistant", "content": None, "tool_calls": [
                     {"id": call.id, "type": "function",
                      "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
                 {"role": "tool", "tool_call_id": call.id, "content": "Canberra"}]
    finish, second = _calls(client, messages)
    assert finish == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments).get("city")) for c in second] == \
        [("get_weather", "Canberra")]
