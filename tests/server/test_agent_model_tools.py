"""The built-in agent model (Qwen2.5-Coder-0.5B-Instruct) calling tools through the real server.

Slow (`make test-all` installs the `agent-model` extra): one engine on the real model behind a
real uvicorn server on 127.0.0.1, the server's own `--tool-call-parser auto`; the openai client,
the OpenAI Agents SDK and LangGraph as a user runs them. Greedy, so the answers are the model's
own, not luck; each request is bounded by max_tokens.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.runtime.loading.test_agent_model import needs_agent_model
from tests.server.harness import RunningServer, serve

pytestmark = [pytest.mark.slow, needs_agent_model]

CAPITALS = {"australia": "Canberra", "canada": "Ottawa", "japan": "Tokyo"}
CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression such as 37 * 41",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
GET_CAPITAL = {"type": "function", "function": {
    "name": "get_capital", "description": "Look up the capital city of a country",
    "parameters": {"type": "object", "properties": {"country": {"type": "string"}}, "required": ["country"]}}}
TOOLS = [CALCULATOR, GET_CAPITAL]
SYSTEM = "You are a helpful assistant. Use a tool when one can answer the question."


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    from runtime import Engine

    with Engine(model="agent", kv_cache_tokens=16384, max_running_requests=4) as engine, serve(engine) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: RunningServer):  # noqa: ANN201 - an openai.OpenAI
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="none", timeout=900)


def _ask(question: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def test_auto_picks_the_models_parser_and_the_call_fits_the_schema(server: RunningServer, client) -> None:  # noqa: ANN001
    import httpx
    import jsonschema

    info = httpx.get(server.url + "/get_server_info", timeout=30).json()
    assert info["tool_call_parser_resolved"] == "qwen25_coder"
    reply = client.chat.completions.create(model="agent", messages=_ask("What is 37 times 41?"), tools=TOOLS,
                                           tool_choice="auto", temperature=0, max_tokens=64)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    assert call.function.name == "calculator"
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, CALCULATOR["function"]["parameters"])
    assert arguments["expression"].replace(" ", "") == "37*41"


def test_streamed_and_whole_give_the_same_calls(client) -> None:  # noqa: ANN001
    kwargs = {"model": "agent", "messages": _ask("What is the capital of Japan?"), "tools": TOOLS,
              "tool_choice": "auto", "temperature": 0, "max_tokens": 64}
    whole = client.chat.completions.create(**kwargs).choices[0].message.tool_calls
    calls: dict[int, list[str]] = {}
    finish = None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                entry = calls.setdefault(delta.index, ["", ""])
                if delta.function is not None:
                    entry[0] += delta.function.name or ""
                    entry[1] += delta.function.arguments or ""
    assert finish == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in whole] == \
        [(name, json.loads(args)) for name, args in calls.values()] == [("get_capital", {"country": "Japan"})]


def test_the_second_turn_of_an_agent_loop_hits_the_prefix_cache(server: RunningServer, client) -> None:  # noqa: ANN001
    tokenizer = server.engine.tokenizer.hf
    head = len(tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM}], tools=TOOLS, tokenize=True,
                                             add_generation_prompt=False, return_dict=False))
    messages = _ask("What is the capital of Canada?")
    first = client.chat.completions.create(model="agent", messages=messages, tools=TOOLS, temperature=0, max_tokens=64)
    call = first.choices[0].message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_capital", {"country": "Canada"})
    messages += [{"role": "assistant", "content": None, "tool_calls": [
                     {"id": call.id, "type": "function",
                      "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
                 {"role": "tool", "tool_call_id": call.id, "content": "Ottawa"}]
    second = client.chat.completions.create(model="agent", messages=messages, tools=TOOLS, temperature=0, max_tokens=64)
    assert "Ottawa" in (second.choices[0].message.content or "")
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached > head  # the system prompt, the tools and the first turn were reused
    assert cached >= first.usage.prompt_tokens - 1


def test_openai_agents_sdk_round_trip(server: RunningServer) -> None:
    agents = pytest.importorskip("agents")
    from openai import AsyncOpenAI

    seen: list[str] = []

    @agents.function_tool
    def get_capital(country: str) -> str:
        """Look up the capital city of a country."""
        seen.append(country)
        return CAPITALS.get(country.lower(), "unknown")

    agents.set_tracing_disabled(True)  # nothing leaves this machine
    model = agents.OpenAIChatCompletionsModel(model="agent", openai_client=AsyncOpenAI(
        base_url=server.url + "/v1", api_key="none", timeout=900))
    agent = agents.Agent(name="geographer", instructions="Answer with the help of your tools.", tools=[get_capital],
                         model=model, model_settings=agents.ModelSettings(temperature=0, max_tokens=100))
    result = agents.Runner.run_sync(agent, "What is the capital of Australia?")
    assert seen == ["Australia"]
    assert "Canberra" in result.final_output


def test_langgraph_react_agent_round_trip(server: RunningServer) -> None:
    prebuilt = pytest.importorskip("langgraph.prebuilt")
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    seen: list[str] = []

    @tool
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression such as 37 * 41."""
        seen.append(expression)
        if not set(expression) <= set("0123456789+-*/(). "):
            return "error: only arithmetic"
        return str(eval(expression, {"__builtins__": {}}))  # noqa: S307 - digits and operators only

    model = ChatOpenAI(base_url=server.url + "/v1", api_key="none", model="agent", temperature=0, max_tokens=100,
                       timeout=900)
    agent = prebuilt.create_react_agent(model, [calculator])
    state = agent.invoke({"messages": [("user", "What is 37 times 41?")]})
    assert [s.replace(" ", "") for s in seen] == ["37*41"]
    assert state["messages"][-1].type == "ai" and "1517" in state["messages"][-1].content
