"""The official `ollama` Python client against Ollama's API on the real server over HTTP: the model
routes, /api/chat and /api/generate (streamed and not), options, format, tools, thinking, and errors
in Ollama's shape. The model is the tiny tool-calling one (tests/server/agent_model.py): its template
opens a call after the user's turn, so with tools the grammar makes the call valid."""

from __future__ import annotations

import json

import httpx
import ollama
import pytest

from tests.server.harness import RunningServer

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"num_predict": 8, "temperature": 0}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
                   "required": ["city"], "additionalProperties": False}}}


def test_model_routes_describe_the_served_model(client: ollama.Client, tools_server: RunningServer) -> None:
    (listed,) = client.list().models
    assert listed.model == "tiny:latest" and listed.size > 0 and listed.details.family == "qwen2"
    shown = client.show("tiny")
    assert shown.capabilities == ["completion", "tools", "thinking"]
    assert shown.modelinfo["qwen2.context_length"] == 2048 and "<tool_call>" in shown.template
    assert client.show("tiny:latest").details.parameter_size.endswith("K")
    (running,) = client.ps().models
    assert running.name == "tiny:latest" and running.context_length == 2048
    assert httpx.get(tools_server.url + "/api/version").json()["version"]


def test_chat_streams_ndjson_by_default_and_matches_the_whole_answer(client: ollama.Client,
                                                                     tools_server: RunningServer) -> None:
    whole = client.chat(model="tiny", messages=ASK, options=GREEDY, stream=False)
    assert whole.done and whole.done_reason == "length" and whole.eval_count == 8
    assert whole.prompt_eval_count > 0 and whole.total_duration > 0
    parts = list(client.chat(model="tiny", messages=ASK, options=GREEDY, stream=True))
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert [p.done for p in parts][-1] and not any(p.done for p in parts[:-1])
    with httpx.stream("POST", tools_server.url + "/api/chat", timeout=60,
                      json={"model": "tiny", "messages": ASK, "options": GREEDY}) as resp:  # no "stream": it streams
        assert resp.headers["content-type"] == "application/x-ndjson"
        lines = [json.loads(line) for line in resp.iter_lines() if line]
    assert len(lines) > 1 and lines[-1]["done"] is True


def test_a_tool_round_trip(client: ollama.Client) -> None:
    first = client.chat(model="tiny", messages=ASK, tools=[WEATHER], options={"num_predict": 96})
    (call,) = first.message.tool_calls[:1]
    assert call.function.name == "get_weather" and call.function.arguments["city"] in ("Paris", "Tokyo")
    streamed = [p for p in client.chat(model="tiny", messages=ASK, tools=[WEATHER], options={"num_predict": 96},
                                       stream=True) if p.message.tool_calls]
    assert streamed and streamed[0].message.tool_calls[0].function.name == "get_weather"
    history = [*ASK, first.message, {"role": "tool", "tool_name": "get_weather", "content": "sunny, 21 C"}]
    answer = client.chat(model="tiny", messages=history, tools=[WEATHER], options={"num_predict": 6})
    assert answer.done and not answer.message.tool_calls


def test_generate_through_the_template_and_raw(client: ollama.Client, tools_server: RunningServer) -> None:
    templated = client.generate(model="tiny", prompt="the cat sat", system="be brief", options=GREEDY)
    chatted = client.chat(model="tiny", messages=[{"role": "system", "content": "be brief"},
                                                  {"role": "user", "content": "the cat sat"}], options=GREEDY)
    assert templated.response == chatted.message.content
    raw = client.generate(model="tiny", prompt="the cat sat", raw=True, options=GREEDY)
    native = httpx.post(tools_server.url + "/generate", timeout=60, json={
        "text": "the cat sat", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}).json()
    assert raw.response == native["text"]
    streamed = "".join(p.response for p in client.generate(model="tiny", prompt="the cat sat", raw=True,
                                                           options=GREEDY, stream=True))
    assert streamed == raw.response
    loaded = client.generate(model="tiny")
    assert loaded.done and loaded.done_reason == "load"


def test_options_and_format(client: ollama.Client) -> None:
    text = client.generate(model="tiny", prompt="the cat sat", raw=True, options=GREEDY).response
    stop = text[3:5]
    cut = client.generate(model="tiny", prompt="the cat sat", raw=True, options={**GREEDY, "stop": [stop]})
    assert cut.response == text[:text.index(stop)] and cut.done_reason == "stop"
    seeded = [client.generate(model="tiny", prompt="x", raw=True, options={"num_predict": 6, "seed": 7}).response
              for _ in range(2)]
    assert seeded[0] == seeded[1]
    as_json = client.generate(model="tiny", prompt="give json", format="json", options={"num_predict": 40})
    assert as_json.response.startswith("{")  # an object, held by the grammar (a random model may not close it)
    if as_json.done_reason == "stop":
        assert isinstance(json.loads(as_json.response), dict)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    shaped = client.chat(model="tiny", messages=ASK, format=schema, options={"num_predict": 40})
    assert isinstance(json.loads(shaped.message.content)["ok"], bool)


def test_think_comes_back_as_thinking(client: ollama.Client) -> None:
    thought = client.chat(model="tiny", messages=ASK, think=True, options=GREEDY)
    assert thought.message.thinking and not thought.message.content  # a random model never closes </think>
    streamed = "".join(p.message.thinking or "" for p in client.chat(model="tiny", messages=ASK, think=True,
                                                                      options=GREEDY, stream=True))
    assert streamed == thought.message.thinking


@pytest.mark.parametrize("path,body,status,field", [
    ("/api/chat", {"model": "nope", "messages": ASK}, 404, "nope"),
    ("/api/chat", {"messages": ASK}, 400, "model"),
    ("/api/chat", {"model": "tiny", "messages": [{"role": "alien", "content": "x"}]}, 400, "messages[0].role"),
    ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, 400,
     "messages[0].images"),
    ("/api/chat", {"model": "tiny", "messages": ASK, "options": {"num_ctx": 10**6}}, 400, "options.num_ctx"),
    ("/api/chat", {"model": "tiny", "messages": ASK, "options": {"mirostat": 2}}, 400, "options.mirostat"),
    ("/api/chat", {"model": "tiny", "messages": ASK, "options": {"num_predict": "lots"}}, 400, "num_predict"),
    ("/api/chat", {"model": "tiny", "messages": ASK, "format": "yaml"}, 400, "format"),
    ("/api/chat", {"model": "tiny", "messages": ASK, "think": "very"}, 400, "think"),
    ("/api/generate", {"model": "tiny", "prompt": "x", "suffix": "y"}, 400, "suffix"),
    ("/api/generate", {"model": "tiny", "prompt": "x", "context": [1, 2]}, 400, "context"),
    ("/api/generate", b"{not json", 400, "JSON"),
    ("/api/show", {"model": "nope"}, 404, "nope"),
    ("/api/pull", {"model": "llama3.2"}, 501, "--model"),
    ("/api/create", {"model": "x", "from": "y"}, 501, "--model"),
    ("/api/copy", {"source": "tiny", "destination": "x"}, 501, "--served-model-name"),
    ("/api/push", {"model": "tiny"}, 501, "push"),
    ("/api/nothing", {}, 404, "no such route"),
])
def test_errors_are_in_ollamas_shape(tools_server: RunningServer, path: str, body: object, status: int,
                                     field: str) -> None:
    if isinstance(body, bytes):
        resp = httpx.post(tools_server.url + path, content=body, timeout=60)
    else:
        resp = httpx.post(tools_server.url + path, json=body, timeout=60)
    assert resp.status_code == status, resp.text
    error = resp.json()
    assert set(error) == {"error"} and field in error["error"]


def test_the_client_raises_response_errors(client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as missing:
        client.chat(model="llama3.2", messages=ASK)
    assert missing.value.status_code == 404 and "not found" in missing.value.error
    with pytest.raises(ollama.ResponseError) as pull:
        client.pull("llama3.2")
    assert pull.value.status_code == 501
    with pytest.raises(ollama.ResponseError) as delete:
        client.delete("tiny")
    assert delete.value.status_code == 501 and "--model" in delete.value.error


def test_embed_and_the_older_embeddings_route(client: ollama.Client, tools_server: RunningServer) -> None:
    texts = ["the cat sat on the mat", "a dog"]
    out = client.embed(model="tiny", input=texts)
    assert len(out.embeddings) == 2 and all(len(v) == 64 for v in out.embeddings)
    assert all(abs(sum(x * x for x in v) - 1) < 1e-4 for v in out.embeddings)  # normalised
    assert out.prompt_eval_count > 0
    openai_shaped = httpx.post(tools_server.url + "/v1/embeddings", timeout=60,
                               json={"model": "tiny", "input": texts, "encoding_format": "float"}).json()
    for ours, theirs in zip(out.embeddings, openai_shaped["data"]):
        assert max(abs(a - b) for a, b in zip(ours, theirs["embedding"])) < 1e-5
    short = client.embed(model="tiny", input="a dog", dimensions=8).embeddings[0]
    assert len(short) == 8 and abs(sum(x * x for x in short) - 1) < 1e-4
    old = client.embeddings(model="tiny", prompt="a dog").embedding
    norm = sum(x * x for x in old) ** 0.5
    assert max(abs(a / norm - b) for a, b in zip(old, out.embeddings[1])) < 1e-4  # the same vector, as pooled
    with pytest.raises(ollama.ResponseError) as long:
        client.embed(model="tiny", input="word " * 3000, truncate=False)
    assert long.value.status_code == 400 and "truncate" in long.value.error
    assert len(client.embed(model="tiny", input="word " * 3000).embeddings[0]) == 64  # cut to the context
