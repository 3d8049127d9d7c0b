"""RAG: a shared system prompt and document, many questions. The document's KV is computed once."""

from _backend import setup

from frontend_lang import gen, program

DOCUMENT = """The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France.
It is named after the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889.
It was the entrance arch to the 1889 World's Fair. The tower is 330 metres tall, about the same height as
an 81-storey building, and was the tallest man-made structure in the world until 1930."""


@program
def answer(s, question):
    s += "Answer questions using only the document.\n\nDocument:\n" + DOCUMENT + "\n\n"
    s += "Question: " + question + "\nAnswer:"
    s += gen("answer", max_tokens=24, temperature=0, stop="\n")


if __name__ == "__main__":
    setup(__doc__)
    questions = ["Who is the tower named after?", "How tall is the tower?", "In which city is the tower?",
                 "When was it built?"]
    states = answer.run_batch([{"question": q} for q in questions], progress_bar=True)
    for q, state in zip(questions, states):
        print(f"{q}\n  ->{state['answer']}")
