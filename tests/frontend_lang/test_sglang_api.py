"""The rest of SGLang's language API in frontend_lang: typed gens (gen_int, gen_string, dtype=),
the REGEX_* constants, min_tokens, stop_regex, n, var_scope, copy, separate_reasoning,
unconditional_likelihood_normalized, bind, run_batch with positional items and generator_style,
flush_cache / get_server_info, function(...) called, global_config.

Programs run greedily on a tiny random model, in-process (Engine) and over HTTP (RuntimeEndpoint).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import frontend_lang as sgl
from frontend_lang.reasoning import split_reasoning
from frontend_lang.typed_gen import typed_value
from runtime import Engine
from tests.server.harness import serve
from tests.tiny_models import save_tiny_model


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    folder: Path = save_tiny_model("llama", tmp_path_factory.mktemp("sglang-api"))
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
def typed(s):  # noqa: ANN001, ANN201 - SGLang programs are untyped
    s += "Count: " + sgl.gen_int("count", max_tokens=6) + "\n"
    s += "Ratio: " + sgl.gen("ratio", dtype=float, max_tokens=6) + "\n"
    s += "Flag: " + sgl.gen("flag", dtype="bool", max_tokens=4) + "\n"
    s += "Name: " + sgl.gen_string("name", max_tokens=10) + "\n"


def test_typed_gens_constrain_and_store_the_typed_value(backend: object) -> None:
    state = typed.run(backend=backend, temperature=0)
    count, ratio, flag, name = state["count"], state["ratio"], state["flag"], state["name"]
    assert isinstance(count, int) and isinstance(ratio, float) and isinstance(flag, bool)
    assert isinstance(name, str) and re.fullmatch(r"\"[\w\d\s]*\"?", name)  # REGEX_STR, or cut by max_tokens
    text = state.text()
    # The text keeps what the model wrote; int and float stop at a space or newline, as in SGLang.
    written = re.search(r"Count: (.*)\n", text).group(1)  # type: ignore[union-attr]
    assert re.fullmatch(sgl.REGEX_INT, written) and int(written) == count
    assert f"Flag: {flag}\n" in text and f"Name: {name}\n" in text


def test_regex_constants_are_sglangs() -> None:
    assert sgl.REGEX_INT == r"[-+]?[0-9]+[ \n]*"
    assert sgl.REGEX_FLOAT == r"[-+]?[0-9]*\.?[0-9]+[ \n]*"
    assert sgl.REGEX_BOOL == r"(True|False)"
    assert sgl.REGEX_STR == r"\"[\w\d\s]*\""
    from frontend_lang.ir import REGEX_INT  # where SGLang keeps them

    assert REGEX_INT == sgl.REGEX_INT


def test_dtype_overrides_regex_and_bad_dtypes_fail() -> None:
    params = sgl.gen("x", dtype=int, regex="[a-z]+", stop="Q").sampling_params({})  # type: ignore[union-attr]
    assert params["regex"] == sgl.REGEX_INT and params["stop"] == ["Q", " ", "\n"]
    with pytest.raises(ValueError, match="dtype"):
        sgl.gen("x", dtype=list)
    with pytest.raises(re.error):
        sgl.gen("x", regex="(")


def test_typed_value_parses_and_names_the_type_when_it_cannot() -> None:
    assert typed_value(int, "-12 \n") == -12 and typed_value(float, ".5") == 0.5
    assert typed_value(bool, "False") is False and typed_value(str, '"a b"') == '"a b"'
    with pytest.raises(ValueError, match="dtype=int"):
        typed_value(int, "")


@sgl.function
def story(s, **gen_args):  # noqa: ANN001, ANN003, ANN201
    s += "Story:" + sgl.gen("out", max_tokens=10, **gen_args)


def test_min_tokens_holds_stops_until_reached(backend: object) -> None:
    free = story.run(backend=backend, temperature=0)["out"]
    assert len(free) >= 3
    stopped = story.run(stop=free[1:3], backend=backend, temperature=0)
    assert stopped["out"] == free[:1] and stopped.get_meta_info("out")["completion_tokens"] < 10
    held = story.run(stop=free[1:3], min_tokens=10, backend=backend, temperature=0)
    assert held["out"] == free and held.get_meta_info("out")["completion_tokens"] == 10


def test_stop_regex_cuts_the_gen(backend: object) -> None:
    free = story.run(backend=backend, temperature=0)["out"]
    pattern = re.escape(free[2]) + "."
    match = re.search(pattern, free)
    assert match is not None
    assert story.run(stop_regex=pattern, backend=backend, temperature=0)["out"] == free[: match.start()]


@sgl.function
def samples(s):  # noqa: ANN001, ANN201
    s += "Say:" + sgl.gen("many", max_tokens=4, n=3, temperature=1.0)


def test_n_samples_keep_every_sample_and_the_text_gets_the_first(backend: object) -> None:
    state = samples.run(backend=backend)
    many = state["many"]
    assert isinstance(many, list) and len(many) == 3
    assert state.text() == "Say:" + many[0]


@sgl.function
def scoped(s):  # noqa: ANN001, ANN201
    s += "Intro. "
    with s.var_scope("story"):
        s += "Once" + sgl.gen("first", max_tokens=4)
        s += " then" + sgl.gen("second", max_tokens=4)
    s += " End."


def test_var_scope_captures_what_is_appended_inside(backend: object) -> None:
    state = scoped.run(backend=backend, temperature=0)
    assert state["story"] == "Once" + state["first"] + " then" + state["second"]
    assert state.text() == "Intro. " + state["story"] + " End."


@sgl.function
def reasoned(s):  # noqa: ANN001, ANN201
    s += "Q: hi\nA:" + sgl.separate_reasoning(
        sgl.gen("answer", regex=r"<think>[a-z]{3}</think> ok", max_tokens=32), model_type="qwen3")


def test_separate_reasoning_splits_thinking_from_the_answer(backend: object) -> None:
    state = reasoned.run(backend=backend, temperature=0)
    assert state["answer"] == "ok"
    assert re.fullmatch("[a-z]{3}", state["answer_reasoning_content"])
    assert state.text() == "Q: hi\nA:ok"


def test_split_reasoning_by_model() -> None:
    assert split_reasoning("plan</think> done", "deepseek-r1") == ("plan", "done")
    assert split_reasoning("no tags at all", "deepseek-r1") == ("no tags at all", "")
    assert split_reasoning("no tags at all", "qwen3") == ("", "no tags at all")


@sgl.function
def pick(s):  # noqa: ANN001, ANN201
    s += "The animal is a " + sgl.select("animal", choices=["cat", "dog", "zebra"],
                                         choices_method=sgl.unconditional_likelihood_normalized)


def test_unconditional_likelihood_normalized_select(backend: object) -> None:
    state = pick.run(backend=backend)
    assert state["animal"] in ("cat", "dog", "zebra")
    assert state.text() == "The animal is a " + state["animal"]


@sgl.function(num_api_spec_tokens=32)
def qa(s, question, prefix):  # noqa: ANN001, ANN201
    s += prefix + question + "\nA:" + sgl.gen("answer", max_tokens=4)


def test_bind_positional_run_batch_and_generator_style(backend: object) -> None:
    bound = qa.bind(prefix="Answer briefly.\nQ: ")
    listed = bound.run_batch([["one"], ["two"]], backend=backend, temperature=0)
    assert [s.text().split("\nA:")[0] for s in listed] == ["Answer briefly.\nQ: one", "Answer briefly.\nQ: two"]
    yielded = bound.run_batch([{"question": "one"}, {"question": "two"}], backend=backend, temperature=0,
                              generator_style=True)
    assert not isinstance(yielded, list)
    assert [s["answer"] for s in yielded] == [s["answer"] for s in listed]


@pytest.fixture()
def default_backend(backend: object) -> Iterator[object]:
    """`backend` as the default for this test only (later tests must not see a closed engine's)."""
    import frontend_lang.program as program_module

    sgl.set_default_backend(backend)
    yield backend
    program_module._default_backend = None
    sgl.global_config.default_backend = None


def test_flush_cache_server_info_and_copy(default_backend: object) -> None:
    assert sgl.global_config.default_backend is not None
    info = sgl.get_server_info()
    assert info is not None and "stats" in info
    assert sgl.flush_cache() is True  # idle: the whole cache goes

    @sgl.function
    def copied(s):  # noqa: ANN001, ANN202
        s += "Root:"
        with s.copy() as c:
            c += "Branch:" + sgl.gen("leaf", max_tokens=3)
        s += " done"

    state = copied.run(temperature=0)
    assert state.text() == "Root: done" and len(state["leaf"]) == 1


def test_multimodal_inputs_say_they_are_not_supported() -> None:
    with pytest.raises(ValueError, match="not supported"):
        sgl.image("cat.png")
    with pytest.raises(ValueError, match="not supported"):
        sgl.video("cat.mp4", 4)
