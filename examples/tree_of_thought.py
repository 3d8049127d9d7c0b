"""Tree of thought with `fork`: the trunk is computed once, then the branches run concurrently on it."""

from _backend import setup

from frontend_lang import gen, program


@program
def tree_of_thought(s, question, width=3):
    s += "Question: " + question + "\n"
    ideas = s.fork(width)
    for i, branch in enumerate(ideas):
        branch += f"Idea {i + 1}: One way is to"
        branch += gen("idea", max_tokens=24, temperature=0.8, stop="\n")
    s += "Ideas:\n" + "\n".join(f"- One way is to{b['idea']}" for b in ideas) + "\nBest idea: One way is to"
    s += gen("best", max_tokens=24, temperature=0, stop="\n")


if __name__ == "__main__":
    setup(__doc__)
    state = tree_of_thought.run(question="How can a small town reduce traffic?")
    print(state.text())
