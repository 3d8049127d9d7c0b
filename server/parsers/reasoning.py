"""Reasoning parsers: a thinking model's `<think>...</think>` text goes to `reasoning_content`,
the rest to `content` (and on to the tool-call parser, so calls after the reasoning are found).

- `qwen3`: reasoning only when the output opens with `<think>` (Qwen3 with enable_thinking off
  writes none), or when the prompt already ends inside `<think>` (Qwen3 thinking-2507).
- `deepseek_r1`: the output is reasoning until `</think>` (R1's template opens `<think>` in the
  prompt, so the output often lacks it); with no `</think>` at all, it is all reasoning.
- `gpt_oss`: the harmony format (harmony.py): the `analysis` channel is reasoning, `final` and
  commentary preambles are content, a call to `functions.*` is handed on as call markup.

`auto` picks from the chat template. The streamed split equals the non-streamed one: a tag cut
off at the end of the text so far is held back until it is complete (or is not a tag after all).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from server.parsers import harmony

START, END = "<think>", "</think>"


@dataclass
class Split:
    reasoning: str
    content: str
    in_reasoning: bool  # the text so far ends inside the reasoning


class ReasoningParser:
    name: ClassVar[str] = "qwen3"
    starts_inside: ClassVar[bool] = False  # the output begins in reasoning without writing <think>
    needs_special_tokens: ClassVar[bool] = False  # its markers are special tokens: the text must keep them

    def __init__(self, prompt_open: bool = False) -> None:
        # The prompt ended with <think> (the template opened the reasoning): start inside it.
        self.inside = prompt_open or self.starts_inside

    def split(self, text: str, final: bool = True) -> Split:
        body = text.lstrip()
        if body.startswith(START):
            body, inside = body[len(START):], True
        elif not final and START.startswith(body):
            return Split("", "", False)  # nothing but blanks yet, or what may still become <think>
        else:
            inside, body = self.inside, body if self.inside else text
        if not inside:
            return Split("", text, False)
        end = body.find(END)
        if end >= 0:
            return Split(body[:end], body[end + len(END):], False)
        if not final:
            body = body[:len(body) - _partial_suffix(body, END)]
        return Split(body, "", True)


class DeepSeekR1Parser(ReasoningParser):
    name: ClassVar[str] = "deepseek_r1"
    starts_inside: ClassVar[bool] = True


class HarmonyReasoningParser(ReasoningParser):
    name: ClassVar[str] = "gpt_oss"
    needs_special_tokens: ClassVar[bool] = True

    def split(self, text: str, final: bool = True) -> Split:
        reasoning, content, inside = [], [], False
        for message in harmony.messages(text, final):
            function = message.function
            if function is not None:  # whole, for the tool-call parser
                content.append(harmony.call_markup(function) + message.body + (harmony.CALL if message.closed else ""))
            elif message.channel == "analysis":
                reasoning.append(message.body)
            else:
                content.append(message.body)
            inside = message.channel == "analysis" and not message.closed
        return Split("".join(reasoning), "".join(content), inside)


def _partial_suffix(text: str, tag: str) -> int:
    """How many characters at the end of `text` could be the start of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


REASONING_PARSERS: dict[str, type[ReasoningParser]] = {"qwen3": ReasoningParser, "deepseek_r1": DeepSeekR1Parser,
                                                       "gpt_oss": HarmonyReasoningParser}
ALIASES = {"deepseek-r1": "deepseek_r1", "qwen3-thinking": "qwen3", "deepseek_v3": "deepseek_r1",
           "gpt-oss": "gpt_oss", "openai_gptoss": "gpt_oss", "harmony": "gpt_oss"}


def reasoning_class(name: str) -> type[ReasoningParser]:
    key = ALIASES.get(name, name)
    if key not in REASONING_PARSERS:
        raise ValueError(f"reasoning_parser: unknown parser {name!r}; use auto, none or one of "
                         f"{', '.join(sorted([*REASONING_PARSERS, *ALIASES]))}")
    return REASONING_PARSERS[key]


def detect(chat_template: str | None) -> tuple[str | None, str]:
    """(parser name or None, why): what `auto` picks from the chat template."""
    template = chat_template or ""
    if harmony.CHANNEL in template:
        return "gpt_oss", f"the chat template writes the harmony format ({harmony.CHANNEL})"
    if START not in template and END not in template:
        return None, "the chat template has no <think>"
    if "\uff5c" in template:  # DeepSeek's templates spell their tokens with full-width bars
        return "deepseek_r1", "the chat template is DeepSeek's and mentions <think>"
    return "qwen3", "the chat template mentions <think>"


class StreamingReasoning:
    """Feed the model's text; get back (reasoning delta, content delta) as they become certain."""

    def __init__(self, parser: ReasoningParser) -> None:
        self.parser = parser
        self.text = ""
        self.sent_reasoning = 0
        self.sent_content = 0

    def feed(self, delta: str, final: bool = False) -> tuple[str, str]:
        self.text += delta
        split = self.parser.split(self.text, final)
        reasoning, content = split.reasoning[self.sent_reasoning:], split.content[self.sent_content:]
        self.sent_reasoning += len(reasoning)
        self.sent_content += len(content)
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        return self.feed("", final=True)
