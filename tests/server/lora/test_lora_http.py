"""LoRA adapters over HTTP, from the clients' side: the openai SDK choosing an adapter by `model` and
listing adapters (parent = the base), SGLang's /generate with `lora_path` (one for all prompts or one
each), and loading / unloading at run time in SGLang's and vLLM's shapes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from runtime import Engine
from tests.runtime.engine_helpers import assert_slots_balanced
from tests.runtime.lora.conftest import STEPS, LoraSetup, make_setup
from tests.server.harness import RunningServer, serve


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> LoraSetup:
    return make_setup("llama", tmp_path_factory.mktemp("lora-http"))


@pytest.fixture(scope="module")
def server(setup: LoraSetup) -> Iterator[RunningServer]:
    with Engine(model=str(setup.base), dtype="float32", kv_cache_tokens=1024,
                lora_paths=[f"a={setup.adapters['a']}", f"b={setup.adapters['b']}"]) as engine, serve(engine) as running:
        yield running


@pytest.fixture
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def _ids(server: RunningServer, text: str) -> list[int]:
    return server.engine.tokenizer.encode(text)


def test_openai_sdk_chooses_adapter_by_model(server: RunningServer, client: openai.OpenAI, setup: LoraSetup) -> None:
    base = client.models.list().data[0].id
    models = {m.id: m for m in client.models.list().data}
    assert set(models) == {base, "a", "b"}
    assert getattr(models["a"], "parent") == base and getattr(models[base], "parent", None) is None
    assert getattr(client.models.retrieve("b"), "parent") == base
    prompt = setup.prompts[0]
    for model, want in ((base, setup.want[None][0]), ("a", setup.want["a"][0]), ("b", setup.want["b"][0])):
        out = client.completions.create(model=model, prompt=prompt, max_tokens=STEPS, temperature=0,
                                        extra_body={"ignore_eos": True})
        assert out.model == model
        assert out.choices[0].text == server.engine.tokenizer.decode(want)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="a", prompt=prompt, max_tokens=STEPS, temperature=0, stream=True, extra_body={"ignore_eos": True})
        if c.choices)
    assert streamed == server.engine.tokenizer.decode(setup.want["a"][0])
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="nope", prompt=prompt, max_tokens=2)
    assert "'a'" in str(info.value) and info.value.body["param"] == "model"


def test_sglang_generate_with_lora_path(server: RunningServer, setup: LoraSetup) -> None:
    params = {"max_new_tokens": STEPS, "temperature": 0, "ignore_eos": True}
    one = httpx.post(server.url + "/generate", json={"input_ids": setup.prompts[1], "sampling_params": params,
                                                     "lora_path": "b"}, timeout=60).json()
    assert one["output_ids"] == setup.want["b"][1]
    batch = httpx.post(server.url + "/generate", json={"input_ids": setup.prompts[:3], "sampling_params": params,
                                                       "lora_path": [None, "a", "b"]}, timeout=60).json()
    assert [o["output_ids"] for o in batch] == [setup.want[None][0], setup.want["a"][1], setup.want["b"][2]]
    bad = httpx.post(server.url + "/generate", json={"input_ids": setup.prompts[0], "lora_path": "zzz"}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "lora_path"
    assert_slots_balanced(server.engine)


def test_load_and_unload_sglang_shape(server: RunningServer, client: openai.OpenAI, setup: LoraSetup) -> None:
    url = server.url
    loaded = httpx.post(url + "/load_lora_adapter", json={"lora_name": "c", "lora_path": str(setup.adapters["c"])})
    assert loaded.status_code == 200 and loaded.json()["success"] is True
    assert loaded.json()["loaded_adapters"]["c"] == str(setup.adapters["c"])
    out = httpx.post(url + "/generate", json={"input_ids": setup.prompts[2], "lora_path": "c",
                                              "sampling_params": {"max_new_tokens": STEPS, "temperature": 0,
                                                                  "ignore_eos": True}}, timeout=60).json()
    assert out["output_ids"] == setup.want["c"][2]
    again = httpx.post(url + "/load_lora_adapter", json={"lora_name": "c", "lora_path": str(setup.adapters["c"])})
    assert again.status_code == 400 and "already loaded" in again.json()["error_message"]
    gone = httpx.post(url + "/unload_lora_adapter", json={"lora_name": "c"})
    assert gone.status_code == 200 and "c" not in gone.json()["loaded_adapters"]
    assert "c" not in {m.id for m in client.models.list().data}
    missing = httpx.post(url + "/unload_lora_adapter", json={"lora_name": "c"})
    assert missing.status_code == 400 and missing.json()["success"] is False


def test_load_and_unload_vllm_shape(server: RunningServer, client: openai.OpenAI, setup: LoraSetup,
                                    tmp_path: Path) -> None:
    url = server.url + "/v1"
    ok = httpx.post(url + "/load_lora_adapter", json={"lora_name": "d", "lora_path": str(setup.adapters["c"])})
    assert ok.status_code == 200 and ok.text == "Success: LoRA adapter 'd' added successfully."
    prompt = setup.prompts[3]
    out = client.completions.create(model="d", prompt=prompt, max_tokens=STEPS, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert out.choices[0].text == server.engine.tokenizer.decode(setup.want["c"][3])
    # load_inplace: other weights under the same name, served from then on (a new cache namespace)
    swap = httpx.post(url + "/load_lora_adapter", json={"lora_name": "d", "lora_path": str(setup.adapters["a"]),
                                                        "load_inplace": True})
    assert swap.status_code == 200
    out = client.completions.create(model="d", prompt=prompt, max_tokens=STEPS, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert out.choices[0].text == server.engine.tokenizer.decode(setup.want["a"][3])
    assert out.usage.prompt_tokens_details is None or not out.usage.prompt_tokens_details.cached_tokens
    bad = httpx.post(url + "/load_lora_adapter", json={"lora_name": "e", "lora_path": str(tmp_path)})
    assert bad.status_code == 400 and "adapter_config.json" in bad.json()["error"]["message"]
    assert httpx.post(url + "/unload_lora_adapter", json={"lora_name": "d"}).text.startswith("Success")
    unknown = httpx.post(url + "/unload_lora_adapter", json={"lora_name": "d"})
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "lora_name"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="d", prompt=prompt, max_tokens=2)
    assert_slots_balanced(server.engine)


def test_routes_without_lora_refuse_adapter_names(server: RunningServer, client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="LoRA adapter"):
        client.embeddings.create(model="a", input="hello")


def test_cli_flags() -> None:
    from runtime import EngineArgs
    from server.cli import parse

    args, _ = parse(["--lora-paths", "a=/x", "/y", "--max-loras-per-batch", "2", "--max-loaded-loras", "4"])
    assert args.lora_paths == ["a=/x", "/y"] and args.lora_on and args.max_loras_per_batch == 2
    assert args.lora_adapters() == {"a": "/x", "/y": "/y"}
    assert parse(["--enable-lora"])[0].lora_on and not parse([])[0].lora_on
    for bad, match in ((dict(lora_paths=["=x"]), "name=path"), (dict(lora_paths=["a=x", "a=y"]), "twice"),
                       (dict(lora_paths=["a=x", "b=y"], max_loaded_loras=1), "max_loaded_loras"),
                       (dict(max_loras_per_batch=0), "max_loras_per_batch")):
        with pytest.raises(ValueError, match=match):
            EngineArgs(**bad).validate()
