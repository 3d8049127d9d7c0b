"""opencode itself, headless (`opencode run`), against /v1/chat/completions on the built-in agent model
(slow; needs the agent-model extra and the CLI: `npm install -g opencode-ai`, or RADIXSERVE_OPENCODE
naming the binary; on its first run opencode fetches its OpenAI-compatible provider package from
the npm registry).

opencode asks for the model's whole output limit as max_tokens (32,000 unless the model's `limit`
says otherwise); like OpenAI and vLLM, a request past the context window is a 400, so the config
gives the limit, as opencode's docs say for local models. The turn ends with exit 0 and the
model's answer in the output.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.runtime.loading.test_agent_model import needs_agent_model
from tests.server.harness import server_process

OPENCODE = os.environ.get("RADIXSERVE_OPENCODE") or shutil.which("opencode")
pytestmark = [pytest.mark.slow, needs_agent_model, pytest.mark.timeout(1800),
              pytest.mark.skipif(OPENCODE is None, reason="opencode is not installed (npm install -g opencode-ai, "
                                                          "or set RADIXSERVE_OPENCODE)")]


def test_opencode_run_completes_a_headless_turn(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    with server_process("--model", "agent", "--log-level", "warning", log=tmp_path / "server.log") as url:
        provider = {"npm": "@ai-sdk/openai-compatible", "name": "radixserve",
                    "options": {"baseURL": f"{url}/v1", "apiKey": "unused"},
                    "models": {"agent": {"name": "agent", "limit": {"context": 32768, "output": 2048}}}}
        (work / "opencode.json").write_text(json.dumps({"provider": {"radixserve": provider}}))
        # (opencode takes its project folder from PWD, not from the working directory)
        result = subprocess.run([str(OPENCODE), "run", "-m", "radixserve/agent", "Reply with the word hello."],
                                env={**os.environ, "HOME": str(tmp_path), "PWD": str(work)}, cwd=work, capture_output=True, text=True,
                                timeout=1200, check=False, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-2000:])
    assert "hello" in result.stdout.lower()
