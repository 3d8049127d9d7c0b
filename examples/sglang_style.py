"""An SGLang program, unchanged but for its import line: few-shot questions in a batch, the same
questions as parallel forks joined into a list, a tool choice with gen(choices=...), and one
variable streamed as it is generated.

    python examples/sglang_style.py      # starts a local server with sgl.Runtime, as SGLang's does

The forks and the batch all share the few-shot prefix: the server computes it once.
"""

import frontend_lang as sgl  # in SGLang: import sglang as sgl

FEW_SHOT = ("Q: What is the capital of Germany?\nA: Berlin\n\n"
            "Q: What is the capital of Italy?\nA: Rome\n\n")


@sgl.function
def capital(s, country):
    s += FEW_SHOT + "Q: What is the capital of " + country + "?\nA:" + sgl.gen("answer", max_tokens=8, stop="\n")


@sgl.function
def capitals_in_parallel(s, countries):
    s += FEW_SHOT
    forks = s.fork(len(countries))
    forks += [f"Q: What is the capital of {c}?\nA:" for c in countries]
    forks += sgl.gen("city", max_tokens=8, stop="\n")
    forks.join()


@sgl.function
def tool_use(s, question):
    s += "To answer this question: " + question + ". "
    s += "I need to use a " + sgl.gen("tool", choices=["calculator", "search engine"]) + ". "


if __name__ == "__main__":
    runtime = sgl.Runtime(model_path="default")
    sgl.set_default_backend(runtime)
    try:
        countries = ["France", "Japan", "Spain"]
        states = capital.run_batch([{"country": c} for c in countries], temperature=0, progress_bar=True)
        for country, state in zip(countries, states):
            print(f"{country}: {state['answer'].strip()}")
        state = capitals_in_parallel.run(countries=countries, temperature=0)
        print("In parallel:", ", ".join(city.strip() for city in state["city"]))
        print("Tool:", tool_use.run(question="What is 1234 * 5678", temperature=0)["tool"])
        state = capital.run(country="Egypt", temperature=0, stream=True)
        print("Streamed:", end="", flush=True)
        for piece in state.text_iter("answer"):
            print(piece, end="", flush=True)
        print()
    finally:
        runtime.shutdown()
