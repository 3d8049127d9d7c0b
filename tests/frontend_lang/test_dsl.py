"""The @program DSL on a tiny model: every feature on the Engine backend, the same programs over
HTTP with RuntimeEndpoint, chat over the OpenAI backend, and cache use visible in engine stats."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from frontend_lang import (BackendError, EngineBackend, OpenAI, RuntimeEndpoint, assistant, function, gen, program,
                           select, set_default_backend, system, user)
from runtime import Engine
from tests.server.harness import serve
from tests.tiny_models import save_tiny_model

TRUNK = "the cat sat on the mat. " * 6


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    folder = save_tiny_model("llama", tmp_path_factory.mktemp("dsl"))
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=4096) as eng:
        yield eng


@pytest.fixture(scope="module")
def endpoint(engine: Engine) -> Iterator[str]:
    with serve(engine) as running:
        yield running.url


@program
def qa(s, question):  # noqa: ANN001, ANN201
    s += system("be brief")
    s += user(question)
    s += assistant(gen("answer", max_tokens=6, temperature=0))


@program
def fork_program(s):  # noqa: ANN001, ANN201
    s += TRUNK
    branches = s.fork(3)
    for i, branch in enumerate(branches):
        branch += f" idea {i}:"
        branch += gen("idea", max_tokens=5, temperature=0)
    s += " | ".join(b["idea"] for b in branches)


@program
def classify(s, text):  # noqa: ANN001, ANN201
    s += TRUNK + "review: " + text + "\nlabel:"
    s += select("label", choices=[" good", " bad", " meh"])


def _stat(engine: Engine, key: str) -> float:
    return engine.stats()[key]


def test_roles_follow_the_chat_template(engine: Engine) -> None:
    state = qa.run(question="hello", backend=engine)
    text = state.text()
    # The tiny tokenizer's template renders "<bos>role: content\n"; generation follows "assistant:".
    assert text.startswith("<bos>system: be brief\nuser: hello\nassistant:")
    assert state.messages()[-1] == {"role": "assistant", "content": state["answer"].rstrip()}
    direct = engine.generate(input_ids=engine.encode("<bos>system: be brief\nuser: hello\nassistant:"),
                             sampling_params={"max_new_tokens": 6, "temperature": 0})[0].text
    assert state["answer"] == direct


def test_with_blocks_and_text(engine: Engine) -> None:
    @function  # SGLang's spelling works too
    def blocks(s):  # noqa: ANN001, ANN202
        with s.user():
            s += "two plus two"
        with s.assistant():
            s += gen("x", max_tokens=3, temperature=0)

    state = blocks.run(backend=engine)
    assert "user: two plus two\nassistant:" in state.text() and isinstance(state["x"], str)


def test_fork_computes_the_trunk_once(engine: Engine) -> None:
    engine.flush_cache()
    before = _stat(engine, "computed_prompt_tokens_total")
    state = fork_program.run(backend=engine)
    computed = _stat(engine, "computed_prompt_tokens_total") - before
    trunk_tokens = len(engine.encode(TRUNK))
    # The trunk once (warm-up), then each branch only its own few tokens.
    assert computed < trunk_tokens + 3 * 12
    assert state.text().count("|") == 2


def test_select_scores_choices_sharing_the_prefix(engine: Engine) -> None:
    engine.flush_cache()
    before = _stat(engine, "computed_prompt_tokens_total")
    state = classify.run(text="fine", backend=engine)
    computed = _stat(engine, "computed_prompt_tokens_total") - before
    prefix_tokens = len(engine.encode(TRUNK + "review: fine\nlabel:"))
    assert state["label"] in (" good", " bad", " meh") and len(state["label_scores"]) == 3
    assert computed <= prefix_tokens + 3 * 8  # the prefix once (not three times), then each choice
    best = max(range(3), key=lambda i: state["label_scores"][i])
    assert state["label"] == [" good", " bad", " meh"][best]


def test_run_batch_warms_the_common_prefix_and_reports_item_errors(engine: Engine) -> None:
    @program
    def maybe_fail(s, text, fail):  # noqa: ANN001, ANN202
        s += TRUNK + text
        if fail:
            raise RuntimeError("tool exploded")
        s += gen("out", max_tokens=3, temperature=0)

    engine.flush_cache()
    states = maybe_fail.run_batch([{"text": f" item {i}", "fail": i == 2} for i in range(5)], backend=engine,
                                  progress_bar=True)
    assert [s.error is None for s in states] == [True, True, False, True, True]
    with pytest.raises(RuntimeError, match="tool exploded"):
        states[2]["out"]
    assert all(isinstance(states[i]["out"], str) for i in (0, 1, 3, 4))
    assert _stat(engine, "cached_tokens_total") > 0


def test_errors_surface_on_run(engine: Engine) -> None:
    @program
    def bad(s):  # noqa: ANN001, ANN202
        s += "x"
        s += gen("y", max_tokens=2, temperature=-3)  # rejected by the engine

    with pytest.raises(ValueError, match="temperature"):
        bad.run(backend=engine)


def test_streaming_yields_text_as_generated(engine: Engine) -> None:
    state = qa.run(question="stream please", backend=engine, stream=True)
    pieces = list(state.text_iter())
    assert len(pieces) > 3 and "".join(pieces) == state.text()


def test_default_backend(engine: Engine) -> None:
    set_default_backend(engine)
    assert isinstance(qa.run(question="hi")["answer"], str)
    set_default_backend(EngineBackend(engine))


def test_runtime_endpoint_runs_the_same_programs(engine: Engine, endpoint: str) -> None:
    backend = RuntimeEndpoint(endpoint)
    local = qa.run(question="hello", backend=engine)
    remote = qa.run(question="hello", backend=backend)
    assert remote.text() == local.text()
    assert classify.run(text="fine", backend=backend)["label"] == classify.run(text="fine", backend=engine)["label"]
    streamed = qa.run(question="hello", backend=backend, stream=True)
    assert "".join(streamed.text_iter()) == local.text()
    assert fork_program.run(backend=backend).text() == fork_program.run(backend=engine).text()


def test_openai_backend_chat_and_clear_select_error(engine: Engine, endpoint: str) -> None:
    backend = OpenAI(base_url=endpoint + "/v1", model=str(engine.model_path), api_key="x")
    state = qa.run(question="hello", backend=backend)
    assert isinstance(state["answer"], str)
    with pytest.raises(BackendError, match="select"):
        classify.run(text="fine", backend=backend)
