"""Turning chat messages into prompt text with a model's own (Hugging Face, Jinja) chat template.

Programs mix roles and raw text, so the interpreter needs each role's opening and closing text
in context. It gets them by rendering the conversation with and without the new message (a
sentinel as its content) and taking the difference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Render = Callable[[list[dict[str, str]], bool], str]
SENTINEL = "\x00RADIXSERVE-CONTENT\x00"


def jinja_renderer(template: str, bos_token: str = "", eos_token: str = "") -> Render:
    """A renderer for a template string (used by HTTP backends that have no local tokenizer)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    compiled = env.from_string(template)

    def render(messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               bos_token=bos_token, eos_token=eos_token)

    return render


@dataclass
class RoleText:
    prefix: str  # text to append before the content
    suffix: str  # text to append after it


def role_text(render: Render, history: list[dict[str, str]], rendered_so_far: str, role: str) -> RoleText:
    """Opening and closing text of a `role` message after `history` (already rendered as `rendered_so_far`)."""
    full = render(history + [{"role": role, "content": SENTINEL}], False)
    before, _, after = full.partition(SENTINEL)
    if role == "assistant":
        # Generation starts where the template would prompt the model to answer.
        try:
            prompt = render(history, True)
        except Exception:  # noqa: BLE001 - a template may refuse an empty history
            prompt = before
        if prompt.startswith(rendered_so_far) and before.startswith(prompt.rstrip()):
            before = prompt
    if before.startswith(rendered_so_far):
        return RoleText(before[len(rendered_so_far) :], after)
    # The template rendered earlier turns differently once this one exists (e.g. a default system
    # prompt replaced by the user's): keep what we have and append only this turn's own text.
    common = 0
    while common < min(len(before), len(rendered_so_far)) and before[common] == rendered_so_far[common]:
        common += 1
    return RoleText(before[common:], after)
