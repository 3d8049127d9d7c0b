"""OpenAI's Codex CLI itself, headless (`codex exec`), against /v1/responses on the built-in agent
model (slow; needs the agent-model extra and the CLI: `npm install -g @openai/codex`, or
RADIXSERVE_CODEX naming the binary).

Its real request is what server/responses/tool_kinds.py reads: function tools, a `namespace` of
sub-agent tools, a hosted `web_search`, `store: false` with the whole history each turn,
`include`, `reasoning`, `prompt_cache_key`, `client_metadata`, streaming; and it asks for the model
by the built-in's canonical name. The turn ends with exit 0 and the model's answer in the output.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.runtime.loading.test_agent_model import needs_agent_model
from tests.server.harness import server_process

CODEX = os.environ.get("RADIXSERVE_CODEX") or shutil.which("codex")
pytestmark = [pytest.mark.slow, needs_agent_model, pytest.mark.timeout(1800),
              pytest.mark.skipif(CODEX is None, reason="Codex CLI is not installed (npm install -g @openai/codex, "
                                                       "or set RADIXSERVE_CODEX)")]


def test_codex_exec_completes_a_headless_turn(tmp_path: Path) -> None:
    with server_process("--model", "agent", "--log-level", "warning", log=tmp_path / "server.log") as url:
        provider = f'{{name="radixserve", base_url="{url}/v1", wire_api="responses", env_key="RADIXSERVE_KEY"}}'
        env = {**os.environ, "HOME": str(tmp_path), "RADIXSERVE_KEY": "unused"}
        result = subprocess.run(
            [str(CODEX), "exec", "--skip-git-repo-check", "-c", "model_provider=radixserve",
             "-c", f"model_providers.radixserve={provider}", "-m", "qwen2.5-coder-0.5b-instruct",
             "Reply with the word hello."],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=1200, check=False, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-2000:])
    assert "hello" in result.stdout.lower()
