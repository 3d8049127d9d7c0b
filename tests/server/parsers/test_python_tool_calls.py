"""Python-style tool calls (pythonic `[f(a=1)]`, Gemma's ```` ```tool_code ```` fence) over HTTP with
the openai SDK, on tiny random models: every call the server returns has arguments that parse as
JSON and validate against its tool's schema, under tool_choice auto, required and named, and
parallel_tool_calls false gives at most one.

How a call is made certain on random weights: the chat template writes the opening the request
asks for (`chat_template_kwargs={"open": "["}`) at the end of the generation prompt, as a template
that opens the call does; the server sees the opened block and its grammar starts inside it, so the
model must write a call of one of the tools, held to that tool's schema (python_grammar.py). With
no opening the model writes what it likes; any call it makes is still held. The tools' values are
bounded (enums, maxLength) so that a call fits in max_tokens; unbounded ones are covered by
test_python_grammar.py. A call cut by max_tokens stays text (the Python formats send a call once
its block closes). Seeds are fixed, so each run samples the same outputs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import openai
import pytest

from tests.server.agent_model import save_agent_model
from tests.server.harness import server_process

TEMPLATE = (
    "{{ bos_token }}{% if tools %}tools:{% for t in tools %} {{ t['function']['name'] }}{% endfor %}\n{% endif %}"
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% if open is defined %}{{ open }}{% endif %}{% endif %}"
)
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]},
                                            "days": {"type": "integer", "enum": [1, 2, 3]},
                                            "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}
SEARCH = {"type": "object", "properties": {"query": {"type": "string", "maxLength": 8},
                                           "filters": {"type": "object", "properties": {
                                               "safe": {"type": "boolean"},
                                               "lang": {"type": ["string", "null"], "maxLength": 2}},
                                               "required": ["safe"]},
                                           "ids": {"type": "array", "items": {"type": "integer", "enum": [7, 42]}, "maxItems": 2}},
          "required": ["query", "filters"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER, "strict": True}},
         {"type": "function", "function": {"name": "search", "parameters": SEARCH}}]
SCHEMAS = {"get_weather": WEATHER, "search": SEARCH}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
OPENINGS = [("pythonic", "["), ("gemma", "```tool_code\n"), ("gemma", "")]
MAX_TOKENS = 100  # bounded values (enums, maxLength): a call fits, unless parallel calls chain


@pytest.fixture(scope="module", params=[0, pytest.param(1, marks=pytest.mark.slow)], ids=["weights0", "weights1"])
def client(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    folder = save_agent_model(tmp_path_factory.mktemp("python-calls"), seed=request.param)
    for name in ("tokenizer_config.json",):
        config = json.loads((folder / name).read_text())
        config["chat_template"] = TEMPLATE
        (folder / name).write_text(json.dumps(config, indent=2))
    if (folder / "chat_template.jinja").exists():
        Path(folder / "chat_template.jinja").write_text(TEMPLATE)
    with server_process("--model", str(folder), "--served-model-name", "tiny", "--dtype", "float32",
                        "--kv-cache-tokens", "4096", "--tool-call-parser", "pythonic", "--log-level", "warning") as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)


def valid(calls: list) -> None:  # noqa: ANN001 - the SDK's tool call objects
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def ask(client: openai.OpenAI, fmt: str, opening: str, seed: int, **extra: object):  # noqa: ANN201
    body = {"tool_call_parser": fmt, **({"chat_template_kwargs": {"open": opening}} if opening else {})}
    extra.setdefault("max_tokens", MAX_TOKENS if opening else 24)  # free text: a few tokens show it is free
    return client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS,
                                          temperature=1.0, seed=seed, extra_body=body, **extra)


@pytest.mark.parametrize(("fmt", "opening"), OPENINGS)
def test_auto_calls_hold_to_their_schemas(client: openai.OpenAI, fmt: str, opening: str) -> None:
    finished = 0
    for seed in range(2):
        choice = ask(client, fmt, opening, seed, parallel_tool_calls=seed % 2 == 0).choices[0]
        calls = choice.message.tool_calls or []
        valid(calls)
        if choice.finish_reason == "tool_calls":
            assert calls and not choice.message.content  # no markup left in content
            finished += 1
        else:  # free text (no opening), or cut by max_tokens
            assert not calls and choice.finish_reason in ("stop", "length")
            assert not opening or choice.finish_reason == "length"  # the opened block ends as a call
    if opening:
        assert finished, "no call finished within max_tokens"


@pytest.mark.parametrize(("fmt", "opening"), OPENINGS[:2])
def test_parallel_tool_calls_false_gives_one_call(client: openai.OpenAI, fmt: str, opening: str) -> None:
    finished = 0
    for seed in range(2):
        choice = ask(client, fmt, opening, 10 + seed, parallel_tool_calls=False).choices[0]
        if choice.finish_reason == "tool_calls":
            assert len(choice.message.tool_calls) == 1
            valid(choice.message.tool_calls)
            finished += 1
    assert finished
    chunks = list(ask(client, fmt, opening, 20, parallel_tool_calls=False, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [tc for d in deltas for tc in d.tool_calls or []]
    assert calls and {tc.index for tc in calls} == {0} and calls[0].function.name in SCHEMAS
    assert not "".join(d.content or "" for d in deltas)  # no markup in content
    if chunks[-1].choices[0].finish_reason == "tool_calls":
        jsonschema.validate(json.loads("".join(tc.function.arguments or "" for tc in calls)),
                            SCHEMAS[calls[0].function.name])


@pytest.mark.parametrize("fmt", ["pythonic", "gemma"])
def test_required_and_named_hold_to_their_schemas(client: openai.OpenAI, fmt: str) -> None:
    """These make the whole output one JSON call, whatever the format (as for every parser)."""
    for seed, tool_choice in enumerate(("required", {"type": "function", "function": {"name": "search"}})):
        choice = ask(client, fmt, "", seed, tool_choice=tool_choice, max_tokens=MAX_TOKENS).choices[0]
        calls = choice.message.tool_calls
        assert len(calls) == 1 and (tool_choice == "required" or calls[0].function.name == "search")
        if choice.finish_reason == "tool_calls":
            valid(calls)


def test_a_schema_the_grammar_cannot_hold_is_a_400_naming_it(client: openai.OpenAI) -> None:
    bad = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}}}}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=ASK, tools=bad, max_tokens=4)
    assert err.value.body["param"].startswith("tools[0].function.parameters")
    after = ask(client, "pythonic", "", 0, max_tokens=2).choices[0]  # and the server goes on
    assert after.finish_reason == "length"
