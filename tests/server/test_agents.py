"""Agent frameworks, unchanged, against `python -m server`: each completes a full tool round trip
(the model calls a tool -> the framework runs it and sends the result -> the model answers).

How the round trip is made certain on a tiny random model without faking the server: see
tests/server/agent_model.py. Its chat template ends the generation prompt with `<tool_call>`
when the user spoke last, so the server's grammar (tool_choice auto: a structural tag that starts
inside the opened call) makes the model write a valid call of one of the tools; after the tool's
result the prompt opens nothing and the model answers in free text, bounded by max_tokens. The
frameworks send `tools` with tool_choice unset (auto), parse our tool_calls, run the tool, send
a `tool` message with the call id, and finish on the text answer. parallel_tool_calls=False
keeps it to one call per turn (a random model would otherwise chain a random number of them).

One server for the whole module.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import httpx
import openai
import pytest

from tests.server.agent_model import save_agent_model
from tests.server.harness import server_process

MAX_TOKENS = 96  # room for a call spelled byte by byte (about 75 characters)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
                   "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def weather(city: str) -> str:
    return f"sunny, 21 C in {city}"


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = save_agent_model(tmp_path_factory.mktemp("agent-model"))
    with server_process("--model", str(folder), "--served-model-name", "tiny", "--dtype", "float32",
                        "--kv-cache-tokens", "4096", "--log-level", "warning") as url:
        yield url


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)


def test_auto_is_the_default_and_the_server_says_which_parser(client: openai.OpenAI, url: str) -> None:
    info = httpx.get(url + "/get_server_info").json()
    assert info["tool_call_parser"] == "auto" and info["tool_call_parser_resolved"] == "hermes"
    resp = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], max_tokens=MAX_TOKENS,
                                          parallel_tool_calls=False)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Tokyo")


def test_parallel_calls_are_each_valid(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], max_tokens=160)
    choice = resp.choices[0]
    calls = choice.message.tool_calls
    complete = calls if choice.finish_reason == "tool_calls" else calls[:-1]  # max_tokens may cut the last
    assert choice.finish_reason in ("tool_calls", "length") and len({c.id for c in calls}) == len(calls)
    assert all(json.loads(c.function.arguments)["city"] in ("Paris", "Tokyo") for c in complete)


def test_streamed_auto_call_arrives_in_fragments(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], max_tokens=MAX_TOKENS,
                                                 stream=True, parallel_tool_calls=False))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [tc for d in deltas for tc in d.tool_calls or []]
    assert calls[0].id and calls[0].function.name == "get_weather" and calls[0].function.arguments == ""
    assert len(calls) > 2 and all(tc.index == 0 for tc in calls)
    assert json.loads("".join(tc.function.arguments or "" for tc in calls))["city"] in ("Paris", "Tokyo")
    assert not "".join(d.content or "" for d in deltas)  # no markup in content
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_after_the_tool_result_the_model_answers_in_text(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], max_tokens=MAX_TOKENS,
                                           parallel_tool_calls=False)
    call = first.choices[0].message.tool_calls[0]
    follow = [*ASK, first.choices[0].message.model_dump(exclude_none=True),
              {"role": "tool", "tool_call_id": call.id, "content": weather("Paris")}]
    second = client.chat.completions.create(model="tiny", messages=follow, tools=[WEATHER], max_tokens=16)
    assert second.choices[0].message.tool_calls is None
    assert second.choices[0].finish_reason in ("stop", "length")
    plain = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], tool_choice="none",
                                           max_tokens=8)
    assert plain.choices[0].message.tool_calls is None and plain.choices[0].finish_reason in ("stop", "length")


def test_openai_agents_sdk_runner(url: str) -> None:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        ToolCallItem,
        ToolCallOutputItem,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    ran: list[str] = []

    @function_tool
    def get_weather(city: Literal["Paris", "Tokyo"]) -> str:
        """The weather in a city."""
        ran.append(city)
        return weather(city)

    model = OpenAIChatCompletionsModel(model="tiny", openai_client=openai.AsyncOpenAI(base_url=url + "/v1",
                                                                                       api_key="none"))
    agent = Agent(name="weather", instructions="Answer with the weather.", tools=[get_weather], model=model,
                  model_settings=ModelSettings(max_tokens=MAX_TOKENS, parallel_tool_calls=False))
    result = Runner.run_sync(agent, "What is the weather in Paris?", max_turns=3)
    kinds = [type(item) for item in result.new_items]
    assert ToolCallItem in kinds and ToolCallOutputItem in kinds and len(ran) == 1
    assert isinstance(result.final_output, str)


def test_langgraph_react_agent_over_langchain_openai(url: str) -> None:
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    @tool
    def get_weather(city: Literal["Paris", "Tokyo"]) -> str:
        """The weather in a city."""
        return weather(city)

    llm = ChatOpenAI(model="tiny", base_url=url + "/v1", api_key="none", max_tokens=MAX_TOKENS, max_retries=0)
    agent = create_react_agent(llm.bind_tools([get_weather], parallel_tool_calls=False), [get_weather])
    messages = agent.invoke({"messages": [("user", "What is the weather in Paris?")]},
                            {"recursion_limit": 6})["messages"]
    asked, answered, final = messages[1], messages[2], messages[-1]
    assert isinstance(asked, AIMessage) and asked.tool_calls[0]["name"] == "get_weather"
    assert isinstance(answered, ToolMessage) and answered.content.startswith("sunny")
    assert isinstance(final, AIMessage) and not final.tool_calls and len(messages) == 4


def test_pydantic_ai_agent_with_a_tool(url: str) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ToolCallPart, ToolReturnPart
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("tiny", provider=OpenAIProvider(base_url=url + "/v1", api_key="none"))
    agent = Agent(model, model_settings={"max_tokens": MAX_TOKENS, "parallel_tool_calls": False})

    @agent.tool_plain
    def get_weather(city: Literal["Paris", "Tokyo"]) -> str:
        """The weather in a city."""
        return weather(city)

    result = agent.run_sync("What is the weather in Paris?")
    parts = [part for message in result.all_messages() for part in message.parts]
    assert any(isinstance(p, ToolCallPart) and p.tool_name == "get_weather" for p in parts)
    assert any(isinstance(p, ToolReturnPart) and str(p.content).startswith("sunny") for p in parts)
    assert isinstance(result.output, str)


def test_reasoning_and_template_kwargs(client: openai.OpenAI, url: str) -> None:
    assert httpx.get(url + "/get_server_info").json()["reasoning_parser_resolved"] == "qwen3"  # <think> in template
    think = {"chat_template_kwargs": {"think": True}}  # the template then opens <think> in the prompt
    resp = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=8, temperature=0, extra_body=think)
    plain = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=8, temperature=0)
    message = resp.choices[0].message
    assert resp.usage.prompt_tokens > plain.usage.prompt_tokens  # the kwarg reached the template
    assert message.reasoning_content and not message.content  # a random model never closes </think>
    assert plain.choices[0].message.reasoning_content is None
    chunks = list(client.chat.completions.create(model="tiny", messages=ASK, max_tokens=8, temperature=0,
                                                 stream=True, extra_body=think))
    streamed = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    assert streamed == message.reasoning_content
    r1 = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=8, temperature=0,
                                        extra_body={"reasoning_parser": "deepseek_r1"})  # reasons until </think>
    assert r1.choices[0].message.reasoning_content == plain.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=ASK, max_tokens=2,
                                       extra_body={"chat_template_kwargs": {"tokenize": True}})
    assert err.value.body["param"] == "chat_template_kwargs.tokenize"


@pytest.mark.parametrize("body,param", [
    ({"tools": [WEATHER], "tool_call_parser": "nope"}, "tool_call_parser"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "tools[0].function.parameters"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "absent"}}}, "tool_choice"),
    ({"messages": [*ASK, {"role": "tool", "tool_call_id": "call_unknown", "content": "x"}]}, "messages[1].tool_call_id"),
])
def test_bad_agent_input_is_a_400_naming_the_field(url: str, client: openai.OpenAI, body: dict, param: str) -> None:
    resp = httpx.post(url + "/v1/chat/completions", json={"model": "tiny", "messages": ASK, "max_tokens": 4, **body},
                      timeout=60)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param
    ok = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=2)
    assert ok.choices[0].finish_reason in ("stop", "length")
