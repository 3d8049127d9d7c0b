"""A coding agent's conversation keeps its prefix cached: a Claude-Code-shaped session replayed
for 10 turns against /v1/messages, each turn streamed as Claude Code streams it, and each turn's
`cache_read_input_tokens` must cover at least 90% of its prompt after the first.

The session has the three things that defeated other servers' prefix caches:
- a billing header with a per-request nonce in the first system block (claude-code #68900);
- a `system`-role message inside `messages`, after the user's turn (vLLM #44000 / #48874);
- rolling `cache_control` breakpoints: two fixed on the system blocks, one on the last block of
  the last user turn, moved forward every turn (sglang #36877).
The assistant turns are the server's own answers sent back, as an agent does.
"""

from __future__ import annotations

import random

import httpx

from tests.server.anthropic.helpers import client_for
from tests.server.harness import RunningServer

CACHED = {"type": "ephemeral"}
INSTRUCTIONS = " ".join(
    f"Rule {i}: read the file before you edit it, keep changes small, run the tests, and say what you did."
    for i in range(30))
TOOLS = [{"name": name, "description": f"{name}: " + "a tool of the coding agent, described at length. " * 6,
          "input_schema": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
                           "required": ["city"], "additionalProperties": False}}
         for name in ("get_weather", "Read", "Edit", "Bash", "Grep", "Glob", "Write", "TodoWrite")]


def _system(rng: random.Random) -> list[dict[str, object]]:
    nonce = "".join(rng.choice("0123456789abcdef") for _ in range(5))
    header = f"x-anthropic-billing-header: cc_version=2.1.177.{nonce[:3]}; cc_entrypoint=cli; cch={nonce};"
    return [{"type": "text", "text": header},
            {"type": "text", "text": "You are Claude Code, a coding agent.", "cache_control": CACHED},
            {"type": "text", "text": INSTRUCTIONS, "cache_control": CACHED}]


def _with_rolling_mark(messages: list[dict[str, object]]) -> list[dict[str, object]]:
    """The conversation with one cache_control: on the last block of the last user turn."""
    out = []
    for message in messages:
        content = message["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        out.append({**message, "content": [{k: v for k, v in b.items() if k != "cache_control"} for b in blocks]})
    last = max(i for i, m in enumerate(out) if m["role"] == "user")
    out[last]["content"][-1] = {**out[last]["content"][-1], "cache_control": CACHED}
    return out


def test_a_claude_code_session_keeps_its_prompt_cached(tools_server: RunningServer) -> None:
    httpx.post(tools_server.url + "/flush_cache", timeout=30)
    client = client_for(tools_server)
    rng = random.Random(0)
    history: list[dict[str, object]] = [
        {"role": "user", "content": [{"type": "text", "text": "<system-reminder>The date is today.</system-reminder>"},
                                     {"type": "text", "text": "Fix the failing test in tests/test_app.py."}]},
        {"role": "system", "content": "Available agent types for the Agent tool: general-purpose, Explore."},
    ]
    shares = []
    for turn in range(10):
        with client.messages.stream(model="tiny", max_tokens=64, system=_system(rng), tools=TOOLS,
                                    messages=_with_rolling_mark(history)) as stream:
            reply = stream.get_final_message()
        usage = reply.usage
        prompt = usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
        shares.append(usage.cache_read_input_tokens / prompt)
        content = [block.model_dump(exclude_none=True) for block in reply.content]
        history.append({"role": "assistant", "content": content})
        calls = [b for b in content if b["type"] == "tool_use"]
        results = [{"type": "tool_result", "tool_use_id": c["id"], "content": f"result {turn} of {c['name']}"}
                   for c in calls]
        history.append({"role": "user", "content": results or f"go on ({turn})"})
        if turn == 4:  # the agent adds another system-role note mid-session; it stays in the history
            history.append({"role": "system", "content": "Todo list updated."})
    assert all(share >= 0.9 for share in shares[1:]), [round(s, 3) for s in shares]
