"""A ReAct-style agent loop: the model picks a tool with `select`, we run it in Python, repeat.

Each step re-sends the whole transcript; the cache keeps the steps already taken."""

from _backend import setup

from frontend_lang import gen, program, select

TOOLS = {
    "calculator": lambda arg: str(eval(arg, {"__builtins__": {}}, {})),  # noqa: S307 - digits and operators only
    "capital": lambda arg: {"france": "Paris", "germany": "Berlin", "japan": "Tokyo"}.get(arg.strip().lower(), "unknown"),
}
EXAMPLE = """Question: What is 3 * 7?
Action: calculator
Input: 3 * 7
Observation: 21
Action: finish
Answer: 21

Question: What is the capital of Germany?
Action: capital
Input: Germany
Observation: Berlin
Action: finish
Answer: Berlin

"""


@program
def agent(s, question, max_steps=3):
    s += EXAMPLE + "Question: " + question + "\n"
    for _ in range(max_steps):
        s += "Action:"
        s += select("action", choices=[" calculator", " capital", " finish"])
        if s["action"] == " finish":
            break
        s += "\nInput:"
        s += gen("input", max_tokens=12, temperature=0, stop="\n")
        if not all(c in "0123456789+-*/(). " for c in s["input"]) and s["action"] == " calculator":
            observation = "error: only arithmetic"
        else:
            observation = TOOLS[s["action"].strip()](s["input"])
        s += "\nObservation: " + observation + "\n"
    s += "\nAnswer:"
    s += gen("answer", max_tokens=12, temperature=0, stop="\n")


if __name__ == "__main__":
    setup(__doc__)
    state = agent.run(question="What is the capital of Japan?")
    print(state.text())
