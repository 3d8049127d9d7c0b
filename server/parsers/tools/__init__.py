"""Tool-call parsers: each model family's own tool-call format read out of its text into OpenAI
`tool_calls`, streamed or not (base.py), and the grammar that keeps a started call valid
(grammar.py). `--tool-call-parser NAME` picks one; `auto` reads the chat template."""

from __future__ import annotations

from server.parsers.tools.base import (
    ArgumentsDelta,
    CallDraft,
    CallStart,
    ContentDelta,
    Event,
    Parsed,
    StreamingToolParser,
    ToolParser,
    ToolSpec,
    new_call_id,
)
from server.parsers.tools.gemma import GemmaParser
from server.parsers.tools.grammar import structural_tag
from server.parsers.tools.harmony import HarmonyParser
from server.parsers.tools.hermes import HermesParser
from server.parsers.tools.llama3 import Llama3JsonParser
from server.parsers.tools.mistral import MistralParser
from server.parsers.tools.pythonic import PythonicParser
from server.parsers.tools.qwen25_coder import Qwen25CoderParser

PARSERS: dict[str, type[ToolParser]] = {p.name: p for p in (HermesParser, Llama3JsonParser, MistralParser,
                                                             PythonicParser, GemmaParser, Qwen25CoderParser,
                                                             HarmonyParser)}
# The names vLLM and SGLang users already type.
ALIASES = {"qwen": "hermes", "qwen25": "hermes", "qwen2_5": "hermes", "qwen3": "hermes", "llama3_json": "llama3",
           "llama": "llama3", "llama4_pythonic": "pythonic", "gemma3": "gemma",
           "qwen2_5_coder": "qwen25_coder", "gpt-oss": "gpt_oss", "openai": "gpt_oss", "harmony": "gpt_oss"}
CHOICES = ("auto", "none", *PARSERS, *ALIASES)


def parser_class(name: str) -> type[ToolParser]:
    """The parser a flag names; a ValueError naming the flag when there is none."""
    key = ALIASES.get(name, name)
    if key not in PARSERS:
        raise ValueError(f"tool_call_parser: unknown parser {name!r}; use auto, none or one of "
                         f"{', '.join(sorted([*PARSERS, *ALIASES]))}")
    return PARSERS[key]


def detect(chat_template: str | None, model_type: str = "") -> tuple[str | None, str]:
    """(parser name or None, why): what `auto` picks from the chat template (and model type)."""
    template = chat_template or ""
    rules = [("to=functions.", "gpt_oss"), ("<tool_call>", "hermes"), ("[TOOL_CALLS]", "mistral"), ("tool_code", "gemma"),
             ("[func_name1(", "pythonic"), ("<|python_tag|>", "llama3"), ('"parameters"', "llama3")]
    for marker, name in rules:
        if marker in template:
            return name, f"the chat template mentions {marker}"
    if model_type.startswith("gemma"):
        return "gemma", f"model type {model_type} (Gemma has no tool token; its guide's tool_code form)"
    return None, "no tool-call format found in the chat template"


__all__ = ["ALIASES", "CHOICES", "PARSERS", "ArgumentsDelta", "CallDraft", "CallStart", "ContentDelta", "Event",
           "Parsed", "StreamingToolParser", "ToolParser", "ToolSpec", "detect", "new_call_id", "parser_class",
           "structural_tag"]
