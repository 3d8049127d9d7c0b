"""Claude Code itself, headless (`claude -p`), against /v1/messages on the built-in agent model
(slow; needs the agent-model extra and Claude Code's CLI: `npm install -g @anthropic-ai/claude-code`,
or RADIXSERVE_CLAUDE naming the binary).

Its real requests are what the replay in test_claude_code_cache.py imitates: a billing nonce in the
first system block, a 20-odd-tool prompt of some 11,000 tokens, a `system` message after the
user's turn, `max_tokens` 32,000, adaptive thinking. Two runs: each ends with exit 0 and the
model's answer in the output, and the second reads its system prompt and tools from the cache (it
differs from the first from the user's words on).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.runtime.loading.test_agent_model import needs_agent_model
from tests.server.harness import server_process

CLAUDE = os.environ.get("RADIXSERVE_CLAUDE") or shutil.which("claude")
pytestmark = [pytest.mark.slow, needs_agent_model, pytest.mark.timeout(2400),
              pytest.mark.skipif(CLAUDE is None, reason="Claude Code's CLI is not installed (npm install -g "
                                                        "@anthropic-ai/claude-code, or set RADIXSERVE_CLAUDE)")]


def _counter(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=30).text
    return float(re.search(rf"^{name} (\S+)$", text, re.MULTILINE).group(1))  # type: ignore[union-attr]


def _claude(url: str, home: Path, prompt: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(home), "ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "unused",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1",
           **{name: "agent" for name in ("ANTHROPIC_MODEL", "ANTHROPIC_SMALL_FAST_MODEL",
                                          "ANTHROPIC_DEFAULT_HAIKU_MODEL", "ANTHROPIC_DEFAULT_SONNET_MODEL",
                                          "ANTHROPIC_DEFAULT_OPUS_MODEL")}}
    return subprocess.run([str(CLAUDE), "-p", prompt], env=env, cwd=home, capture_output=True, text=True,
                          timeout=1200, check=False)


def test_claude_code_completes_headless_turns_and_keeps_its_prompt_cached(tmp_path: Path) -> None:
    with server_process("--model", "agent", "--log-level", "warning", log=tmp_path / "server.log") as url:
        first = _claude(url, tmp_path, "Reply with the single word: hello")
        assert first.returncode == 0, (first.stdout, first.stderr)
        assert "hello" in first.stdout.lower()
        prompt, cached = _counter(url, "radixserve_prompt_tokens_total"), _counter(url, "radixserve_cached_tokens_total")
        second = _claude(url, tmp_path, "Reply with the single word: goodbye")
        assert second.returncode == 0, (second.stdout, second.stderr)
        assert "goodbye" in second.stdout.lower()
        asked = _counter(url, "radixserve_prompt_tokens_total") - prompt
        read = _counter(url, "radixserve_cached_tokens_total") - cached
        assert read >= 0.5 * asked, (read, asked)  # measured: 9,478 of 11,590 (Claude Code 2.1.331)
