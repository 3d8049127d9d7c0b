"""SGLang programs run by SGLang's own frontend (`import sglang as sgl`) against a radixserve URL.

Run as a script: `python tests/server/sglang/sglang_client_programs.py URL`; prints one JSON object
with what each program shape produced. It runs in a process of its own because importing
`sglang` patches transformers and sets cache directories for the whole process, which the rest
of the test session must not see. The programs are written as SGLang's docs and examples write
them, unchanged; tests/server/sglang/test_sglang_client.py checks the results.
"""

from __future__ import annotations

import json
import sys

import sglang as sgl


@sgl.function
def few_shot(s, question):  # noqa: ANN001, ANN201 - SGLang programs are untyped
    s += "Q: What is the capital of France?\nA: Paris\n"
    s += "Q: " + question + "\nA:" + sgl.gen("answer", max_tokens=8, stop="\n")


@sgl.function
def tool_use(s, question):  # noqa: ANN001, ANN201
    s += "To answer this question: " + question + ". "
    s += "I need to use a " + sgl.gen("tool", choices=["calculator", "search engine"]) + ". "
    s += "The key word is" + sgl.gen("word", max_tokens=6, stop="\n")


@sgl.function
def chat(s, question):  # noqa: ANN001, ANN201
    s += sgl.system("You are a helpful assistant.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=8))


@sgl.function
def tips(s, topic):  # noqa: ANN001, ANN201
    s += "Here are two tips for " + topic + ".\n"
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f"Tip {i + 1}:" + sgl.gen("tip", max_tokens=6, stop="\n")
    s += "Tip 1:" + forks[0]["tip"] + "\nTip 2:" + forks[1]["tip"] + "\n"
    s += "In summary" + sgl.gen("summary", max_tokens=6)


@sgl.function
def typed(s):  # noqa: ANN001, ANN201
    s += "The year is " + sgl.gen("year", regex=r"[0-9]{4}", max_tokens=8) + ".\n"
    s += "Count: " + sgl.gen_int("count", max_tokens=6) + "\n"
    s += "Answer: " + sgl.gen("flag", dtype=bool, max_tokens=4) + "\n"
    s += "Name: " + sgl.gen_string("name", max_tokens=12) + "\n"
    s += "At least: " + sgl.gen("long", max_tokens=6, min_tokens=6, stop_regex=r"\s") + "\n"


@sgl.function
def scoped(s):  # noqa: ANN001, ANN201
    with s.var_scope("story"):
        s += "Once upon a time" + sgl.gen("first", max_tokens=5)
    s += "\nThe end."


@sgl.function
def streamed(s):  # noqa: ANN001, ANN201
    s += "Write a line:" + sgl.gen("line", max_tokens=8)


def main(url: str) -> None:
    backend = sgl.RuntimeEndpoint(url)
    sgl.set_default_backend(backend)
    out: dict[str, object] = {"model_path": backend.get_model_name()}

    state = few_shot.run(question="What is the capital of Japan?", temperature=0)
    out["gen"] = {"answer": state["answer"], "text": state.text(),
                  "meta": state.get_meta_info("answer")}

    state = tool_use.run(question="what is 2 + 3", temperature=0)
    out["select"] = {"tool": state["tool"], "word": state["word"], "text": state.text()}

    state = chat.run(question="Say hi.", temperature=0)
    out["roles"] = {"answer": state["answer"], "text": state.text(), "messages": state.messages()}

    state = tips.run(topic="staying healthy", temperature=0)
    out["fork"] = {"summary": state["summary"], "text": state.text()}

    states = few_shot.run_batch([{"question": q} for q in ("Capital of Italy?", "Capital of Spain?",
                                                           "Capital of Peru?")], temperature=0)
    out["run_batch"] = [{"answer": s["answer"], "text": s.text()} for s in states]

    state = typed.run(temperature=0)
    out["regex"] = {k: state[k] for k in ("year", "count", "flag", "name", "long")}
    out["regex"]["text"] = state.text()  # type: ignore[index]
    out["regex"]["long_tokens"] = state.get_meta_info("long")["completion_tokens"]  # type: ignore[index]

    state = scoped.run(temperature=0)
    out["var_scope"] = {"story": state["story"], "first": state["first"], "text": state.text()}

    state = streamed.run(temperature=0, stream=True)
    out["stream"] = {"pieces": list(state.text_iter()), "text": state.text()}
    state = streamed.run(temperature=0, stream=True)
    out["text_iter_var"] = {"pieces": list(state.text_iter("line")), "line": state["line"]}

    sgl.flush_cache()
    out["server_info_keys"] = sorted(sgl.get_server_info())
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
