"""Seeded, size-scalable workloads in the shape of the SGLang paper's.

A workload is a list of phases; each phase is a batch of requests run concurrently, and a
phase may be built from the previous phase's outputs (the turns of a chat, the branches of a
tree of thought). A request either generates text or scores choices (`select`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

SCALES = {"small": 1, "medium": 4, "large": 16}
_WORDS = ("time person year way day thing man world life hand part child eye woman place work week case point "
          "government company number group problem fact river garden music market letter answer energy island "
          "history science ocean forest village station morning winter summer language window mountain").split()


@dataclass
class Request:
    prompt: str
    max_new_tokens: int = 16
    choices: list[str] | None = None  # a select: score these continuations instead of generating


@dataclass
class Workload:
    name: str
    phases: list[Callable[[list[list[str]]], list[Request]]]  # each gets every earlier phase's outputs
    description: str = ""
    notes: dict[str, object] = field(default_factory=dict)


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def shared_prefix(scale: int, seed: int = 0) -> Workload:
    """G groups x P prompts sharing a long system prompt, short distinct questions."""
    rng = random.Random(seed)
    groups, per_group = 2 * scale, 8
    systems = [f"You are assistant number {g}. " + _text(rng, 300) for g in range(groups)]
    requests = [Request(systems[g] + "\nQuestion: " + _text(rng, 12) + "?\nAnswer:", 16)
                for g in range(groups) for _ in range(per_group)]
    rng.shuffle(requests)
    return Workload("shared-prefix", [lambda _: requests], f"{groups} groups x {per_group} prompts, ~400-token system prompts")


def multi_turn(scale: int, seed: int = 0) -> Workload:
    """Chats of several turns; each turn's prompt is the whole history so far."""
    rng = random.Random(seed)
    chats, turns = 4 * scale, 4
    openers = ["The following is a conversation.\n" + _text(rng, 120) for _ in range(chats)]
    questions = [[_text(rng, 15) + "?" for _ in range(turns)] for _ in range(chats)]

    def turn(t: int) -> Callable[[list[list[str]]], list[Request]]:
        def build(history: list[list[str]]) -> list[Request]:
            out = []
            for c in range(chats):
                text = openers[c]
                for k in range(t):
                    text += f"\nUser: {questions[c][k]}\nAssistant:{history[k][c]}"
                out.append(Request(text + f"\nUser: {questions[c][t]}\nAssistant:", 16))
            return out
        return build

    return Workload("multi-turn", [turn(t) for t in range(turns)], f"{chats} chats x {turns} turns")


def few_shot(scale: int, seed: int = 0) -> Workload:
    """k-shot prompt + question, MMLU-style: pick one of four answers with select."""
    rng = random.Random(seed)
    shots = "".join(f"Question: {_text(rng, 20)}?\nA. {_text(rng, 3)}\nB. {_text(rng, 3)}\nC. {_text(rng, 3)}\n"
                    f"D. {_text(rng, 3)}\nAnswer: {rng.choice('ABCD')}\n\n" for _ in range(5))
    requests = [Request(shots + f"Question: {_text(rng, 20)}?\nA. {_text(rng, 3)}\nB. {_text(rng, 3)}\n"
                        f"C. {_text(rng, 3)}\nD. {_text(rng, 3)}\nAnswer:", choices=[" A", " B", " C", " D"])
                for _ in range(8 * scale)]
    return Workload("few-shot", [lambda _: requests], f"5-shot, {len(requests)} questions, select over 4 choices")


def tree_of_thought(scale: int, seed: int = 0) -> Workload:
    """Fork-heavy: each question branches into W ideas, then a final answer over all of them."""
    rng = random.Random(seed)
    questions = ["Solve step by step. " + _text(rng, 200) + "\nQuestion: " + _text(rng, 10) + "?\n"
                 for _ in range(2 * scale)]
    width = 4

    def branches(_: list[list[str]]) -> list[Request]:
        return [Request(q + f"Idea {i + 1}:", 16) for q in questions for i in range(width)]

    def final(history: list[list[str]]) -> list[Request]:
        out = []
        for qi, q in enumerate(questions):
            ideas = "".join(f"Idea {i + 1}:{history[0][qi * width + i]}\n" for i in range(width))
            out.append(Request(q + ideas + "Best answer:", 16))
        return out

    return Workload("tree-of-thought", [branches, final], f"{len(questions)} questions x {width} branches")


def rag(scale: int, seed: int = 0) -> Workload:
    """System prompt + one of a few documents + a question."""
    rng = random.Random(seed)
    system = "Answer using only the document. " + _text(rng, 60)
    documents = [f"Document {d}: " + _text(rng, 350) for d in range(3)]
    requests = [Request(system + "\n" + rng.choice(documents) + "\nQuestion: " + _text(rng, 10) + "?\nAnswer:", 16)
                for _ in range(12 * scale)]
    return Workload("rag", [lambda _: requests], f"{len(requests)} questions over {len(documents)} documents")


def no_share(scale: int, seed: int = 0) -> Workload:
    """Random prompts that share nothing: the overhead case for a prefix cache."""
    rng = random.Random(seed)
    requests = [Request(_text(rng, rng.randint(150, 300)), 16) for _ in range(12 * scale)]
    return Workload("no-share", [lambda _: requests], f"{len(requests)} unrelated prompts")


WORKLOADS: dict[str, Callable[[int, int], Workload]] = {
    "shared-prefix": shared_prefix, "multi-turn": multi_turn, "few-shot": few_shot,
    "tree-of-thought": tree_of_thought, "rag": rag, "no-share": no_share,
}


def make_workload(name: str, scale: str = "small", seed: int = 0) -> Workload:
    if name not in WORKLOADS:
        raise ValueError(f"workload must be one of {sorted(WORKLOADS)}, got {name!r}")
    return WORKLOADS[name](SCALES[scale], seed)
