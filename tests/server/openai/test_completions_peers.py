"""/v1/completions as evaluation harnesses and SGLang's / vLLM's users send it (issue #41), with the
real openai SDK over HTTP: echo with logprobs (the prompt scored, as lm-evaluation-harness's
local-completions asks: token-id prompts, echo, logprobs 1, max_tokens 1 or 0), streamed logprobs,
best_of, suffix refused, stop_regex and the matched_stop / stop_reason fields.
Transformers is the oracle for the prompt's logprobs."""

from __future__ import annotations

import math
import re

import httpx
import openai
import pytest
import torch

from tests.server.harness import RunningServer

PROMPT = "the cat sat on the mat and then the cat"


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def oracle(tiny_folder):  # noqa: ANN001, ANN201 - the same checkpoint through transformers
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_folder), dtype=torch.float32).eval()


def _prompt_logprobs(oracle, ids: list[int]) -> list[float]:  # noqa: ANN001
    with torch.no_grad():
        logits = oracle(torch.tensor([ids])).logits[0].float()
    logprobs = torch.log_softmax(logits, -1)
    return [logprobs[i - 1, ids[i]].item() for i in range(1, len(ids))]


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_echo_scores_the_prompt_as_transformers_does(server: RunningServer, client: openai.OpenAI, oracle,  # noqa: ANN001
                                                      max_tokens: int) -> None:
    tokenizer = server.engine.tokenizer
    batch = [tokenizer.encode(PROMPT), tokenizer.encode("hello there, the mat")]
    out = client.completions.create(model="tiny", prompt=batch, echo=True, logprobs=1, max_tokens=max_tokens,
                                    temperature=0, seed=1234)
    assert [c.index for c in out.choices] == [0, 1]
    for ids, choice in zip(batch, out.choices):
        lp = choice.logprobs
        assert len(lp.token_logprobs) == len(ids) + max_tokens and lp.token_logprobs[0] is None
        assert lp.tokens[:len(ids)] == [tokenizer.decode([t], skip_special_tokens=False) for t in ids]
        expected = _prompt_logprobs(oracle, ids)
        assert all(math.isclose(a, b, abs_tol=1e-4) for a, b in zip(lp.token_logprobs[1:len(ids)], expected))
        # What local-completions reads: each prompt token's logprob and whether it was the top choice.
        for value, top in zip(lp.token_logprobs[1:len(ids)], lp.top_logprobs[1:len(ids)]):
            assert len(top) == 1 and max(top.values()) >= value - 1e-6
        assert choice.text.startswith(tokenizer.decode(ids, skip_special_tokens=True))
        assert choice.finish_reason == "length"
    assert out.usage.completion_tokens == 2 * max_tokens


def test_echo_of_a_text_prompt_and_without_logprobs(client: openai.OpenAI) -> None:
    plain = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=5, temperature=0).choices[0]
    echoed = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=5, temperature=0, echo=True).choices[0]
    assert echoed.text == PROMPT + plain.text and echoed.logprobs is None
    streamed = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=5, temperature=0, echo=True,
                                              stream=True))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == PROMPT + plain.text


@pytest.mark.parametrize("ids", [[1, -5], [1, 10**12], [1, 2.5]], ids=["negative", "past-the-vocabulary", "a-float"])
def test_echo_of_ids_that_are_no_tokens_is_a_400(server: RunningServer, ids: list) -> None:
    # the fuzzer's case: echo decoded the ids before they were checked, and -1e148 was a 500
    for echo in (True, False):
        resp = httpx.post(server.url + "/v1/completions", timeout=60,
                          json={"model": "tiny", "prompt": ids, "max_tokens": 2, "echo": echo})
        assert resp.status_code == 400 and resp.json()["error"]["param"].startswith(("input_ids", "prompt")), resp.text


def test_max_tokens_zero_needs_echo(server: RunningServer) -> None:
    resp = httpx.post(server.url + "/v1/completions", timeout=60,
                      json={"model": "tiny", "prompt": PROMPT, "max_tokens": 0})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "max_tokens"


def test_streamed_logprobs_are_the_whole_ones(client: openai.OpenAI) -> None:
    args = dict(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0, logprobs=3, extra_body={"ignore_eos": True})
    whole = client.completions.create(**args).choices[0].logprobs
    chunks = [c.choices[0] for c in client.completions.create(**args, stream=True) if c.choices]
    assert all(c.logprobs is not None for c in chunks)
    assert [t for c in chunks for t in c.logprobs.tokens] == whole.tokens
    assert [v for c in chunks for v in c.logprobs.token_logprobs] == pytest.approx(whole.token_logprobs)
    assert [t for c in chunks for t in c.logprobs.top_logprobs] == whole.top_logprobs
    assert [o for c in chunks for o in c.logprobs.text_offset] == whole.text_offset
    # echo streamed: the prompt's entries lead the first chunk
    echoed = [c.choices[0] for c in client.completions.create(**args, stream=True, echo=True) if c.choices]
    tokens = [t for c in echoed for t in c.logprobs.tokens]
    assert tokens[-len(whole.tokens):] == whole.tokens and echoed[0].logprobs.token_logprobs[0] is None


def test_best_of_returns_the_best_samples(client: openai.OpenAI) -> None:
    out = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=6, temperature=1.0, seed=7, n=2,
                                    best_of=4, logprobs=0, extra_body={"ignore_eos": True})
    assert [c.index for c in out.choices] == [0, 1]
    sums = [sum(c.logprobs.token_logprobs) for c in out.choices]
    assert sums[0] >= sums[1]
    assert out.usage.completion_tokens == 4 * 6  # every sample drawn counts, as OpenAI bills it
    drawn = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=6, temperature=1.0, seed=7, n=4,
                                      logprobs=0, extra_body={"ignore_eos": True})
    ranked = sorted((sum(c.logprobs.token_logprobs) for c in drawn.choices), reverse=True)
    assert sums == pytest.approx(ranked[:2])  # the same seed draws the same four samples


@pytest.mark.parametrize("body,param", [
    ({"suffix": "end"}, "suffix"),
    ({"best_of": 2, "stream": True}, "best_of"),
    ({"best_of": 1, "n": 2}, "best_of"),
    ({"stop_regex": "(unclosed"}, "stop_regex"),
])
def test_refused_fields_name_themselves(server: RunningServer, body: dict, param: str) -> None:
    resp = httpx.post(server.url + "/v1/completions", timeout=60,
                      json={"model": "tiny", "prompt": PROMPT, "max_tokens": 4, **body})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"


def test_stop_regex_and_what_stopped(client: openai.OpenAI) -> None:
    args = dict(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    free = client.completions.create(**args).choices[0]
    assert free.finish_reason == "length" and free.matched_stop is None and free.stop_reason is None
    text = free.text
    piece = text[4:6]  # a stop that occurs in the text, as a regex and as a string
    pattern = re.escape(piece)
    by_regex = client.completions.create(**{**args, "extra_body": {"ignore_eos": True, "stop_regex": [pattern]}})
    choice = by_regex.choices[0]
    assert choice.finish_reason == "stop" and choice.text == text[:re.search(pattern, text).start()]
    assert choice.matched_stop == pattern and choice.stop_reason == pattern
    by_string = client.completions.create(**args, stop=[piece]).choices[0]
    assert by_string.text == text[:text.index(piece)]
    assert by_string.matched_stop == piece and by_string.stop_reason == piece
    streamed = [c.choices[0] for c in client.completions.create(**args, stop=[piece], stream=True) if c.choices]
    assert streamed[-1].finish_reason == "stop" and streamed[-1].model_extra["stop_reason"] == piece
    kept = client.completions.create(**{**args, "extra_body": {"ignore_eos": True, "stop_regex": pattern,
                                                               "no_stop_trim": True}}).choices[0]
    assert kept.text.startswith(choice.text + piece)  # the match stays in the text


def test_stop_token_ids_in_both_fields(server: RunningServer, client: openai.OpenAI) -> None:
    native = httpx.post(server.url + "/generate", timeout=60, json={
        "text": PROMPT, "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}}).json()
    token = native["output_ids"][3]
    first = native["output_ids"].index(token)
    out = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0,
                                    extra_body={"ignore_eos": True, "stop_token_ids": [token]}).choices[0]
    assert out.finish_reason == "stop" and out.matched_stop == token and out.stop_reason == token
    assert out.text == server.engine.tokenizer.decode(native["output_ids"][:first], skip_special_tokens=True)


def test_chat_stop_regex_and_what_stopped(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "hello there"}]
    args = dict(model="tiny", messages=messages, max_tokens=16, temperature=0)
    free = client.chat.completions.create(**args, extra_body={"ignore_eos": True}).choices[0]
    assert free.model_extra["stop_reason"] is None
    text = free.message.content
    piece = text[3:5]
    choice = client.chat.completions.create(**args, extra_body={"ignore_eos": True,
                                                                "stop_regex": re.escape(piece)}).choices[0]
    assert choice.finish_reason == "stop" and choice.message.content == text[:text.index(piece)]
    assert choice.model_extra["matched_stop"] == re.escape(piece) == choice.model_extra["stop_reason"]
