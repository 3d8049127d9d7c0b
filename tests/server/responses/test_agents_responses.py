"""The openai-agents SDK with its default model, the Responses API (OpenAIResponsesModel), unchanged,
against `python -m server` on a tiny random model: a full tool round trip (the model calls the tool
-> the SDK runs it and sends a function_call_output item -> the model gives its final answer),
plain and streamed.

How the round trip is made certain without faking the server: the agent forces its tool on the
first turn (`ModelSettings(tool_choice="get_weather")`), so the call's arguments are grammar-
constrained to the tool's schema; the SDK then resets tool_choice (`reset_tool_choice`, its
default), and the agent's `output_type` makes the final answer a JSON Schema (`text.format`) the
grammar holds the model to, which ends the turn (a Responses turn cut by max_output_tokens is
`incomplete`, which the SDK rightly treats as a failure, so free text from a random model could
not be relied on to end). While a call is forced, /v1/responses applies no `text.format`: a forced
call has no message for it to shape.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Literal

import openai
import pytest
from pydantic import BaseModel

from tests.server.harness import server_process
from tests.tiny_models import save_tiny_model


class Report(BaseModel):
    city: Literal["Paris", "Tokyo"]
    sunny: bool


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = save_tiny_model("qwen2", tmp_path_factory.mktemp("agents-responses"))
    with server_process("--model", str(folder), "--served-model-name", "tiny", "--dtype", "float32",
                        "--kv-cache-tokens", "4096", "--log-level", "warning") as url:
        yield url


@pytest.mark.parametrize("streamed", [False, True])
def test_agents_sdk_responses_model_round_trip(url: str, streamed: bool) -> None:
    from agents import (
        Agent,
        ModelSettings,
        Runner,
        ToolCallItem,
        ToolCallOutputItem,
        function_tool,
        set_default_openai_client,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    set_default_openai_client(openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0),
                              use_for_tracing=False)
    ran: list[str] = []

    @function_tool
    def get_weather(city: Literal["Paris", "Tokyo"]) -> str:
        """The weather in a city."""
        ran.append(city)
        return f"sunny, 21 C in {city}"

    agent = Agent(name="weather", instructions="Answer with the weather.", tools=[get_weather], model="tiny",
                  output_type=Report, model_settings=ModelSettings(tool_choice="get_weather", max_tokens=96,
                                                                   parallel_tool_calls=False))

    async def run() -> object:
        if not streamed:
            return await Runner.run(agent, "What is the weather in Paris?", max_turns=3)
        result = Runner.run_streamed(agent, "What is the weather in Paris?", max_turns=3)
        kinds = {event.type async for event in result.stream_events()}
        assert {"raw_response_event", "run_item_stream_event"} <= kinds
        return result

    result = asyncio.run(run())
    call = next(item for item in result.new_items if isinstance(item, ToolCallItem))
    output = next(item for item in result.new_items if isinstance(item, ToolCallOutputItem))
    assert call.raw_item.type == "function_call" and call.raw_item.name == "get_weather"
    assert output.output.startswith("sunny") and len(ran) == 1
    # The SDK's default model for a model name is OpenAIResponsesModel: both turns went to /v1/responses.
    assert [r.response_id[:5] for r in result.raw_responses] == ["resp_", "resp_"]
    answer = result.raw_responses[-1]
    assert [item.type for item in answer.output] == ["message"]
    assert isinstance(result.final_output, Report)
    assert result.final_output == Report.model_validate_json(answer.output[0].content[0].text)
    assert answer.usage.input_tokens_details.cached_tokens > 0  # the first turn's prompt, cached
