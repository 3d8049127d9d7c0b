"""A tiny random Qwen2-shaped model whose chat template makes tool round trips certain.

Random weights decide nothing here, and nothing in the server is faked. The template is a
hermes-style one (it mentions `<tool_call>`, so `--tool-call-parser auto` picks hermes) with one
twist: when the last message is the user's, the generation prompt ends with the opening tag
`<tool_call>`. The server sees that the prompt opened a call, so its structural tag starts inside
the call: the grammar makes the model write one of the request's tools by name, with arguments
that match its schema, then close the tag and end the turn. After a `tool` message the prompt
has no tag, so the model answers in free text, bounded by max_tokens (or its end-of-sequence
token). With `chat_template_kwargs={"think": true}` the prompt ends inside `<think>` instead (as
Qwen3 thinking models' templates do), for the reasoning parser. A real hermes model gets the same treatment; it just opens the tag itself.

As Qwen's vocabulary does, the tokenizer has the markup as single tokens (`<tool_call>`, and a
few of the call's JSON pieces), so a call is some 25 tokens rather than 70 bytes: the tests stay
fast on a busy 2-core machine.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.tiny_models import tiny_config
from tests.tiny_tokenizer import VOCAB_SIZE, save_tiny_tokenizer

# Added (not special) tokens, as `<tool_call>` is in Qwen 2.5's vocabulary; text, not control tokens.
ADDED = ["<tool_call>", "</tool_call>", '{"name": ', '"arguments": ', '"get_weather"', '"city"', '"Paris"', '"Tokyo"']

AGENT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}system: call a tool as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>; tools:"
    "{% for t in tools %} {{ t['function']['name'] }}{% endfor %}\n{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' and m.get('tool_calls') %}assistant:"
    "{% for c in m['tool_calls'] %}<tool_call>\n{\"name\": \"{{ c['function']['name'] }}\", \"arguments\": "
    "{{ c['function']['arguments'] | tojson }}}\n</tool_call>{% endfor %}\n"
    "{% elif m['role'] == 'tool' %}tool: {{ m['content'] }}\n"
    "{% else %}{{ m['role'] }}: {{ m['content'] }}\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% if think is defined and think %}<think>"
    "{% elif messages[-1]['role'] == 'user' %}<tool_call>{% endif %}{% endif %}"
)


def save_agent_model(folder: Path, seed: int = 0) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    save_tiny_tokenizer(folder, bos=False)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    assert tokenizer.add_tokens(ADDED) == len(ADDED)
    tokenizer.save_pretrained(str(folder))
    torch.manual_seed(seed)
    config = tiny_config("qwen2")
    config.vocab_size = max(VOCAB_SIZE, len(tokenizer))
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(str(folder))
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = AGENT_TEMPLATE
    config_path.write_text(json.dumps(config, indent=2))
    template_file = folder / "chat_template.jinja"  # transformers prefers this file when it exists
    if template_file.exists():
        template_file.write_text(AGENT_TEMPLATE)
    return folder
