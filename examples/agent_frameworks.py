"""Three agent frameworks, unchanged, against radixserve's OpenAI routes: the openai-agents SDK,
LangGraph's prebuilt ReAct agent (langchain-openai) and pydantic-ai, each with one tool.

    python -m server --model agent --port 30000        # Qwen2.5-Coder-0.5B-Instruct, built in
    python examples/agent_frameworks.py --url http://127.0.0.1:30000 --model agent

The frameworks send `tools` with tool_choice unset ("auto"); the server parses the model's own
tool-call format into `tool_calls` (see docs/agents.md).
"""

from __future__ import annotations

import argparse
import time

MAX_TOKENS = 256  # per model call (--max-tokens): a small model that rambles still finishes


def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny, 21 C in {city}"


def openai_agents(url: str, model: str) -> str:
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # no OpenAI key here: keep traces local
    client = AsyncOpenAI(base_url=url + "/v1", api_key="unused")
    agent = Agent(name="weather", instructions="Use your tools, then answer in one sentence.",
                  tools=[function_tool(get_weather)], model=OpenAIChatCompletionsModel(model=model, openai_client=client),
                  model_settings=ModelSettings(max_tokens=MAX_TOKENS))
    result = Runner.run_sync(agent, "What is the weather in Paris?", max_turns=4)
    return f"{[type(i).__name__ for i in result.new_items]} -> {result.final_output!r}"


def langgraph(url: str, model: str) -> str:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    llm = ChatOpenAI(model=model, base_url=url + "/v1", api_key="unused", max_tokens=MAX_TOKENS)
    agent = create_react_agent(llm, [tool(get_weather)])
    messages = agent.invoke({"messages": [("user", "What is the weather in Paris?")]}, {"recursion_limit": 8})["messages"]
    return " -> ".join(f"{type(m).__name__}({getattr(m, 'tool_calls', None) or m.content!r})" for m in messages)


def pydantic_ai(url: str, model: str) -> str:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    agent = Agent(OpenAIChatModel(model, provider=OpenAIProvider(base_url=url + "/v1", api_key="unused")),
                  tools=[get_weather], instructions="Use your tools, then answer in one sentence.",
                  model_settings={"max_tokens": MAX_TOKENS})
    result = agent.run_sync("What is the weather in Paris?")
    parts = [type(p).__name__ for m in result.all_messages() for p in m.parts]
    return f"{parts} -> {result.output!r}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    parser.add_argument("--model", default="agent")
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    args = parser.parse_args()
    globals()["MAX_TOKENS"] = args.max_tokens
    for run in (openai_agents, langgraph, pydantic_ai):
        start = time.perf_counter()
        print(f"{run.__name__}: {run(args.url, args.model)}  ({time.perf_counter() - start:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
