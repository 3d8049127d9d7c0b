"""SGLang's own frontend (`pip install --no-deps sglang` plus the few packages its language needs)
runs SGLang programs against `python -m server` with no change: gen, select, chat roles, fork,
run_batch, regex and typed gens, var_scope, streaming and text_iter.

The programs run in a child process (tests/server/sglang/sglang_client_programs.py: importing sglang
patches transformers process-wide); this file checks what they produced, and that our own
frontend_lang gives the same texts for the same programs on the same server.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import frontend_lang
from tests.server.harness import server_process

pytestmark = pytest.mark.skipif(importlib.util.find_spec("sglang") is None,
                                reason="needs SGLang's frontend: make test installs it (the sglang-client extra)")
PROGRAMS = Path(__file__).with_name("sglang_client_programs.py")
FEW_SHOT = "Q: What is the capital of France?\nA: Paris\n"


@pytest.fixture(scope="module")
def url(tiny_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("sglang-client") / "server.log"
    with server_process("--model", str(tiny_folder), "--dtype", "float32", "--kv-cache-tokens", "4096", log=log) as url:
        yield url


@pytest.fixture(scope="module")
def ran(url: str) -> dict:
    done = subprocess.run([sys.executable, str(PROGRAMS), url], capture_output=True, text=True, timeout=400,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_gen_reads_sglang_meta_info(ran: dict, tiny_folder: Path) -> None:
    gen = ran["gen"]
    assert ran["model_path"] == str(tiny_folder)
    assert gen["text"] == FEW_SHOT + "Q: What is the capital of Japan?\nA:" + gen["answer"]
    assert "\n" not in gen["answer"]
    meta = gen["meta"]
    assert meta["prompt_tokens"] > 10 and 0 < meta["completion_tokens"] <= 8
    assert meta["finish_reason"]["type"] in ("length", "stop") and meta["cached_tokens"] >= 0


def test_select_and_roles(ran: dict) -> None:
    sel = ran["select"]
    assert sel["tool"] in ("calculator", "search engine")
    assert f"I need to use a {sel['tool']}. The key word is{sel['word']}" in sel["text"]
    roles = ran["roles"]
    # SGLang's client renders roles with its own template ("default" for an unknown model path).
    assert roles["text"].startswith("SYSTEM:You are a helpful assistant.\nUSER:Say hi.\nASSISTANT:")
    assert [m["role"] for m in roles["messages"]] == ["system", "user", "assistant"]


def test_fork_and_run_batch(ran: dict) -> None:
    fork = ran["fork"]
    assert "\nTip 1:" in fork["text"] and "\nTip 2:" in fork["text"]
    assert fork["text"].endswith("In summary" + fork["summary"])
    batch = ran["run_batch"]
    assert len(batch) == 3
    for item, q in zip(batch, ("Capital of Italy?", "Capital of Spain?", "Capital of Peru?")):
        assert item["text"] == f"{FEW_SHOT}Q: {q}\nA:{item['answer']}"


def test_regex_typed_gens_min_tokens_and_stop_regex(ran: dict) -> None:
    got = ran["regex"]
    assert re.fullmatch(r"[0-9]{4}", got["year"])
    assert re.fullmatch(r"[-+]?[0-9]+", got["count"])  # gen_int: REGEX_INT, stopped at a space or newline
    assert got["flag"] in ("True", "False")
    assert re.fullmatch(r"\"[\w\d\s]*\"", got["name"])
    # min_tokens=6 with stop_regex \s: no stop before the sixth token
    assert got["long_tokens"] == 6


def test_var_scope_stream_and_text_iter(ran: dict) -> None:
    scoped = ran["var_scope"]
    assert scoped["story"] == "Once upon a time" + scoped["first"]
    assert scoped["text"] == scoped["story"] + "\nThe end."
    stream = ran["stream"]
    assert "".join(stream["pieces"]) == stream["text"] and stream["text"].startswith("Write a line:")
    line = ran["text_iter_var"]
    assert "".join(line["pieces"]) == line["line"]
    assert "version" in ran["server_info_keys"]


def test_our_frontend_gives_the_same_texts_on_the_same_server(ran: dict, url: str) -> None:
    @frontend_lang.function
    def few_shot(s, question):  # noqa: ANN001, ANN202 - the program the SGLang client ran
        s += "Q: What is the capital of France?\nA: Paris\n"
        s += "Q: " + question + "\nA:" + frontend_lang.gen("answer", max_tokens=8, stop="\n")

    backend = frontend_lang.RuntimeEndpoint(url)
    states = few_shot.run_batch([{"question": q} for q in ("Capital of Italy?", "Capital of Spain?",
                                                           "Capital of Peru?")], backend=backend, temperature=0)
    assert [s["answer"] for s in states] == [item["answer"] for item in ran["run_batch"]]
