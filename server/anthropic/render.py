"""The pipeline's answer in Anthropic's shapes: a finished message's content blocks (thinking, text,
tool_use), its stop_reason and usage, and the streamed events (message_start, ping,
content_block_start / _delta / _stop, message_delta with usage, message_stop).

Usage counts the prompt the way Anthropic does, in three parts that add up to it:
`cache_read_input_tokens` (served from the radix cache), `cache_creation_input_tokens` (computed now
and retained because a block's cache_control asked: up to the furthest breakpoint) and `input_tokens`
(the rest).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Sequence

import msgspec

from runtime import Output
from server.anthropic.errors import error_body
from server.common.errors import APIError
from server.pipeline.chat import ChatPlan, ChoiceStream
from server.pipeline.request import AssistantMessage, DeltaMessage


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


def tool_use_id(call_id: str) -> str:
    """The pipeline's call id as Anthropic spells one (toolu_...)."""
    return "toolu_" + call_id.removeprefix("call_")


def usage(out: Output, plan: ChatPlan, output_tokens: int | None = None) -> dict[str, object]:
    read = out.cached_tokens
    created = {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0}
    end = read
    for kept in sorted(plan.retains, key=lambda r: len(r.ids)):  # each breakpoint's new tokens, by its TTL
        if len(kept.ids) > end:
            created["ephemeral_1h_input_tokens" if kept.ttl_s >= 3600 else "ephemeral_5m_input_tokens"] += \
                len(kept.ids) - end
            end = len(kept.ids)
    total = sum(created.values())
    return {"input_tokens": out.prompt_tokens - read - total, "cache_creation_input_tokens": total,
            "cache_read_input_tokens": read, "cache_creation": created,
            "output_tokens": out.completion_tokens if output_tokens is None else output_tokens}


def stop_reason(out: Output, finish_reason: str | None, stop_sequences: Sequence[str],
                capped: bool = False) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) from the pipeline's finish_reason and the stop that matched;
    `capped`: max_tokens was cut to the room the context window leaves."""
    if finish_reason == "tool_calls":
        return "tool_use", None
    if finish_reason == "length":
        return ("model_context_window_exceeded" if capped else "max_tokens"), None
    if isinstance(out.matched_stop, str) and out.matched_stop in stop_sequences:
        return "stop_sequence", out.matched_stop
    return "end_turn", None


def content_blocks(message: AssistantMessage, omit_thinking: bool = False) -> list[dict[str, object]]:
    """`omit_thinking`: the request's thinking.display is "omitted": the block, without its text."""
    blocks: list[dict[str, object]] = []
    if message.reasoning_content:
        thought = "" if omit_thinking else message.reasoning_content
        blocks.append({"type": "thinking", "thinking": thought, "signature": ""})
    if message.content:
        blocks.append({"type": "text", "text": message.content})
    for call in message.tool_calls or []:
        try:
            arguments = json.loads(call.function.arguments)
        except json.JSONDecodeError:
            continue  # a call cut short by max_tokens: not a call anyone should run
        blocks.append({"type": "tool_use", "id": tool_use_id(call.id), "name": call.function.name,
                       "input": arguments})
    if not blocks:  # nothing said: one empty text block, as clients read content[0].text
        blocks.append({"type": "text", "text": ""})
    return blocks


def message_object(rid: str, model: str, blocks: list[dict[str, object]], reason: str | None,
                   sequence: str | None, usage_: dict[str, int]) -> dict[str, object]:
    return {"id": rid, "type": "message", "role": "assistant", "model": model, "content": blocks,
            "stop_reason": reason, "stop_sequence": sequence, "usage": usage_}


class BlockStream:
    """The chat pipeline's streamed deltas as content blocks and their events."""

    def __init__(self, omit_thinking: bool = False) -> None:
        self.index = -1
        self.open: str | None = None
        self.omit_thinking = omit_thinking

    def feed(self, delta: DeltaMessage) -> list[dict[str, object]]:
        events: list[dict[str, object]] = []
        if delta.reasoning_content:
            events += self._start("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            if not self.omit_thinking:
                events.append(self._delta({"type": "thinking_delta", "thinking": delta.reasoning_content}))
        if delta.content:
            events += self._start("text", {"type": "text", "text": ""})
            events.append(self._delta({"type": "text_delta", "text": delta.content}))
        for call in delta.tool_calls or []:
            if call.id is not None:  # a new call: a new block, its name first
                name = call.function.name if call.function is not None else ""
                events += self.close()
                events += self._start("tool_use", {"type": "tool_use", "id": tool_use_id(call.id), "name": name or "",
                                                   "input": {}})
            arguments = call.function.arguments if call.function is not None else None
            if arguments:
                events.append(self._delta({"type": "input_json_delta", "partial_json": arguments}))
        return events

    def close(self) -> list[dict[str, object]]:
        if self.open is None:
            return []
        self.open = None
        return [{"type": "content_block_stop", "index": self.index}]

    def finish(self) -> list[dict[str, object]]:
        """Close the last block; a message that said nothing still has one (empty) text block."""
        events = self.close()
        if self.index < 0:
            events += self._start("text", {"type": "text", "text": ""}) + self.close()
        return events

    def _start(self, kind: str, block: dict[str, object]) -> list[dict[str, object]]:
        if self.open == kind and kind != "tool_use":
            return []
        events = self.close()
        self.index += 1
        self.open = kind
        return events + [{"type": "content_block_start", "index": self.index, "content_block": block}]

    def _delta(self, delta: dict[str, object]) -> dict[str, object]:
        return {"type": "content_block_delta", "index": self.index, "delta": delta}


async def message_events(rid: str, model: str, plan: ChatPlan, stream: AsyncIterator[Output],
                         stop_sequences: Sequence[str], capped: bool = False,
                         omit_thinking: bool = False) -> AsyncIterator[dict[str, object]]:
    choice = ChoiceStream(plan)
    blocks = BlockStream(omit_thinking)
    started = False
    async for out in stream:
        if out.error:
            raise APIError(500, out.error)
        if not started:
            started = True
            yield {"type": "message_start",
                   "message": message_object(rid, model, [], None, None, usage(out, plan, output_tokens=0))}
            yield {"type": "ping"}
        for delta in choice.feed(out.delta_text, final=out.finished):
            for event in blocks.feed(delta):
                yield event
        if out.finished:
            for event in blocks.finish():
                yield event
            reason, sequence = stop_reason(out, choice.finish_reason(out), stop_sequences, capped)
            yield {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                   "usage": usage(out, plan)}
            yield {"type": "message_stop"}


async def sse(events: AsyncIterator[dict[str, object]]) -> AsyncIterator[bytes]:
    """Anthropic's server-sent events: `event: <type>` and its JSON; a failure is one `error` event."""
    try:
        async for event in events:
            yield b"event: " + str(event["type"]).encode() + b"\ndata: " + msgspec.json.encode(event) + b"\n\n"
    except APIError as exc:
        yield b"event: error\ndata: " + msgspec.json.encode(error_body(exc.status, exc.message)) + b"\n\n"
