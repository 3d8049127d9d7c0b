"""/v1/responses as SGLang's and vLLM's users send it (issue #41): tool_choice "auto" with no tools
(the Responses API's default) is no error, and usage carries the Chat Completions names beside
OpenAI's."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.server.harness import RunningServer

GREEDY = {"temperature": 0, "max_output_tokens": 4}


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def test_tool_choice_auto_without_tools_is_the_default(client: openai.OpenAI) -> None:
    answer = client.responses.create(model="tiny", input="hello", tool_choice="auto", **GREEDY)
    assert answer.status in ("completed", "incomplete") and answer.output[0].type == "message"
    assert answer.tool_choice == "auto"  # echoed as asked, as OpenAI does


def test_tool_choice_required_without_tools_is_still_a_400(server: RunningServer) -> None:
    response = httpx.post(server.url + "/v1/responses", timeout=60,
                          json={"model": "tiny", "input": "hi", "tool_choice": "required"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "tool_choice"


def test_usage_has_both_names(client: openai.OpenAI) -> None:
    answer = client.responses.create(model="tiny", input="hello there", **GREEDY)
    extra = answer.usage.model_extra or {}
    assert extra["prompt_tokens"] == answer.usage.input_tokens > 0
    assert extra["completion_tokens"] == answer.usage.output_tokens > 0
    events = list(client.responses.create(model="tiny", input="hello there", stream=True, **GREEDY))
    final = events[-1].response  # response.completed, or response.incomplete when max_output_tokens cut it
    extra = final.usage.model_extra or {}
    assert extra["prompt_tokens"] == final.usage.input_tokens
    assert extra["completion_tokens"] == final.usage.output_tokens
