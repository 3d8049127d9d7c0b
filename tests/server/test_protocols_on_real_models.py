"""Anthropic's and Ollama's clients, unchanged, against the real models (slow).

The default model (Gemma 3 270M, a base model) behind `python -m server` as a user starts it:
few-shot text through /api/generate (raw) and /v1/messages, the model routes, embeddings, and a
re-sent prompt read whole from the cache. The built-in agent model (Qwen2.5-Coder-0.5B-Instruct,
`make test-all` installs it): a tool round trip through each protocol, greedy, so the calls and
answers are the model's own.
"""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import ollama
import pytest

from tests.runtime.loading.test_agent_model import needs_agent_model
from tests.server.harness import RunningServer, serve, server_process

pytestmark = pytest.mark.slow

FEW_SHOT = "Q: What is the capital of Germany?\nA: Berlin\nQ: What is the capital of France?\nA:"
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def default_url() -> Iterator[str]:
    with server_process("--model", "default", "--log-level", "warning") as url:
        yield url


def test_ollama_client_on_the_default_model(default_url: str) -> None:
    client = ollama.Client(host=default_url, timeout=600)
    (listed,) = client.list().models
    assert listed.model == "gemma-3-270m:latest" and listed.details.family.startswith("gemma3")
    assert "completion" in client.show("gemma-3-270m").capabilities
    answer = client.generate(model="gemma-3-270m", prompt=FEW_SHOT, raw=True,
                             options={"num_predict": 4, "temperature": 0})
    assert "Paris" in answer.response and answer.done
    vectors = client.embed(model="gemma-3-270m", input=["a passage about Paris", "another"]).embeddings
    assert len(vectors) == 2 and abs(sum(x * x for x in vectors[0]) - 1) < 1e-3


def test_anthropic_client_on_the_default_model(default_url: str) -> None:
    client = anthropic.Anthropic(base_url=default_url, api_key="unused", max_retries=0, timeout=600)
    ask = [{"role": "user", "content": FEW_SHOT}]
    counted = client.messages.count_tokens(model="gemma-3-270m", messages=ask).input_tokens
    first = client.messages.create(model="gemma-3-270m", max_tokens=8, messages=ask, extra_body=GREEDY)
    assert first.content[0].type == "text" and first.stop_reason in ("end_turn", "max_tokens")
    with client.messages.stream(model="gemma-3-270m", max_tokens=8, messages=ask, extra_body=GREEDY) as stream:
        again = stream.get_final_message()
    assert again.content[0].text == first.content[0].text
    assert again.usage.cache_read_input_tokens == counted  # the same prompt: read whole from the cache


# -- the agent model: tools ---------------------------------------------------------------------------

SYSTEM = "You are a helpful assistant. Use a tool when one can answer the question."
GET_CAPITAL = {"name": "get_capital", "description": "Look up the capital city of a country",
               "input_schema": {"type": "object", "properties": {"country": {"type": "string"}},
                                "required": ["country"]}}


@pytest.fixture(scope="module")
def agent() -> Iterator[RunningServer]:
    from runtime import Engine

    with Engine(model="agent", kv_cache_tokens=16384, max_running_requests=4) as engine, serve(engine) as running:
        yield running


@needs_agent_model
def test_anthropic_tool_round_trip_on_the_agent_model(agent: RunningServer) -> None:
    client = anthropic.Anthropic(base_url=agent.url, api_key="unused", max_retries=0, timeout=900)
    messages = [{"role": "user", "content": "What is the capital of Japan?"}]
    first = client.messages.create(model="agent", max_tokens=64, system=SYSTEM, messages=messages,
                                   tools=[GET_CAPITAL], extra_body=GREEDY)
    assert first.stop_reason == "tool_use"
    (call,) = [b for b in first.content if b.type == "tool_use"]
    assert call.name == "get_capital" and call.input == {"country": "Japan"}
    messages += [{"role": "assistant", "content": first.content},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Tokyo"}]}]
    second = client.messages.create(model="agent", max_tokens=64, system=SYSTEM, messages=messages,
                                    tools=[GET_CAPITAL], extra_body=GREEDY)
    assert second.stop_reason == "end_turn" and "Tokyo" in second.content[-1].text
    assert second.usage.cache_read_input_tokens >= first.usage.input_tokens - 1  # the first turn, cached


@needs_agent_model
def test_ollama_tool_round_trip_on_the_agent_model(agent: RunningServer) -> None:
    client = ollama.Client(host=agent.url, timeout=900)
    tool = {"type": "function", "function": {"name": GET_CAPITAL["name"], "description": GET_CAPITAL["description"],
                                              "parameters": GET_CAPITAL["input_schema"]}}
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is the capital of Canada?"}]
    options = {"num_predict": 64, "temperature": 0}
    first = client.chat(model="agent", messages=messages, tools=[tool], options=options)
    (call,) = first.message.tool_calls
    assert call.function.name == "get_capital" and call.function.arguments == {"country": "Canada"}
    messages += [first.message, {"role": "tool", "tool_name": "get_capital", "content": "Ottawa"}]
    second = client.chat(model="agent", messages=messages, tools=[tool], options=options)
    assert "Ottawa" in second.message.content and not second.message.tool_calls
