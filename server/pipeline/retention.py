"""Retention requests: a client asks that its prompt's prefix stay cached for a while.

Two spellings, one mechanism (Engine.pin_prefix, runtime/kv/pins.py: evicted last, within a
quarter of the pool, expiring on its own):
- chat: Anthropic's `cache_control: {"type": "ephemeral", "ttl": "5m" | "1h"}` on a message or on
  one of its content parts retains the prompt up to and including that message (each marked
  message is its own breakpoint);
- /generate: `retention_seconds` (and an optional `priority`: higher is released later) retains
  the whole prompt.
The prefix is retained once the request has finished (its KV is in the radix tree by then), under
its cache_salt namespace, keyed by the salt and the tokens, so sending it again refreshes the
retention instead of adding a second one.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import msgspec
import numpy as np

from runtime import Engine, Output
from server.common.errors import APIError
from server.common.state import ServerState
from server.pipeline.messages import render_prompt
from server.pipeline.request import ChatCompletionRequest

MAX_RETENTION_S = 24 * 3600.0
CACHE_TTLS = {"5m": 300.0, "1h": 3600.0}  # Anthropic's two TTLs; "5m" when none is given


@dataclass(frozen=True)
class Retain:
    ids: list[int]
    ttl_s: float
    priority: int = 0


def retention_seconds(value: object, field: str = "retention_seconds") -> float | None:
    """A /generate retention time: a number of seconds in (0, 24 h]; None when not asked."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_RETENTION_S:
        raise APIError(400, f"{field}: must be a number of seconds in (0, {MAX_RETENTION_S:.0f}], got {value!r}",
                       field)
    return float(value)


def retention_priority(value: object, field: str = "priority") -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise APIError(400, f"{field}: must be an integer, got {value!r}", field)
    return value


def cache_control_ttl(control: object, field: str) -> float:
    """Anthropic's cache_control object -> seconds; a 400 naming the field when it is not one."""
    if not isinstance(control, dict):
        raise APIError(400, f"{field}: must be an object like {{\"type\": \"ephemeral\", \"ttl\": \"5m\"}}", field)
    unknown = set(control) - {"type", "ttl"}
    if unknown:
        raise APIError(400, f"{field}: unknown key {sorted(unknown)[0]!r}", field)
    if control.get("type") != "ephemeral":
        raise APIError(400, f"{field}.type: must be \"ephemeral\", got {control.get('type')!r}", f"{field}.type")
    ttl = control.get("ttl", "5m")
    if ttl not in CACHE_TTLS:
        raise APIError(400, f"{field}.ttl: must be one of {sorted(CACHE_TTLS)}, got {ttl!r}", f"{field}.ttl")
    return CACHE_TTLS[ttl]


def chat_breakpoints(messages: Sequence[object]) -> list[tuple[int, float]]:
    """(message index, TTL) for each message carrying cache_control itself or on a content part."""
    marks = []
    for i, message in enumerate(messages):
        ttls = []
        control = getattr(message, "cache_control", None)
        if control is not None:
            ttls.append(cache_control_ttl(control, f"messages[{i}].cache_control"))
        content = getattr(message, "content", None)
        for j, part in enumerate(content if isinstance(content, list) else []):
            control = getattr(part, "cache_control", None)
            if control is not None:
                ttls.append(cache_control_ttl(control, f"messages[{i}].content[{j}].cache_control"))
        if ttls:
            marks.append((i, max(ttls)))
    return marks


def chat_retains(body: object, prompt_ids: Sequence[int], render: object) -> list[Retain]:
    """What a chat request asks to retain: for each breakpoint, the prompt's tokens up to the end
    of that message. `render(messages)` gives the token ids of the first messages alone (no
    generation prompt); the retained prefix is where those agree with the whole prompt."""
    marks = chat_breakpoints(getattr(body, "messages", []))
    retains = []
    full = np.asarray(prompt_ids, dtype=np.int64)
    for i, ttl in marks:
        try:
            ids = np.asarray(render(getattr(body, "messages")[: i + 1]), dtype=np.int64)  # type: ignore[operator]
        except ValueError:
            continue  # a template that cannot render these messages alone: nothing to retain here
        n = min(len(ids), len(full))
        diff = np.flatnonzero(ids[:n] != full[:n])
        agree = int(diff[0]) if len(diff) else n
        if agree:
            retains.append(Retain([int(t) for t in full[:agree]], ttl))
    return retains


def chat_request_retains(state: ServerState, body: ChatCompletionRequest, prompt_ids: Sequence[int]) -> list[Retain]:
    """chat_retains for a chat completion request, rendering its first messages as plan_chat does."""
    if not chat_breakpoints(body.messages):
        return []
    tokenizer = state.engine.tokenizer

    def render(messages: list[object]) -> list[int]:
        head = msgspec.structs.replace(body, messages=messages)
        return tokenizer.encode_rendered(render_prompt(tokenizer, head, False))

    return chat_retains(body, prompt_ids, render)


def retain(engine: Engine, retains: Sequence[Retain], cache_salt: str | None, lora: str | None = None) -> None:
    """Ask the engine to keep each prefix (after the request that computed it finished), in the
    request's namespace: its salt, and its LoRA adapter where it ran through one."""
    for item in retains:
        key = [cache_salt, item.ids] if lora is None else [cache_salt, item.ids, "lora", lora]
        digest = hashlib.blake2b(msgspec.json.encode(key), digest_size=16).hexdigest()
        engine.pin_prefix(f"retain:{digest}", item.ids, item.ttl_s, cache_salt, item.priority, lora=lora)


async def retaining(outputs: AsyncIterator[Output], engine: Engine, retains: Sequence[Retain],
                    cache_salt: str | None, lora: str | None = None) -> AsyncIterator[Output]:
    """Pass a request's outputs through; once it has finished, retain its prefixes."""
    finished = False
    async for out in outputs:
        finished = finished or out.finished
        yield out
    if finished and retains:
        retain(engine, retains, cache_salt, lora)
