"""The official openai client against the real server over HTTP: sync and async, streamed and not."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from tests.server.harness import RunningServer

PROMPT = "the cat sat on the mat and then"


def _client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _native(server: RunningServer, prompt: str, max_new_tokens: int = 12) -> dict:
    body = {"text": prompt, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}}
    return httpx.post(server.url + "/generate", json=body, timeout=60).json()


def test_models_lists_the_served_name(server: RunningServer) -> None:
    models = _client(server).models.list()
    assert [m.id for m in models.data] == ["tiny"]


def test_completion_matches_native_generate(server: RunningServer) -> None:
    native = _native(server, PROMPT)
    out = _client(server).completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0)
    assert out.choices[0].text == native["text"]
    assert out.usage.completion_tokens == native["meta_info"]["completion_tokens"]
    assert out.usage.prompt_tokens_details.cached_tokens > 0  # the second time, the prompt is cached
    assert out.choices[0].finish_reason in ("length", "stop")


def test_streamed_completion_concatenates_to_the_same_text(server: RunningServer) -> None:
    client = _client(server)
    whole = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, temperature=0).choices[0].text
    chunks = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_chat_completion_and_stream(server: RunningServer) -> None:
    client = _client(server)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    out = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0, seed=3)
    assert out.choices[0].message.role == "assistant" and out.usage.prompt_tokens > 0
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == out.choices[0].message.content
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0


def test_n_logprobs_and_extension_fields(server: RunningServer) -> None:
    client = _client(server)
    out = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=5, temperature=0.8, n=3, seed=1,
                                    logprobs=2, extra_body={"top_k": 20, "min_p": 0.01, "repetition_penalty": 1.1,
                                                            "ignore_eos": True})
    assert sorted(c.index for c in out.choices) == [0, 1, 2]
    assert all(len(c.logprobs.token_logprobs) == 5 and len(c.logprobs.top_logprobs[0]) <= 2 for c in out.choices)
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                          temperature=0, logprobs=True, top_logprobs=3,
                                          extra_body={"ignore_eos": True})
    content = chat.choices[0].logprobs.content
    assert len(content) == 4 and len(content[0].top_logprobs) == 3
    assert content[0].top_logprobs[0].logprob >= content[0].top_logprobs[1].logprob


def test_async_client(server: RunningServer) -> None:
    async def run() -> list[str]:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        outs = await asyncio.gather(*(client.completions.create(model="tiny", prompt=PROMPT + str(i), max_tokens=6,
                                                                temperature=0) for i in range(4)))
        stream = await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "yo"}],
                                                      max_tokens=6, temperature=0, stream=True)
        streamed = [c async for c in stream]
        await client.close()
        return [o.choices[0].text for o in outs] + [str(len(streamed))]

    results = asyncio.run(run())
    assert len(results) == 5


def test_openai_errors_surface_as_exceptions(server: RunningServer) -> None:
    client = _client(server)
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model="nope", prompt="x", max_tokens=2)
    assert exc.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model="tiny", prompt="x", max_tokens=2, temperature=-1)
    assert exc.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[{"role": "wizard", "content": "x"}], max_tokens=2)
