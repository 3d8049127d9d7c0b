"""`lora=` in frontend_lang: a gen through a LoRA adapter, in-process (EngineBackend), over HTTP
(RuntimeEndpoint: SGLang's lora_path) and through the OpenAI backend (the adapter as the model),
and run(lora=...) for every gen of a run; each output is the adapter's own greedy output."""

from __future__ import annotations

import pytest

from frontend_lang import EngineBackend, OpenAI, RuntimeEndpoint, gen, program
from runtime import Engine
from tests.runtime.lora.conftest import STEPS, LoraSetup, make_setup
from tests.server.harness import serve


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> LoraSetup:
    return make_setup("llama", tmp_path_factory.mktemp("lora-dsl"), reference=False)


@program
def two_adapters(s, prompt):  # noqa: ANN001, ANN201 - a DSL program
    s += prompt
    s += gen("a", max_tokens=STEPS, temperature=0, ignore_eos=True, lora="a")
    s += gen("b", max_tokens=STEPS, temperature=0, ignore_eos=True, lora="b")


@program
def one(s, prompt):  # noqa: ANN001, ANN201
    s += prompt
    s += gen("out", max_tokens=STEPS, temperature=0, ignore_eos=True)


def test_gen_and_run_choose_adapters(setup: LoraSetup) -> None:
    with Engine(model=str(setup.base), dtype="float32", kv_cache_tokens=1024,
                lora_paths=[f"a={setup.adapters['a']}", f"b={setup.adapters['b']}"]) as engine:
        tok = engine.tokenizer
        prompt = tok.decode(setup.prompts[0])
        ids = tok.encode(prompt)

        def want(name: str | None, prefix: list[int] = ()) -> str:
            return engine.generate(input_ids=list(ids) + list(prefix), lora=name,
                                   sampling_params={"max_new_tokens": STEPS, "temperature": 0, "ignore_eos": True})[0].text

        first = want("a")
        expected = {"a": first, "out_a": first, "out_base": want(None)}
        assert expected["out_a"] != expected["out_base"]  # else the test would prove nothing
        with serve(engine) as server:
            backends = {"engine": EngineBackend(engine), "http": RuntimeEndpoint(server.url),
                        "openai": OpenAI(base_url=server.url + "/v1", model=str(engine.model_path), api_key="none")}
            for kind, backend in backends.items():
                state = one.run(prompt, backend=backend, lora="a")
                assert state["out"] == expected["out_a"], kind
                assert one.run(prompt, backend=backend)["out"] == expected["out_base"], kind
                state = two_adapters.run(prompt, backend=backend)
                assert state["a"] == expected["a"], kind
                # the second gen continues after the first's text, through b
                assert state["b"] == want("b", tok.encode(prompt + state["a"])[len(ids):]), kind
