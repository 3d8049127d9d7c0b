"""The examples run against the real default model (slow), as a user would run them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runtime import Engine
from tests.server.harness import serve

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXPECT = {
    "chat.py": "Paris",
    "rag.py": "Eiffel",
    "few_shot_select.py": "negative",
    "tree_of_thought.py": "Best idea:",
    "react_agent.py": "Answer:",
    # SGLang-style program through sgl.Runtime: few-shot capitals, batched and as joined forks
    "sglang_style.py": "In parallel: Paris, Tokyo, Madrid",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECT))
def test_example_runs_on_the_default_model(name: str) -> None:
    result = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=600,
                            cwd=EXAMPLES)
    assert result.returncode == 0, result.stderr[-2000:]
    assert EXPECT[name] in result.stdout


@pytest.mark.slow
def test_openai_client_example_against_the_server() -> None:
    with Engine(model="default", kv_cache_tokens=8192) as engine, serve(engine) as running:
        result = subprocess.run([sys.executable, str(EXAMPLES / "openai_client.py"), "--url", running.url + "/v1"],
                                capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Paris" in result.stdout
