"""Multi-turn chat: every turn re-sends the whole history; the radix cache computes only the new turn."""

from _backend import setup

from frontend_lang import assistant, gen, program, system, user


@program
def chat(s, questions):
    s += system("The following is a conversation between a curious user and a helpful, knowledgeable assistant.")
    for i, question in enumerate(questions):
        s += user(question)
        s += assistant(gen(f"answer_{i}", max_tokens=48, temperature=0))


if __name__ == "__main__":
    setup(__doc__)
    state = chat.run(questions=["What is the capital of France?", "And the capital of Germany?",
                                "Which of the two cities is larger?"])
    for message in state.messages():
        print(f"{message['role']:>9}: {message['content'].strip()}")
