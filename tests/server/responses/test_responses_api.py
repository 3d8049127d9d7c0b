"""POST /v1/responses with the real openai SDK over HTTP: text and function-call items, the streaming
events, previous_response_id continuing a stored turn with its own tokens (cached_tokens shows the
whole earlier conversation), the store's bounds, and bad input as 400s naming the field.

The model is tiny and random: function calls are made certain by a named or "required" tool_choice
(the call's JSON is grammar-constrained), never by luck.
"""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from tests.server.harness import RunningServer, serve

TOOLS = [{"type": "function", "name": "get_weather", "description": "the weather in a city", "strict": True,
          "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                         "required": ["city"], "additionalProperties": False}}]
GREEDY = {"temperature": 0, "max_output_tokens": 6}


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none")


def _whole(usage: object) -> int:
    return usage.input_tokens + usage.output_tokens  # type: ignore[attr-defined]


def test_text_turns_continue_with_their_own_tokens(client: openai.OpenAI) -> None:
    first = client.responses.create(model="tiny", input="Hello there", instructions="Be brief.", **GREEDY)
    assert first.object == "response" and first.id.startswith("resp_")
    assert first.status in ("completed", "incomplete")
    (item,) = first.output
    assert item.type == "message" and item.role == "assistant" and item.content[0].type == "output_text"
    assert first.output_text == item.content[0].text
    assert first.usage.output_tokens > 0 and first.usage.total_tokens == _whole(first.usage)
    turn = first
    for text in ("And then?", "And after that?"):  # a chain: each turn continues the one before
        nxt = client.responses.create(model="tiny", input=text, instructions="Be brief.",
                                      previous_response_id=turn.id, **GREEDY)
        assert nxt.previous_response_id == turn.id
        # The prompt starts with the earlier turn's prompt and output tokens, still cached (pinned);
        # only the last one was never computed (page size 1).
        assert nxt.usage.input_tokens > _whole(turn.usage)
        assert nxt.usage.input_tokens_details.cached_tokens >= _whole(turn.usage) - 1
        turn = nxt
    assert client.responses.retrieve(turn.id).output_text == turn.output_text


def test_function_call_round_trip(client: openai.OpenAI) -> None:
    call = client.responses.create(model="tiny", input="What is the weather in Paris?", tools=TOOLS,
                                   tool_choice={"type": "function", "name": "get_weather"}, temperature=0,
                                   max_output_tokens=60)
    assert call.status == "completed"
    (item,) = call.output
    assert item.type == "function_call" and item.name == "get_weather" and item.call_id.startswith("call_")
    assert item.arguments in ('{"city": "Paris"}', '{"city": "Rome"}')
    answer = client.responses.create(
        model="tiny", previous_response_id=call.id, tools=TOOLS, tool_choice="none", **GREEDY,
        input=[{"type": "function_call_output", "call_id": item.call_id, "output": "sunny, 24 C"}])
    assert answer.output[0].type == "message"
    assert answer.usage.input_tokens_details.cached_tokens >= _whole(call.usage) - 1
    # The same round trip with the whole conversation sent again (what the Agents SDK does).
    resent = client.responses.create(model="tiny", tools=TOOLS, tool_choice="none", **GREEDY, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "What is the weather in Paris?"}]},
        {"type": "function_call", "call_id": item.call_id, "name": item.name, "arguments": item.arguments},
        {"type": "function_call_output", "call_id": item.call_id, "output": "sunny, 24 C"}])
    assert resent.output[0].type == "message" and resent.usage.input_tokens_details.cached_tokens > 0


def test_streamed_text_events(client: openai.OpenAI) -> None:
    events = list(client.responses.create(model="tiny", input="Stream it", stream=True, **GREEDY))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete" if events[-1].response.status == "incomplete" else "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = next(e for e in events if e.type == "response.output_text.done")
    final = events[-1].response
    assert done.text == text == final.output_text
    assert client.responses.retrieve(final.id).output_text == text


def test_streamed_function_call(client: openai.OpenAI) -> None:
    with client.responses.stream(model="tiny", input="Weather in Rome?", tools=TOOLS, tool_choice="required",
                                 temperature=0, max_output_tokens=120) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert "response.output_text.delta" not in kinds  # no call markup reaches the text
    added = next(e for e in events if e.type == "response.output_item.added")
    assert added.item.type == "function_call" and added.item.name == "get_weather"
    fragments = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    (item,) = final.output
    assert len(fragments) > 1 and "".join(fragments) == done.arguments == item.arguments
    assert item.call_id == added.item.call_id


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "hi", "previous_response_id": "resp_unknown"}, "previous_response_id"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
    ({"input": "hi", "tools": [{"type": "rocket_launcher"}]}, "tools[0].type"),  # (web_search: accepted, hosted)
    ({"input": "hi", "tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "hi", "background": True}, "background"),
    ({}, "input"),
])
def test_bad_requests_name_the_field(server: RunningServer, body: dict, param: str) -> None:
    response = httpx.post(server.url + "/v1/responses", json={"model": "tiny", **body}, timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_store_false_get_delete_and_unknown_ids(server: RunningServer, client: openai.OpenAI) -> None:
    unstored = client.responses.create(model="tiny", input="hi", store=False, **GREEDY)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="tiny", input="hi", previous_response_id=unstored.id, **GREEDY)
    kept = client.responses.create(model="tiny", input="hi", **GREEDY)
    client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(kept.id)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="tiny", input="hi", previous_response_id=kept.id, **GREEDY)


def test_the_store_is_bounded(server: RunningServer) -> None:
    with serve(server.engine, served_model_name="tiny", responses_store_size=2) as small:
        client = openai.OpenAI(base_url=small.url + "/v1", api_key="none")
        ids = [client.responses.create(model="tiny", input=f"turn {i}", **GREEDY).id for i in range(3)]
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(ids[0])  # least recently used, beyond the 2 kept
        assert client.responses.retrieve(ids[2]).id == ids[2]
    with serve(server.engine, served_model_name="tiny", responses_ttl=0.2) as brief:
        client = openai.OpenAI(base_url=brief.url + "/v1", api_key="none")
        kept = client.responses.create(model="tiny", input="hi", **GREEDY)
        time.sleep(0.3)
        with pytest.raises(openai.BadRequestError, match="not found"):
            client.responses.create(model="tiny", input="hi", previous_response_id=kept.id, **GREEDY)


def test_reasoning_becomes_a_reasoning_item(client: openai.OpenAI) -> None:
    """deepseek_r1 reasons until </think>: a random model never closes it, so all of it is reasoning."""
    plain = client.responses.create(model="tiny", input="Think.", **GREEDY)
    thought = client.responses.create(model="tiny", input="Think.", extra_body={"reasoning_parser": "deepseek_r1"},
                                      **GREEDY)
    assert [item.type for item in thought.output] == ["reasoning"]  # cut while reasoning: no message yet
    assert thought.output[0].content[0].text == plain.output_text and thought.output_text == ""
    events = list(client.responses.create(model="tiny", input="Think.", stream=True,
                                          extra_body={"reasoning_parser": "deepseek_r1"}, **GREEDY))
    streamed = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    done = next(e for e in events if e.type == "response.reasoning_text.done")
    assert streamed == done.text == plain.output_text
    assert [item.type for item in events[-1].response.output] == ["reasoning"]


def test_answers_fit_the_schemas_openapi_lists(server: RunningServer) -> None:
    """/openapi.json documents POST and GET/DELETE /v1/responses with these Structs: real answers decode."""
    import msgspec

    from server.responses.schema import ResponseDeleted, ResponseObject

    spec = httpx.get(server.url + "/openapi.json").json()
    assert spec["paths"]["/v1/responses"]["post"]["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ResponsesRequest"}
    call = httpx.post(server.url + "/v1/responses", json={"input": "hi", "tools": TOOLS, "tool_choice": "required",
                                                          "temperature": 0, "max_output_tokens": 60}).json()
    made = msgspec.convert(call, ResponseObject)
    assert made.output[0].type == "function_call" and made.usage is not None
    text = msgspec.convert(httpx.post(server.url + "/v1/responses", json={"input": "hi", **GREEDY}).json(),
                           ResponseObject)
    assert msgspec.convert(httpx.get(f"{server.url}/v1/responses/{text.id}").json(), ResponseObject) == text
    deleted = msgspec.convert(httpx.delete(f"{server.url}/v1/responses/{text.id}").json(), ResponseDeleted)
    assert deleted.deleted and deleted.id == text.id
