"""The tiny tool-calling model of tests/server/agent_model.py, with two changes for the Anthropic and
Ollama rooms: its template opens `<think>` on Qwen3's `enable_thinking` (the switch Anthropic's
`thinking` turns on), and its context is long enough for a coding agent's system prompt and tools.
"""

from __future__ import annotations

import json
from pathlib import Path

import anthropic

from tests.server.agent_model import save_agent_model
from tests.server.harness import RunningServer


def client_for(server: RunningServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def save_tools_model(folder: Path, context: int = 8192) -> Path:
    save_agent_model(folder)
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        path = folder / name
        if path.exists():
            path.write_text(path.read_text().replace("think is defined and think",
                                                     "enable_thinking is defined and enable_thinking"))
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config["max_position_embeddings"] = context
    config_path.write_text(json.dumps(config, indent=2))
    return folder
