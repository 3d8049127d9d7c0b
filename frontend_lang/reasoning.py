"""`separate_reasoning`: split a reasoning model's output into its thinking and its answer.

As SGLang's `sgl.separate_reasoning(gen(...), model_type=...)`: the gen's variable keeps the
answer, `<name>_reasoning_content` gets the thinking, and the program text keeps only the
answer. Models differ in their tags; DeepSeek-R1 opens its thinking without a tag, so with no
tag at all its whole output is thinking.
"""

from __future__ import annotations

THINK_TAGS = ("<think>", "</think>")
TAGS: dict[str, tuple[str, str]] = {"kimi": ("\u25c1think\u25b7", "\u25c1/think\u25b7")}
STARTS_IN_REASONING = {"deepseek-r1"}


def reasoning_name(name: str) -> str:
    return f"{name}_reasoning_content"


def split_reasoning(text: str, model_type: str | None) -> tuple[str, str]:
    """(reasoning, answer) of one output."""
    begin, end = TAGS.get(model_type or "", THINK_TAGS)
    if end in text:
        reasoning, answer = text.split(end, 1)
        return reasoning.replace(begin, "", 1).strip(), answer.strip()
    if begin in text:  # thinking that never ended (cut by max_tokens)
        before, reasoning = text.split(begin, 1)
        return reasoning.strip(), before.strip()
    if model_type in STARTS_IN_REASONING:
        return text.strip(), ""
    return "", text
