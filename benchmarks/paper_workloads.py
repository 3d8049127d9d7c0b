"""The SGLang paper's workloads (Zheng et al., 2024, section 6), synthetic and seeded, for benchmarks/paper.py.

Each is a benchmarks.workloads.Workload: phases of requests, a phase built from the previous
phases' outputs (an agent's next step, a chat's next turn, a tree's next level). Text comes from
benchmarks/paper_text.py, so nothing is downloaded and every peer gets the same prompts. Sizes
are counts (`size` scales them) chosen so that the whole `make bench-paper` run fits in about
25 minutes on a 2-core CPU with llama.cpp, the slowest peer, serving one request at a time.

Generation requests ask for a fixed number of tokens (ignore_eos), so every peer does the same
work whatever its weights' rounding makes it write; JSON requests end where the schema's object
closes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from benchmarks import paper_text as pt
from benchmarks.workloads import Request, Workload


@dataclass
class PaperRequest(Request):
    schema: dict[str, Any] | None = None  # a JSON request: the output is held to this schema


LETTERS = [" A", " B", " C", " D"]

JSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city_name": {"type": "string"},
        "country": {"enum": pt.COUNTRIES},
        "founded_year": {"type": "integer"},
        "population": {"type": "integer"},
        "main_industry": {"enum": pt.INDUSTRIES},
        "has_university": {"type": "boolean"},
        "landmarks": {"type": "array", "items": {"enum": pt.LANDMARKS}, "maxItems": 3},
    },
    "required": ["city_name", "country", "founded_year", "population", "main_industry", "has_university",
                 "landmarks"],
    "additionalProperties": False,
}


def _question(rng: random.Random, answer: str | None) -> str:
    options = "".join(f"{letter.strip()}. {pt.short_phrase(rng)}\n" for letter in LETTERS)
    tail = f" {answer}\n\n" if answer else ""
    return f"Question: {pt.sentence(rng)} What did they do next?\n{options}Answer:{tail}"


def mmlu(size: int, seed: int = 0) -> Workload:
    """5-shot multiple choice, two subjects; the answer is a select over four one-token letters."""
    rng = random.Random(seed)
    topics = pt.TOPICS[:2]
    prefixes = {t: f"The following are multiple choice questions (with answers) about {t}.\n\n"
                   + "".join(_question(rng, rng.choice("ABCD")) for _ in range(5)) for t in topics}
    requests = [PaperRequest(prefixes[topics[i % 2]] + _question(rng, None), choices=list(LETTERS))
                for i in range(8 * size)]
    return Workload("mmlu", [lambda _: requests], f"5-shot, 2 subjects, {len(requests)} questions, select of 4",
                    {"shared_prefix": True})


def hellaswag(size: int, seed: int = 1) -> Workload:
    """8-shot sentence completion; a select over four multi-token endings (scored by their logprobs)."""
    rng = random.Random(seed)

    def ending() -> str:
        return f" then {pt.short_phrase(rng)} {rng.choice(pt.CLAUSES).format(n=rng.randint(10, 999), y=1900)}."

    shots = "".join(f"{pt.sentence(rng)} Afterwards, they{ending()}\n\n" for _ in range(8))
    requests = [PaperRequest(f"{shots}{pt.sentence(rng)} Afterwards, they", choices=[ending() for _ in range(4)])
                for _ in range(6 * size)]
    return Workload("hellaswag", [lambda _: requests], f"8-shot, {len(requests)} contexts, select of 4 endings",
                    {"shared_prefix": True})


REACT_HEAD = ("Solve a question answering task with interleaving Thought, Action, Observation steps. Thought can "
              "reason about the current situation, and Action can be three types: Search[entity], which searches "
              "the exact entity in the archive and returns the first paragraph; Lookup[keyword], which returns the "
              "next sentence containing keyword in the current passage; Finish[answer], which returns the answer "
              "and finishes the task.\nHere are some examples.\n")


def _react_example(rng: random.Random) -> str:
    steps = "".join(f"Thought {k}: I need to search {pt.city(rng)} and find what {pt.short_phrase(rng)}.\n"
                    f"Action {k}: Search[{pt.city(rng)}]\nObservation {k}: {pt.paragraph(rng, 2)}\n"
                    for k in range(1, 4))
    return f"Question: {pt.sentence(rng)} Who did this first?\n{steps}Action 4: Finish[{pt.city(rng)}]\n\n"


def react(size: int, seed: int = 2) -> Workload:
    """A ReAct agent: a long instruction with two worked traces, then each task's steps, one call per step."""
    rng = random.Random(seed)
    head = REACT_HEAD + _react_example(rng) + _react_example(rng)
    tasks = [f"Question: {pt.sentence(rng)} Who did this first?\n" for _ in range(3 * size)]
    observations = [[pt.paragraph(rng, 2) for _ in range(4)] for _ in tasks]

    def step(t: int):  # noqa: ANN202
        def build(history: list[list[str]]) -> list[PaperRequest]:
            out = []
            for i, task in enumerate(tasks):
                trace = "".join(f"Thought {k + 1}:{history[k][i]}\nObservation {k + 1}: {observations[i][k]}\n"
                                for k in range(t))
                out.append(PaperRequest(head + task + trace + f"Thought {t + 1}:", 24))
            return out
        return build

    return Workload("react", [step(t) for t in range(4)], f"{len(tasks)} tasks x 4 steps of 24 tokens",
                    {"shared_prefix": True})


def tree_of_thought(size: int, seed: int = 3, width: int = 3) -> Workload:
    """Propose `width` approaches to a problem, rate each, then answer over all of them."""
    rng = random.Random(seed)
    trunks = [f"Solve the problem step by step.\nProblem: {pt.paragraph(rng, 5)} What should the council do?\n"
              for _ in range(2 * size)]

    def propose(_: list[list[str]]) -> list[PaperRequest]:
        return [PaperRequest(t + f"Approach {i + 1}:", 24) for t in trunks for i in range(width)]

    def rate(history: list[list[str]]) -> list[PaperRequest]:
        return [PaperRequest(trunks[q] + f"Approach {i + 1}:{history[0][q * width + i]}\n"
                             "How likely is this approach to work, from 1 to 10? Rating:", 4)
                for q in range(len(trunks)) for i in range(width)]

    def answer(history: list[list[str]]) -> list[PaperRequest]:
        out = []
        for q, trunk in enumerate(trunks):
            ideas = "".join(f"Approach {i + 1}:{history[0][q * width + i]} (rating:{history[1][q * width + i]})\n"
                            for i in range(width))
            out.append(PaperRequest(trunk + ideas + "Final answer:", 24))
        return out

    return Workload("tree-of-thought", [propose, rate, answer],
                    f"{len(trunks)} problems x {width} branches, rated, then answered", {"shared_prefix": True})


def _chat(name: str, size: int, seed: int, chats: int, turns: int, user_sentences: int, answer_tokens: int) -> Workload:
    rng = random.Random(seed)
    system = ("You are a patient assistant for the town archive. Answer the visitor's questions about local "
              "history clearly and briefly, and say when the records do not tell.")
    users = [[pt.paragraph(rng, user_sentences) + " What does this tell us?" for _ in range(turns)]
             for _ in range(chats * size)]

    def turn(t: int):  # noqa: ANN202
        def build(history: list[list[str]]) -> list[PaperRequest]:
            out = []
            for c, messages in enumerate(users):
                # The plain transcript the default model's chat template renders (system, then User:/Assistant:).
                text = system + "\n\n" + "".join(f"User: {messages[k]}\nAssistant:{history[k][c]}\n" for k in range(t))
                out.append(PaperRequest(text + f"User: {messages[t]}\nAssistant:", answer_tokens))
            return out
        return build

    return Workload(name, [turn(t) for t in range(turns)],
                    f"{chats * size} chats x {turns} turns, {user_sentences}-sentence user turns, {answer_tokens}-token answers",
                    {"shared_prefix": True})


def chat_short(size: int, seed: int = 4) -> Workload:
    return _chat("chat-short", size, seed, chats=3, turns=4, user_sentences=1, answer_tokens=16)


def chat_long(size: int, seed: int = 5) -> Workload:
    return _chat("chat-long", size, seed, chats=2, turns=3, user_sentences=6, answer_tokens=48)


def json_decode(size: int, seed: int = 6) -> Workload:
    """Extract a record from an article as JSON held to JSON_SCHEMA (two worked examples first)."""
    import json

    rng = random.Random(seed)

    def example() -> str:
        record = pt.city_record(rng)
        return f"Article: {pt.city_document(rng, record)}\nJSON: {json.dumps(record)}\n\n"

    head = "Extract the facts of each article as a JSON object.\n\n" + example() + example()
    requests = [PaperRequest(f"{head}Article: {pt.city_document(rng, pt.city_record(rng))}\nJSON:", 128,
                             schema=JSON_SCHEMA) for _ in range(4 * size)]
    return Workload("json", [lambda _: requests], f"{len(requests)} articles -> one schema'd record each",
                    {"shared_prefix": True})  # the instruction and the two worked examples


def rag(size: int, seed: int = 7) -> Workload:
    """Retrieve three of eight passages by word overlap, answer, then check the answer against them."""
    rng = random.Random(seed)
    passages = [f"[{pt.city(rng)}] {pt.paragraph(rng, 6)}" for _ in range(8)]
    instruction = "Answer the question using only the retrieved passages. Be specific and cite the passage.\n\n"
    questions = []
    for _ in range(6 * size):
        target = passages[min(int(rng.expovariate(0.8)), 7)]  # a few passages are asked about most
        words = [w.strip(".,") for w in target.split()]
        questions.append("Which " + " ".join(rng.sample(words[5:], 6)) + "?")

    def retrieve(question: str) -> list[str]:
        q = set(question.lower().rstrip("?").split())
        return sorted(passages, key=lambda p: -len(q & set(p.lower().replace(".", "").split())))[:3]

    contexts = [instruction + "".join(f"Passage {i + 1}: {p}\n" for i, p in enumerate(retrieve(q)))
                for q in questions]

    def answer(_: list[list[str]]) -> list[PaperRequest]:
        return [PaperRequest(c + f"Question: {q}\nAnswer:", 32) for c, q in zip(contexts, questions)]

    def check(history: list[list[str]]) -> list[PaperRequest]:
        return [PaperRequest(c + f"Question: {q}\nAnswer:{a}\nIs the answer supported by the passages (yes or no)?", 4)
                for c, q, a in zip(contexts, questions, history[0])]

    return Workload("rag", [answer, check], f"{len(questions)} questions, top-3 of 8 passages, answer then check",
                    {"shared_prefix": True})


PAPER_WORKLOADS = {"mmlu": mmlu, "hellaswag": hellaswag, "react": react, "tree-of-thought": tree_of_thought,
                   "chat-short": chat_short, "chat-long": chat_long, "json": json_decode, "rag": rag}
