"""Chat Completions and Models as SGLang's and vLLM's users send them (issue #41), with the real
openai SDK over HTTP: models.retrieve, continue_final_message (transformers' own
continue_final_message rendering is the oracle of the prompt), reasoning_content on every streamed
delta, and an over-long prompt as a 400."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.server.harness import RunningServer

MESSAGES = [{"role": "user", "content": "Say a colour."}, {"role": "assistant", "content": "The colour is"}]


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def test_models_retrieve(client: openai.OpenAI) -> None:
    card = client.models.retrieve("tiny")
    assert card.id == "tiny" and card.object == "model"
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("no-such-model")
    assert caught.value.status_code == 404 and caught.value.body["param"] == "model"


def test_continue_final_message_goes_on_from_the_prefix(server: RunningServer, client: openai.OpenAI) -> None:
    hf = server.engine.tokenizer.hf
    rendered = hf.apply_chat_template(MESSAGES, tokenize=False, continue_final_message=True)
    assert rendered.endswith("assistant: The colour is")  # the turn left open (the oracle's rendering)
    ids = server.engine.tokenizer.encode_rendered(rendered)
    out = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0,
                                         extra_body={"continue_final_message": True, "add_generation_prompt": False,
                                                     "ignore_eos": True})
    assert out.usage.prompt_tokens == len(ids)
    expected = client.completions.create(model="tiny", prompt=ids, max_tokens=8, temperature=0,
                                         extra_body={"ignore_eos": True})
    assert out.choices[0].message.content == expected.choices[0].text
    # Without it the model answers in a new turn: another prompt.
    fresh = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=1, temperature=0)
    assert fresh.usage.prompt_tokens != len(ids)


def test_continue_final_message_with_a_generation_prompt_is_a_400(server: RunningServer) -> None:
    resp = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "model": "tiny", "messages": MESSAGES, "max_tokens": 2, "continue_final_message": True})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "continue_final_message"


def test_streamed_deltas_carry_reasoning_content(server: RunningServer, client: openai.OpenAI) -> None:
    body = {"model": "tiny", "messages": MESSAGES[:1], "max_tokens": 6, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as resp:
        events = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert deltas and all("reasoning_content" in d and d["reasoning_content"] is None for d in deltas)
    chunks = [c for c in client.chat.completions.create(**{k: v for k, v in body.items() if k != "stream"},
                                                        stream=True) if c.choices]
    assert all(c.choices[0].delta.reasoning_content is None for c in chunks)  # the attribute clients read


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 600}]}),
    ("/v1/chat/completions", {"messages": MESSAGES[:1], "max_tokens": 100_000}),
    ("/v1/completions", {"prompt": "word " * 600}),
])
def test_an_over_long_prompt_is_a_400(server: RunningServer, path: str, body: dict) -> None:
    resp = httpx.post(server.url + path, json={"model": "tiny", **body}, timeout=60)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
