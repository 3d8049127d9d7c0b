"""SGLang programs run with only the import changed (`import frontend_lang as sgl`).

Each program below is written the way SGLang's quick-start and examples write them. They run on
the in-process Engine and over HTTP (RuntimeEndpoint, and a `Runtime` server process), and where
the OpenAI API allows it, on the OpenAI backend. Greedy decoding makes texts comparable across
backends and against the same program written without the idiom under test.
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

import frontend_lang as sgl
from runtime import Engine
from tests.server.harness import serve
from tests.tiny_models import save_tiny_model

TRUNK = "the cat sat on the mat. " * 4


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model("llama", tmp_path_factory.mktemp("sglang-port"))


@pytest.fixture(scope="module")
def engine(folder: Path) -> Iterator[Engine]:
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=4096) as eng:
        yield eng


@pytest.fixture(scope="module")
def url(engine: Engine) -> Iterator[str]:
    with serve(engine, served_model_name="tiny") as running:
        yield running.url


@pytest.fixture(params=["engine", "endpoint"])
def backend(request: pytest.FixtureRequest, engine: Engine) -> object:
    return engine if request.param == "engine" else sgl.RuntimeEndpoint(request.getfixturevalue("url"))


@sgl.function
def tool_use(s, question):  # noqa: ANN001, ANN201 - SGLang's README example, verbatim but for the import
    s += "To answer this question: " + question + ". "
    s += "I need to use a " + sgl.gen("tool", choices=["calculator", "search engine"]) + ". "
    if s["tool"] == "calculator":
        s += "The math expression is" + sgl.gen("expression", max_tokens=6, stop="\n")
    elif s["tool"] == "search engine":
        s += "The key word to search is" + sgl.gen("word", max_tokens=6, stop="\n")


@sgl.function
def tool_use_by_lines(s, question):  # noqa: ANN001, ANN201 - the same program without concatenation
    s += "To answer this question: "
    s += question
    s += ". "
    s += "I need to use a "
    s += sgl.select("tool", choices=["calculator", "search engine"])
    s += ". "
    if s["tool"] == "calculator":
        s += "The math expression is"
        s += sgl.gen("expression", max_tokens=6, stop="\n")
    else:
        s += "The key word to search is"
        s += sgl.gen("word", max_tokens=6, stop="\n")


def test_expressions_concatenate_with_strings_in_any_order(backend: object) -> None:
    state = tool_use.run(question="what is 2 + 3", backend=backend, temperature=0)
    assert state["tool"] in ("calculator", "search engine")
    assert f"I need to use a {state['tool']}. " in state.text()
    plain = tool_use_by_lines.run(question="what is 2 + 3", backend=backend, temperature=0)
    assert state.text() == plain.text()
    # gen + str + gen, and str on either side of a select
    both = sgl.gen("a", max_tokens=3, temperature=0) + " and " + sgl.gen("b", max_tokens=3, temperature=0)

    @sgl.function
    def pair(s):  # noqa: ANN001, ANN202
        s += TRUNK + "A:" + both + "."

    out = pair.run(backend=backend)
    assert out.text() == TRUNK + "A:" + out["a"] + " and " + out["b"] + "."


@sgl.function
def multi_turn(s, question_1, question_2):  # noqa: ANN001, ANN201 - SGLang's chat example shape
    s += sgl.system("You are a helpful assistant.")
    s += sgl.user(question_1)
    s += sgl.assistant(sgl.gen("answer_1"))  # max tokens from the run
    s += sgl.user(question_2)
    s += sgl.assistant("Sure: " + sgl.gen("answer_2", max_tokens=8))


@sgl.function
def multi_turn_blocks(s, question_1, question_2):  # noqa: ANN001, ANN201 - role begin/end style
    s += sgl.system_begin() + "You are a helpful assistant." + sgl.system_end()
    s += sgl.user_begin()
    s += question_1
    s += sgl.user_end()
    s += sgl.assistant_begin() + sgl.gen("answer_1") + sgl.assistant_end()
    with s.user():
        s += question_2
    s += sgl.assistant_begin()
    s += "Sure: " + sgl.gen("answer_2", max_tokens=8)
    s += sgl.assistant_end()


def test_roles_streaming_one_variable_and_run_level_defaults(backend: object) -> None:
    args = dict(question_1="hi there", question_2="and then?")
    state = multi_turn.run(**args, backend=backend, temperature=0, max_new_tokens=8, stream=True)
    pieces = list(state.text_iter("answer_2"))
    assert "".join(pieces) == state["answer_2"]
    assert "".join(state.text_iter()) == state.text()  # a second reader of the same state

    async def read_async() -> str:
        return "".join([piece async for piece in state.text_async_iter("answer_1")])

    assert asyncio.run(read_async()) == state["answer_1"]
    assert [m["role"] for m in state.messages()] == ["system", "user", "assistant", "user", "assistant"]
    assert state.messages()[-1]["content"].startswith("Sure: ")
    blocks = multi_turn_blocks.run(**args, backend=backend, temperature=0, max_new_tokens=8)
    assert blocks.text() == state.text() and blocks.messages() == state.messages()
    short = multi_turn.run(**args, backend=backend, temperature=0, max_new_tokens=2)
    assert short.get_meta_info("answer_1")["completion_tokens"] <= 2  # the run-level default applies
    assert state["answer_1"].startswith(short["answer_1"])


@sgl.function
def tips(s):  # noqa: ANN001, ANN201 - SGLang's parallel-fork example
    s += TRUNK + "Here are two tips: 1. Balanced Diet. 2. Regular Exercise.\n"
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f"Now, expand tip {i + 1} into a paragraph:\n"
        f += sgl.gen("detailed_tip", max_tokens=6, stop="\n\n")
    s += "Tip 1:" + forks[0]["detailed_tip"] + "\n"
    s += "Tip 2:" + forks[1]["detailed_tip"] + "\n"


@sgl.function
def fork_group(s, n):  # noqa: ANN001, ANN201 - broadcast += on the group, then join
    s += TRUNK + "Question: which tool?\n"
    forks = s.fork(n)
    forks += "Tool:" + sgl.gen("tool", max_tokens=4, temperature=0)
    forks += lambda i: f" ({i})"
    forks += [f" [{i}]" for i in range(n)]
    forks.join()
    s += "Done."


def test_forks_broadcast_and_join_into_lists(backend: object) -> None:
    state = fork_group.run(n=3, backend=backend)
    tools = state["tool"]
    assert isinstance(tools, list) and len(tools) == 3 and len(set(tools)) == 1  # greedy: the same each
    assert state.text().endswith("Question: which tool?\nDone.")
    out = tips.run(backend=backend, temperature=0)
    assert re.fullmatch(re.escape(TRUNK) + r"Here are two tips: .*\nTip 1:.*\nTip 2:.*\n", out.text(), re.DOTALL)

    @sgl.function
    def concat_join(s):  # noqa: ANN001, ANN202
        s += TRUNK
        forks = s.fork(2)
        forks += lambda i: f" branch {i}."
        forks.join("concate_and_append")

    assert concat_join.run(backend=backend).text() == TRUNK + " branch 0." + " branch 1."


def test_variables_meta_info_and_choices_methods(backend: object) -> None:
    @sgl.function
    def prog(s):  # noqa: ANN001, ANN202
        s += TRUNK + "label:"
        s += sgl.gen("label", choices=[" good", " bad"], choices_method=sgl.greedy_token_selection)
        s += sgl.gen("rest", max_tokens=3, temperature=0, return_logprob=True)

    state = prog.run(backend=backend)
    assert state.get_var("label") in (" good", " bad") and "label" in state
    meta = state.get_meta_info("rest")
    logprobs = meta["output_token_logprobs"]
    assert len(logprobs) == 3 and all(entry[0] <= 0 for entry in logprobs)
    state.set_var("note", 1)
    assert state["note"] == 1
    assert len(state.get_meta_info("label")["normalized_prompt_logprobs"]) == 2


def test_run_batch_with_a_progress_bar_and_defaults(engine: Engine, capsys: pytest.CaptureFixture) -> None:
    states = tool_use.run_batch([{"question": f"what is {i} + 1"} for i in range(4)], backend=engine,
                                progress_bar=True, temperature=0)
    assert all(s["tool"] in ("calculator", "search engine") for s in states)
    assert "4/4" in capsys.readouterr().err  # tqdm's bar
    with pytest.raises(TypeError, match="unknown argument"):
        tool_use.run_batch([{"question": "x"}], backend=engine, temprature=0)


def test_openai_backend_runs_what_the_api_allows(url: str) -> None:
    backend = sgl.OpenAI(base_url=url + "/v1", model="tiny")

    @sgl.function
    def prog(s):  # noqa: ANN001, ANN202
        s += TRUNK + "A:" + sgl.gen("answer", max_tokens=4, temperature=0) + "."

    state = prog.run(backend=backend)
    assert state.text() == TRUNK + "A:" + state["answer"] + "."
    with pytest.raises(sgl.BackendError, match="prompt logprobs"):
        tool_use.run(question="x", backend=backend)  # gen(choices=...) needs prompt logprobs


def test_regex_and_json_schema_reach_the_sampling_params() -> None:
    g = sgl.gen("n", regex=r"[0-9]+", max_tokens=4)
    assert g.sampling_params({"temperature": 0}) == {"max_new_tokens": 4, "temperature": 0, "regex": r"[0-9]+"}
    assert sgl.gen("j", json_schema='{"type": "object"}').sampling_params({})["json_schema"] == '{"type": "object"}'


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_runtime_starts_a_server_process_and_shuts_it_down(folder: Path) -> None:
    runtime = sgl.Runtime(model_path=str(folder), dtype="float32", mem_fraction_static=0.01, random_seed=3)
    try:
        assert _port_open(runtime.port) and runtime.process.poll() is None
        sgl.set_default_backend(runtime)
        state = tool_use.run(question="what is 2 + 3", temperature=0)
        assert state["tool"] in ("calculator", "search engine")
    finally:
        runtime.shutdown()
    assert runtime.process.poll() is not None and not _port_open(runtime.port)
    with pytest.raises(ValueError, match="unknown server argument"):
        sgl.Runtime(model_path=str(folder), no_such_flag=1)
    with pytest.raises(ValueError, match="one local process"):
        sgl.Runtime(model_path=str(folder), tp_size=2)
